"""Attention model families: plain torch.nn building blocks and one LightningModule."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ablate.models.config import PRESETS, ModelConfig
from ablate.models.kinds import FAMILIES

if TYPE_CHECKING:  # torch loads in seconds; config checks (and the CLI's errors) need no torch
    from torch import nn


def build_model(
    cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0, ensemble: int = 1
) -> nn.Module:
    """The nn.Module for `cfg.arch`; every family shares forward / record_states / init_state / step (kinds.Family).
    ensemble: K seeds fused into one model (models/ensemble.py); 1, a plain model."""
    module, name = FAMILIES[cfg.arch].model.split(":")
    family = getattr(importlib.import_module(module), name)
    return family(cfg, src_vocab, tgt_vocab, pad_id, ensemble)


__all__ = ["PRESETS", "ModelConfig", "build_model"]
