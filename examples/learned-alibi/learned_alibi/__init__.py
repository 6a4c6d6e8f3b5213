"""ALiBi (Press et al. 2022) with its slopes learned: a bias -softplus(w_h)·|i - j| per head, the w_h
started at ALiBi's geometric slopes (so the model starts as ALiBi and may move away), or all at one slope.
Close to KERPLE's power kernel at p = 1 (Chi et al. 2022), which learns the slope too. And a task of its
own, rotate (tasks.py): the input rotated left by task.plugin.rotate.shift symbols.

The entry and its settings import no torch, as the built-in registries do: the layer (layer.py) is imported
when a model is built."""

from __future__ import annotations

import importlib
from typing import Literal

from pydantic import Field

from ablate.models.plugins import Settings, settings
from ablate.models.positional import PositionalKind
from ablate.schema.tasks import Task


class LearnedALiBiSettings(Settings):
    """model.plugin.learned-alibi.start: where the slopes start."""

    start: Literal["alibi", "equal"] = "alibi"  # ALiBi's 2^(-8h/H), or every head at 2^-4


def load_layer():
    return importlib.import_module("learned_alibi.layer")


def build(layers, cfg, bidirectional: bool):
    return load_layer().LearnedALiBi(cfg.heads, settings(cfg, "learned-alibi").start)


LEARNED_ALIBI = PositionalKind(
    score_bias=build,
    reference=lambda part, cfg, q_len, k_len: load_layer().reference(part, cfg, q_len, k_len),
)


class RotateSettings(Settings):
    """task.plugin.rotate.shift: how far the input is rotated."""

    shift: int = Field(1, ge=1, le=64, strict=True)


ROTATE = Task("learned_alibi.tasks:build", "output = input rotated left by task.plugin.rotate.shift symbols",
              ("min_len", "max_len", "test_max_len", "vocab_size", "n_train", "n_valid", "n_test"),
              aligned=True)  # fmt: skip
