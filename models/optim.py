"""OptimConfig: the settings Seq2SeqModule reads (optimiser, lr schedule, loss, decoding, compilation), and
the lr schedules by name (SCHEDULES). schema/config.py's TrainConfig extends it with what only the Trainer
reads, so both are `train.*` keys."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ablate.models.config import MAX_MANY, Count, Many


def constant(step: int, warmup: int, max_steps: int) -> float:
    return min(1.0, (step + 1) / warmup) if warmup else 1.0


def inverse_sqrt(step: int, warmup: int, max_steps: int) -> float:
    # Vaswani et al. 2017: linear warmup, then decay with 1/sqrt(step); equals 1 at the end of warmup.
    step = step + 1
    w = max(warmup, 1)
    return min(step / w, math.sqrt(w / step))


def cosine(step: int, warmup: int, max_steps: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# The names train.schedule accepts: each is the multiplier on the base lr at a step (from 0), given the warmup
# steps (at least 0) and max_steps; Seq2SeqModule's LambdaLR reads it (models/module.py, lr_lambda).
SCHEDULES = {"constant": constant, "inverse_sqrt": inverse_sqrt, "cosine": cosine}


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no key takes NaN or inf

    lr: float = Field(1e-3, gt=0.0, le=1e6)  # 1e6: a run made to diverge (tests of divergence)
    weight_decay: float = Field(0.01, ge=0.0, le=10.0)
    schedule: Literal[tuple(SCHEDULES)] = "constant"  # type: ignore[valid-type]
    warmup_steps: int = Field(0, ge=0, le=MAX_MANY, strict=True)
    max_steps: Many = 1000  # the end of the cosine schedule, and the Trainer's step budget
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    beam_size: Count = 1  # test decoding; validation decodes greedily
    length_penalty: float = Field(0.6, ge=0.0, le=100.0)  # GNMT alpha for beam search; 0 ranks by raw log-probability
    # The training and validation steps compiled whole (models/steps.py); auto: where that was measured faster.
    compile: bool | Literal["auto"] = "auto"

    @classmethod
    def of(cls, settings: BaseModel | dict) -> OptimConfig:
        """The OptimConfig part of a config that extends it (TrainConfig), or of a checkpoint's plain dict."""
        values = settings.model_dump() if isinstance(settings, BaseModel) else settings
        return cls.model_validate({k: v for k, v in values.items() if k in cls.model_fields})
