"""`ablate check`: the conformance checks a model configuration's parts pass, built-in or plugged
(models/plugins.py). The model a config builds, small, is run through what every entry of a registry must
honour: shapes, padding (a padded position changes nothing real), the causal mask (a later target token
changes no earlier output), finite gradients, determinism under a seed, and K fused seeds equal to each
alone (models/ensemble.py). Each check says pass or its first difference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.ensemble import fuse_models

VOCAB, PAD, B, S, T = 12, 0, 3, 7, 6  # a small batch: rows, source and target lengths
TOL = 1e-5


@dataclass
class Outcome:
    check: str
    passed: bool
    detail: str = ""


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources and targets of real tokens, the first source row and the second target row padded."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, VOCAB, (B, S), generator=g), torch.randint(3, VOCAB, (B, T), generator=g)
    src[0, S - 3 :] = PAD
    tgt[1, T - 2 :] = PAD
    return src, tgt


def model(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB, VOCAB, PAD).eval()


def first_difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """'' when equal to TOL, else where they first differ and by how much."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    gap = (actual - expected).abs()
    if not bool((gap <= TOL + TOL * expected.abs()).all()):
        where = tuple(int(i) for i in (gap == gap.max()).nonzero()[0])
        return f"at {where}: {float(actual[where]):.6g} against {float(expected[where]):.6g}"
    return ""


def shapes(cfg: ModelConfig) -> str:
    src, tgt = batch()
    logits = model(cfg)(src, tgt)
    if logits.shape != (B, T, VOCAB):
        return f"logits {tuple(logits.shape)}, expected {(B, T, VOCAB)}"
    return "" if bool(torch.isfinite(logits).all()) else "logits not finite"


def padding(cfg: ModelConfig) -> str:
    """A row scored alone, at its own length, equals its padded self in a batch: padded positions change
    nothing real (a score or positional part that reads them fails)."""
    net, (src, tgt) = model(cfg), batch()
    together = net(src, tgt)
    src_len, tgt_len = int((src[0] != PAD).sum()), int((tgt[1] != PAD).sum())
    for row, (s, t) in ((0, (src[:1, :src_len], tgt[:1])), (1, (src[1:2], tgt[1:2, :tgt_len]))):
        alone = net(s, t)
        found = first_difference(together[row : row + 1, : t.size(1)], alone)
        if found:
            return f"row {row} alone differs from its padded self in the batch {found}"
    return ""


def causal(cfg: ModelConfig) -> str:
    """With the causal mask, changing target tokens from position 3 on changes no output before 3."""
    if not cfg.causal_mask:
        return ""
    net, (src, tgt) = model(cfg), batch()
    changed = tgt.clone()
    changed[:, 3:] = (tgt[:, 3:] - 2) % (VOCAB - 3) + 3  # another real token at every later position
    found = first_difference(net(src, changed)[:, :3], net(src, tgt)[:, :3])
    return f"an output before position 3 reads a later target token: {found}" if found else ""


def gradients(cfg: ModelConfig) -> str:
    net, (src, tgt) = model(cfg).train(), batch()
    net(src, tgt).logsumexp(-1).mean().backward()
    bad = [name for name, p in net.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    return f"gradients not finite: {', '.join(bad[:3])}" if bad else ""


def deterministic(cfg: ModelConfig) -> str:
    src, tgt = batch()
    found = first_difference(model(cfg)(src, tgt), model(cfg)(src, tgt))
    return f"two models built under one seed differ {found}" if found else ""


def fused(cfg: ModelConfig) -> str:
    """Two seeds fused into one model give each seed's own outputs (rows seed-major)."""
    alone = [model(cfg, seed) for seed in (0, 1)]
    together = fuse_models(alone).eval()
    src, tgt = batch()
    both = together(torch.cat([src, src]), torch.cat([tgt, tgt]))
    for k, net in enumerate(alone):
        found = first_difference(both[k * B : (k + 1) * B], net(src, tgt))
        if found:
            return f"seed {k} fused differs from itself alone {found}"
    return ""


CHECKS: dict[str, Callable[[ModelConfig], str]] = {
    "shapes": shapes, "padding": padding, "causal mask": causal, "gradients": gradients,
    "deterministic": deterministic, "fused": fused,
}  # fmt: skip


def check(cfg: ModelConfig) -> Iterator[Outcome]:
    """Each check's outcome for the model `cfg` builds (dropout off: the checks compare outputs)."""
    cfg = cfg.model_copy(update={"dropout": 0.0})
    for name, run in CHECKS.items():
        try:
            found = run(cfg)
        except Exception as e:  # the entry's own fault: named, and the next check runs
            found = f"raised {type(e).__name__}: {e}"
        yield Outcome(name, not found, found)
