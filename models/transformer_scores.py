"""The Transformer's attention scores by name: the names `model.score` accepts, how each is built from its
class in models/attention.py (ScaledDotProduct says what a score does), and what `model.scale` means for it.

Adding a score: its class and one entry in TRANSFORMER_SCORES. No torch here (config checks read it);
`build_score` loads the classes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ablate.models.config import ModelConfig


@dataclass(frozen=True)
class ScoreKind:
    # (models.attention, config) -> the score module of one attention layer
    build: Callable[[ModuleType, ModelConfig], nn.Module]
    # The words of `model.scale` it reads (a number always means something), and what the key means for it.
    scale_words: tuple[str, ...]
    scale_means: str
    reads_max_positions: bool = False  # model.max_positions sets something of it (so it is not ignored)
    # (score module, q (B, H, T, d_k), k (B, H, S, d_k), config) -> the (B, H, T, S) scores by the paper's
    # formula, which `ablate check` compares with the module in float64 (harness/conformance.py).
    reference: Callable[[nn.Module, Tensor, Tensor, ModelConfig], Tensor] | None = None


def qknorm_start(cfg: ModelConfig) -> float:
    """g's starting value: `model.scale` when a number, else Henry et al. 2020's g0 = log2(L² − L). The
    paper's L is the 97.5th percentile of the training lengths, which a model config cannot know; L here is
    the longest sequence the model is built for, `model.max_positions` (L² − L: the off-diagonal scores)."""
    if cfg.scale != "sqrt":
        return float(cfg.scale)
    length = max(cfg.max_positions, 2)  # one position has no off-diagonal pair: g0 = 1 as for two
    return math.log2(length * length - length)


TRANSFORMER_SCORES: dict[str, ScoreKind] = {
    # Vaswani et al. 2017: q·k times a fixed factor.
    "dot": ScoreKind(
        lambda a, cfg: a.ScaledDotProduct(cfg.scale_factor),
        scale_words=("sqrt", "none"),
        scale_means="the factor on q·k: sqrt 1/sqrt(d_k), none 1, or a number",
        reference=lambda score, q, k, cfg: cfg.scale_factor * q @ k.transpose(-2, -1),
    ),
    # Henry et al. 2020 (QKNorm): g · cos(q, k), g learned.
    "cosine": ScoreKind(
        lambda a, cfg: a.QKNorm(qknorm_start(cfg)),
        scale_words=("sqrt",),
        scale_means="the learned factor g's starting value: a number, or sqrt (the default) for "
        "Henry et al.'s log2(L² − L) with L = model.max_positions",
        reads_max_positions=True,
        reference=lambda score, q, k, cfg: score.g * unit(q) @ unit(k).transpose(-2, -1),
    ),
}


def unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def check_scale(cfg: ModelConfig) -> None:
    """`model.scale` means something for the chosen score; ValueError naming the key otherwise."""
    kind = TRANSFORMER_SCORES[cfg.score]
    if isinstance(cfg.scale, str) and cfg.scale not in kind.scale_words:
        raise ValueError(
            f"scale: {cfg.scale} has no meaning with score {cfg.score}, where it sets {kind.scale_means}"
        )


def build_score(cfg: ModelConfig) -> nn.Module:
    """A fresh score module named by `model.score`, for one attention layer (a learned score is per layer)."""
    from ablate.models import attention  # torch: kept out of config checks

    return TRANSFORMER_SCORES[cfg.score].build(attention, cfg)
