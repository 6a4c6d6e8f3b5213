"""What a model can place against the lengths its task gives, checked before training (a trial) and before
a study queues anything (harness/study/validate.py): learned positions and location attention stop at
model.max_positions; the T5 bias reads buckets of distance that training must have reached; a claim does
not judge a table of positions where training never reached (`untrained_positions`)."""

from __future__ import annotations

import math

from ablate.harness.tasks.base import TaskData
from ablate.models.config import ModelConfig
from ablate.models.decoding import generation_budget
from ablate.models.kinds import FAMILIES
from ablate.models.positional import positional_kind
from ablate.schema.config import ExperimentConfig
from ablate.schema.task_config import TaskConfig
from ablate.schema.tasks import TASKS, WINDOW_SPLITS


def bucketed(model: ModelConfig) -> bool:
    """Whether the model reads T5's buckets of distance."""
    return "pos_encoding" in model.read_keys() and positional_kind(model.pos_encoding).bucketed


def reads_lengths(model: ModelConfig) -> bool:
    """Whether a task's lengths can refuse the model: it places a bounded number of positions, or reads
    buckets that training must reach."""
    return model.position_limits != (None, None) or bucketed(model)


def position_problem(cfg: ExperimentConfig, data: TaskData) -> tuple[str, str] | None:
    """(key, message) of the first length the model cannot place or never trained on, or None."""
    return max_positions_problem(cfg, data) or t5_problem(cfg, data)


def max_positions_problem(cfg: ExperimentConfig, data: TaskData) -> tuple[str, str] | None:
    source_limit, target_limit = cfg.model.position_limits
    longest_source = 1 + max(len(ex.src) for examples in data.splits.values() for ex in examples)  # + EOS
    decoded = generation_budget(longest_source, data.train_max_len)
    decoding = f"decoding may run to {decoded} positions (sources of up to {longest_source} tokens)"
    checks = [
        (target_limit, decoded, decoding),
        (source_limit, longest_source, f"sources reach {longest_source} tokens"),
    ]
    for limit, needed, reach in checks:
        if limit is not None and needed > limit:
            return "model.max_positions", (
                f"{limit} is too short for {cfg.task.name}: {reach}; set it to at least {needed}"
            )
    return None


def t5_problem(cfg: ExperimentConfig, data: TaskData) -> tuple[str, str] | None:
    """Test distances in T5 buckets that no training distance reaches: their bias never trained, which is
    not T5's setting nor Press et al.'s (there every distance past the last bucket's start trains it)."""
    model = cfg.model
    if not bucketed(model):
        return None
    from ablate.models.positional_layers import t5_untrained  # torch

    def longest(side: str, splits) -> int:  # + EOS or BOS
        return 1 + max((len(getattr(ex, side)) for split in splits for ex in data.splits[split]), default=0)

    tested = [split for split in data.splits if split != "train"]
    classifies = FAMILIES[model.arch].classifies  # an encoder stack alone
    stacks = [("sources", "src", True)] if model.cross_attention or classifies else []
    if model.decoder_self_attention and not classifies:
        stacks.append(("targets", "tgt", not model.causal_mask))
    for what, side, bidirectional in stacks:
        trained, reach = longest(side, ["train"]), longest(side, tested)
        untrained = t5_untrained(trained, reach, bidirectional, model.t5_buckets, model.t5_max_distance)
        if untrained:
            return "model.t5_max_distance", (
                f"{model.t5_max_distance} leaves T5 buckets {spans(untrained)} untrained: {what} of "
                f"up to {reach} positions are tested, training reaches {trained}; set model.t5_max_distance to "
                f"at most {trained} and model.t5_buckets to at most {trained}, so that every longer distance "
                "falls in a trained last bucket"
            )
    return None


def spans(numbers: list[int]) -> str:
    """[7, 8, 23, 24] -> '7-8, 23-24'."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def beyond_training(task: TaskConfig, split: str) -> bool:
    """Whether a test split may hold positions past every training example's: test_long where training
    stops at a length (a generated task's max_len, a corpus task's max_tokens), test where a corpus task's
    long_after lets it pass max_tokens or SCAN's length split tests longer action sequences, a window
    longer than the training windows."""
    if split in WINDOW_SPLITS:
        return WINDOW_SPLITS[split] > task.train_factor
    generated = "test_max_len" in TASKS[task.name].reads
    if split == "test_long":
        return generated or task.max_tokens is not None
    if split == "test" and task.name == "scan":
        return task.split == "length"
    return split == "test" and not generated and (task.long_cut or 0) > (task.max_tokens or math.inf)


def untrained_positions(cfg: ExperimentConfig, metric: str) -> bool:
    """Whether `metric` (split/name) of a trial of `cfg` reads rows of a table of positions (learned
    positions, location attention: `ModelConfig.position_limits`) that no training example reached, still
    as initialised: a claim on it would judge the initialisation, not the kind."""
    tabled = cfg.model.position_limits != (None, None)
    return tabled and beyond_training(cfg.task, metric.split("/")[0])
