"""Task registry: `build_task(cfg.task, seed)` gives a TaskData with train / valid / test / test_long."""

from __future__ import annotations

from collections.abc import Callable

from harness.config import ConfigError, TaskConfig
from harness.tasks.base import SPLITS, Example, TaskData, Vocab
from harness.tasks.synthetic import copy_task, reverse_task

TASKS: dict[str, tuple[Callable[[TaskConfig, int], TaskData], str]] = {
    "copy": (
        copy_task,
        "output = input; options min_len, max_len, test_max_len, vocab_size, n_train/n_valid/n_test",
    ),
    "reverse": (reverse_task, "output = input reversed; same options as copy"),
}


def build_task(cfg: TaskConfig, seed: int) -> TaskData:
    if cfg.name not in TASKS:
        raise ConfigError(f"task.name: task {cfg.name!r} is not available; known: {', '.join(TASKS)}")
    data = TASKS[cfg.name][0](cfg, seed)
    if not data.splits["train"]:
        raise ConfigError(f"task.name: {cfg.name} produced no training examples")
    return data


__all__ = ["SPLITS", "TASKS", "Example", "TaskData", "Vocab", "build_task"]
