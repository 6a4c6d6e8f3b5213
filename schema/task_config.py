"""task.*: what a task builder reads; accepted names and each task's keys are tasks.py's. The name is
checked one level up, in ExperimentConfig, so that a bad name is reported only once the rest is valid."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ablate.models.config import Count, Many
from ablate.models.plugins import join as join_plugins
from ablate.models.plugins import join_settings, settings_model
from ablate.schema.tasks import SCAN_SPLITS, TASKS, TOKENIZER_KEYS, TOKENIZERS, Task, tasks_reading

# Tasks of installed packages join the registry (models/plugins.py), their builders named 'package.module:fn',
# before TaskConfig takes their settings (task.plugin.<name>.<key>).
join_plugins("task", TASKS, Task)
join_settings({"task": TASKS})
PluginSettings = settings_model("task")

# Each key that names one entry of a registry -> that registry: the names it accepts are the registry's keys.
REGISTRIES: dict[str, Mapping[str, object]] = {"split": SCAN_SPLITS, "tokenizer": TOKENIZERS}


class TaskConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no key takes NaN or inf

    name: str = Field("reverse", description="a name in the tasks table above")  # checked by ExperimentConfig
    min_len: Count = 1
    max_len: Count = 10
    test_max_len: Count | None = None  # default: 2 * max_len
    vocab_size: Count = 10
    n_train: Many = 5000
    n_valid: Many = 500
    n_test: Many = 1000
    split: str = Field("simple", description=" | ".join(SCAN_SPLITS))
    path: str | None = None
    tokenizer: str = Field("word", description=" | ".join(TOKENIZERS))
    bpe_vocab_size: Count = 1000
    # parallel corpora: which side is which (Moses file suffix, JSONL / HF field or translation key)
    src_lang: str | None = None
    tgt_lang: str | None = None
    hf_config: str | None = None  # configuration of a Hugging Face hub dataset, e.g. en-fr
    min_tokens: Count = 1  # pairs with a shorter side are dropped
    # longer train / valid pairs are dropped; longer test pairs form test_long
    max_tokens: Count | None = None
    # where test_long starts instead (test pairs of more tokens), so that variants trained on different
    # max_tokens are tested on the same pairs
    long_after: Count | None = None
    max_examples: Many | None = None  # cap on training pairs (a seeded sample)
    # bible_lm: train and validate on windows of train_factor x max_tokens, test on 1, 2 and 4 x max_tokens
    # still (Press et al.'s baseline trained on 2L, judged at 2L beside a model trained on L)
    train_factor: Annotated[int, Field(ge=1, le=4, strict=True)] = 1
    plugin: PluginSettings = PluginSettings()  # type: ignore[valid-type]

    @field_validator(*REGISTRIES)
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        registry = REGISTRIES[info.field_name]
        if name not in registry:
            raise ValueError(f"unknown {info.field_name} {name!r}; known: {', '.join(registry)}")
        return name

    @model_validator(mode="after")
    def _lengths(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len: must not exceed max_len={self.max_len} (got {self.min_len})")
        if self.test_max_len is not None and self.test_max_len < self.max_len:
            raise ValueError(
                f"test_max_len: must be at least max_len={self.max_len} (got {self.test_max_len})"
            )
        for key in ("max_tokens", "long_after"):
            if getattr(self, key) is not None and self.min_tokens > getattr(self, key):
                raise ValueError(
                    f"min_tokens: must not exceed {key}={getattr(self, key)} (got {self.min_tokens})"
                )
        for key in TASKS[self.name].needs if self.name in TASKS else ():
            if getattr(self, key) is None:
                raise ValueError(f"{key}: must be set for task {self.name}")
        # The sides go together where a task reads both (bible_lm reads src_lang alone; its tgt_lang is ignored).
        pairs = self.name not in TASKS or "tgt_lang" in TASKS[self.name].reads
        if pairs and (self.src_lang is None) != (self.tgt_lang is None):
            raise ValueError(
                f"{'tgt_lang' if self.tgt_lang is None else 'src_lang'}: give src_lang and tgt_lang together"
            )
        return self

    @property
    def long_max_len(self) -> int:
        return self.test_max_len if self.test_max_len is not None else 2 * self.max_len

    @property
    def long_cut(self) -> int | None:
        """The length beyond which test examples form test_long, or None where the task makes none: a
        generated task's max_len (when test_max_len goes beyond it), a corpus task's long_after, else its
        max_tokens."""
        task = TASKS[self.name]
        if "test_long" not in task.test_splits:
            return None
        if "test_max_len" in task.reads:
            return self.max_len if self.long_max_len > self.max_len else None
        return self.long_after if self.long_after is not None else self.max_tokens

    @property
    def test_splits(self) -> list[str]:
        """The test splits this configuration's task fills, in TEST_SPLITS order."""
        return [s for s in TASKS[self.name].test_splits if s != "test_long" or self.long_cut is not None]


def ignored_task_keys(cfg: TaskConfig) -> dict[str, str]:
    """Key -> why the task cfg configures ignores it: a key only other tasks read, or one only another
    tokenizer reads. Changing such a key changes none of the task's data."""
    task = TASKS[cfg.name]
    ignored: dict[str, str] = {}
    for name, block in cfg.plugin:
        if name != cfg.name:
            ignored |= {f"plugin.{name}.{key}": f"a setting of task {name}; task.name is {cfg.name}"
                        for key in type(block).model_fields}  # fmt: skip
    for key in (key for key in TaskConfig.model_fields if key != "plugin"):
        if key not in ("name", *task.keys()):
            readers = tasks_reading(key)
            tasks = f"task {readers[0]}" if len(readers) == 1 else f"tasks {', '.join(readers)}"
            ignored[key] = f"a setting of {tasks}; task.name is {cfg.name}"
        elif key in TOKENIZER_KEYS and cfg.tokenizer not in TOKENIZER_KEYS[key]:
            tokenizers = " or ".join(TOKENIZER_KEYS[key])
            ignored[key] = f"acts only with tokenizer {tokenizers}; task.tokenizer is {cfg.tokenizer}"
    return ignored
