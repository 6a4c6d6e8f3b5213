"""Positional kinds: the names `model.pos_encoding` accepts, and what each does to a Transformer.

A kind has up to three parts, built from models/positional_layers.py:
- `embedding`: adds absolute positions to both sides' token embeddings, (x (B, L, D), offset) -> x + P;
- `rotary`: rotates self-attention's queries and keys by position (RoPE);
- `score_bias`: (q_len, k_len) -> (H, q_len, k_len), added to self-attention's scores (ALiBi, T5), one per
  stack, told whether that stack sees later positions.
Cross-attention gets no rotary or bias: they relate positions inside one sequence.

Kinds with different parts combine with '+', e.g. `alibi+sinusoidal` (as x-transformers keeps an absolute
embedding beside ALiBi): ALiBi's encoder bias -m|i - j| is the same for a sequence and its reverse, so alone
it is blind to mirror images. Adding a kind: an entry in POSITIONAL and its layer. No torch here (config
checks read it); `build_positions` loads the layers.
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

# (layers module, config) -> one part; a score bias also takes whether its stack sees later positions.
Part = Callable[[ModuleType, "ModelConfig"], "nn.Module"]
BiasPart = Callable[[ModuleType, "ModelConfig", bool], "nn.Module"]
PARTS = ("embedding", "rotary", "score_bias")


@dataclass(frozen=True)
class PositionalKind:
    """What one value of `model.pos_encoding` does to a Transformer (see the module docstring)."""

    embedding: Part | None = None
    rotary: Part | None = None
    score_bias: BiasPart | None = None
    bounded: bool = False
    based: bool = False  # reads model.pos_base (the wavelengths' base)
    learned: bool = False  # a trained table added to the embeddings: reads model.pos_init
    bucketed: bool = False  # a bias per bucket of distance: reads model.t5_buckets and t5_max_distance
    # For a kind of one part: (its module, config, then the part's own inputs) -> its output by the paper's
    # formula, which `ablate check` compares with the module in float64 (harness/conformance.py).
    reference: Callable[..., Tensor] | None = None

    def max_length(self, max_positions: int) -> int | None:
        """The most positions one sequence may have; None when any length works."""
        return max_positions if self.bounded else None

    def parts(self) -> set[str]:
        return {part for part in PARTS if getattr(self, part) is not None}


POSITIONAL: dict[str, PositionalKind] = {
    # Attention alone is permutation-equivariant: without positions order is invisible (Haviv et al. 2022).
    "none": PositionalKind(),
    # Vaswani et al. 2017: a fixed sinusoid per position, any length.
    "sinusoidal": PositionalKind(
        embedding=lambda layers, cfg: layers.SinusoidalEncoding(cfg.d_model, cfg.max_positions, cfg.pos_base),
        based=True,
        reference=lambda part, cfg, x, offset=0: x + x.new_tensor(sinusoids(cfg, range(offset, offset + x.size(1)))),
    ),
    # One trained vector per position: nothing past model.max_positions.
    "learned": PositionalKind(
        embedding=lambda layers, cfg: layers.LearnedEncoding(cfg.d_model, cfg.max_positions),
        bounded=True,
        learned=True,
    ),
    # Su et al. 2021: q_m·k_n depends on m - n only.
    "rope": PositionalKind(
        rotary=lambda layers, cfg: layers.Rotary(cfg.d_k, cfg.pos_base), based=True
    ),
    # Press et al. 2022: a per-head linear distance penalty on the scores, no embedding.
    "alibi": PositionalKind(score_bias=lambda layers, cfg, bidirectional: layers.ALiBi(cfg.heads)),
    # Raffel et al. 2020 (T5): a learned bias per head and bucket of relative distance, one per stack.
    "t5": PositionalKind(
        score_bias=lambda layers, cfg, bidirectional: layers.T5Bias(
            cfg.heads, cfg.d_model, bidirectional, cfg.t5_buckets, cfg.t5_max_distance
        ),
        bucketed=True,
    ),
}


def sinusoids(cfg: ModelConfig, positions: range) -> list[list[float]]:
    """Vaswani et al.'s Sec. 3.5: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d))."""
    d = cfg.d_model
    return [[(math.sin if c % 2 == 0 else math.cos)(p / cfg.pos_base ** ((c - c % 2) / d)) for c in range(d)]
            for p in positions]  # fmt: skip


def positional_kind(name: str) -> PositionalKind:
    """The kind `name` names: one kind, or kinds with different parts joined by '+'; ValueError otherwise."""
    names = name.split("+")
    unknown = [n for n in names if n not in POSITIONAL]
    if unknown:
        raise ValueError(
            f"unknown kind {unknown[0]!r}; known: {', '.join(POSITIONAL)}; kinds that add different parts "
            "join with '+' (e.g. alibi+sinusoidal)"
        )
    kinds = [POSITIONAL[n] for n in names]
    parts = [kind.parts() for kind in kinds]
    if len(kinds) > 1 and (not all(parts) or len(set().union(*parts)) < sum(map(len, parts))):
        raise ValueError(
            f"{name!r}: join kinds that each add a different part ({', '.join(PARTS)}), e.g. alibi+sinusoidal"
        )
    merged = {part: next((getattr(k, part) for k in kinds if getattr(k, part)), None) for part in PARTS}
    flags = {flag: any(getattr(k, flag) for k in kinds) for flag in ("bounded", "based", "learned", "bucketed")}
    return PositionalKind(**merged, **flags)


def check_fits(cfg: ModelConfig) -> None:
    """What the kind needs of the rest of the config; ValueError naming the key otherwise."""
    if positional_kind(cfg.pos_encoding).rotary is not None and cfg.d_k % 2:
        raise ValueError(
            f"pos_encoding: {cfg.pos_encoding} rotates pairs of features and needs an even query and key "
            f"width per head (d_k={cfg.d_k})"
        )


def build_positions(cfg: ModelConfig, bidirectional: dict[str, bool]) -> nn.Module:
    """The Transformer's positional parts as one module (models/positional_layers.Positions); bidirectional:
    each stack's side ('src', 'tgt') -> whether its self-attention sees later positions."""
    from ablate.models import positional_layers as layers  # torch: kept out of config checks

    kind = positional_kind(cfg.pos_encoding)
    embedding, rotary = (make(layers, cfg) if make else None for make in (kind.embedding, kind.rotary))
    score_bias = None
    if kind.score_bias is not None:
        score_bias = {side: kind.score_bias(layers, cfg, both) for side, both in bidirectional.items()}
    return layers.Positions(embedding, rotary, score_bias)
