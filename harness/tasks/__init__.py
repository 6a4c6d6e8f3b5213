"""The tasks' data: `build_task(cfg.task, seed)` gives a TaskData with train / valid / test / test_long.

schema/tasks.py's TASKS lists the tasks, the task.* keys each reads and its builder as 'module:function' of
this folder, imported (with its libraries: tokenizers, pysword, datasets) only when its task is built,
never to read a config or a study."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ablate.harness.tasks.base import SPLITS, Example, TaskData, Vocab
from ablate.models.plugins import PACKAGES
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig
from ablate.schema.tasks import TASKS


def builder(name: str) -> Callable[[TaskConfig, int], TaskData]:
    """The builder of task `name`, its module imported: a module of this folder, or a plug-in's own."""
    module, _, function = TASKS[name].build.partition(":")
    plugged = ("task", name) in PACKAGES
    return getattr(importlib.import_module(module if plugged else f"{__name__}.{module}"), function)


def build_task(cfg: TaskConfig, seed: int) -> TaskData:
    """The task cfg.name names (ExperimentConfig accepts only TASKS' names)."""
    data = builder(cfg.name)(cfg, seed)
    if not data.splits["train"]:
        raise ConfigError(f"task.name: {cfg.name} produced no training examples")
    return data


__all__ = ["SPLITS", "Example", "TaskData", "Vocab", "build_task", "builder"]
