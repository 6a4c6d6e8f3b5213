"""Task registry: `build_task(cfg.task, seed)` gives a TaskData with train / valid / test / test_long.

TASKS maps each task name to its Task: the builder, one line on what it is, and the task.* keys the builder
reads, each family's declared beside its builder. It is the one list of names `task.name` accepts, and the
one statement of which keys a task reads: `ablate list` shows it, and `ignored_task_keys` gives the others, so
that a key a task ignores is refused where it is set, as a model key the model ignores is."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ablate.harness.errors import ConfigError
from ablate.harness.tasks.base import SPLITS, Example, TaskData, Vocab
from ablate.harness.tasks.bible import BIBLE_KEYS, bible_task
from ablate.harness.tasks.corpora import PARALLEL_KEYS, parallel_task
from ablate.harness.tasks.options import TaskConfig
from ablate.harness.tasks.scan import SCAN_KEYS, scan_task
from ablate.harness.tasks.synth_mt import synth_mt_task
from ablate.harness.tasks.synthetic import (
    GENERATED_KEYS,
    SYMBOL_KEYS,
    addition_task,
    copy_task,
    recall_task,
    reverse_task,
    sort_task,
)
from ablate.harness.tasks.tokenizers import TOKENIZER_KEYS


class Task(NamedTuple):
    """A task family in the registry: how it is built, what it is, and which task.* keys it reads."""

    build: Callable[[TaskConfig, int], TaskData]
    about: str  # what the task is, in one line
    # The task.* keys `build` reads besides task.name; with task.tokenizer, also those its tokenizer reads.
    reads: tuple[str, ...]

    def keys(self) -> tuple[str, ...]:
        """Every task.* key the task reads under some configuration: its own and, with task.tokenizer, every
        tokenizer's."""
        return (*self.reads, *(TOKENIZER_KEYS if "tokenizer" in self.reads else ()))

    @property
    def doc(self) -> str:
        """The line `ablate list` shows: what the task is and the keys it reads."""
        keys = [key if key in self.reads else f"{key} (tokenizer {' | '.join(TOKENIZER_KEYS[key])})"
                for key in self.keys()]  # fmt: skip
        return f"{self.about}; reads {', '.join(keys)}"


TASKS: dict[str, Task] = {
    "copy": Task(copy_task, "output = input; symbols 0..vocab_size-1", SYMBOL_KEYS),
    "reverse": Task(reverse_task, "output = input reversed", SYMBOL_KEYS),
    "sort": Task(sort_task, "output = input sorted (stable)", SYMBOL_KEYS),
    "addition": Task(
        addition_task, "a + b -> digits of the sum, with carries; lengths in digits", GENERATED_KEYS
    ),
    "recall": Task(
        recall_task,
        "k1 v1 ... kn vn ? k -> value of k; lengths in pairs (at most 26), vocab_size values",
        SYMBOL_KEYS,
    ),
    "synth_mt": Task(
        synth_mt_task,
        "SVO -> SOV toy translation with gold alignments; lengths in source words (at least 5)",
        GENERATED_KEYS,
    ),
    "scan": Task(
        scan_task, "SCAN commands -> actions; path: a folder of the official files (optional)", SCAN_KEYS
    ),
    "parallel": Task(
        parallel_task,
        "sentence pairs; path: TSV | JSONL | Moses prefix | save_to_disk folder | hub name",
        PARALLEL_KEYS,
    ),
    "bible": Task(
        bible_task,
        "World English Bible -> Reina-Valera 1909 verses (apt-get install sword-text-web sword-text-sparv); "
        "src_lang/tgt_lang: en | es | a SWORD module; path: the SWORD library (default $SWORD_PATH, else "
        "/usr/share/sword)",
        BIBLE_KEYS,
    ),
}


def tasks_reading(key: str) -> list[str]:
    """The tasks that read task.`key` under some configuration, in registry order."""
    return [name for name, task in TASKS.items() if key in task.keys()]


# What a task's data carries beyond token pairs, known before any is built (the metrics a study may name
# depend on it): text scored with BLEU / chrF (TaskData.is_text), gold word alignments (Example.alignment).
TEXT_TASKS = frozenset({"synth_mt", "parallel", "bible"})
ALIGNED_TASKS = frozenset({"copy", "reverse", "sort", "recall", "synth_mt"})
# Tasks whose lengths come from task.min_len / max_len / test_max_len (test_long beyond max_len).
GENERATED_TASKS = frozenset(tasks_reading("test_max_len"))
# Corpus tasks: test pairs longer than task.max_tokens form test_long.
CORPUS_TASKS = frozenset(tasks_reading("max_tokens"))


def ignored_task_keys(cfg: TaskConfig) -> dict[str, str]:
    """Key -> why the task cfg configures ignores it: a key only other tasks read, or one only another
    tokenizer reads. Changing such a key changes none of the task's data."""
    task = TASKS[cfg.name]
    ignored = {}
    for key in TaskConfig.model_fields:
        if key not in ("name", *task.keys()):
            readers = tasks_reading(key)
            tasks = f"task {readers[0]}" if len(readers) == 1 else f"tasks {', '.join(readers)}"
            ignored[key] = f"a setting of {tasks}; task.name is {cfg.name}"
        elif key in TOKENIZER_KEYS and cfg.tokenizer not in TOKENIZER_KEYS[key]:
            tokenizers = " or ".join(TOKENIZER_KEYS[key])
            ignored[key] = f"acts only with tokenizer {tokenizers}; task.tokenizer is {cfg.tokenizer}"
    return ignored


def build_task(cfg: TaskConfig, seed: int) -> TaskData:
    """The task cfg.name names (TaskConfig accepts only TASKS' names)."""
    data = TASKS[cfg.name].build(cfg, seed)
    if not data.splits["train"]:
        raise ConfigError(f"task.name: {cfg.name} produced no training examples")
    return data


__all__ = [
    "ALIGNED_TASKS", "CORPUS_TASKS", "GENERATED_TASKS", "SPLITS", "TASKS", "TEXT_TASKS",
    "Example", "Task", "TaskData", "Vocab", "build_task", "ignored_task_keys",
]  # fmt: skip
