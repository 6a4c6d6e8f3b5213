"""`ablate check`: the conformance checks a model configuration's parts pass, built-in or plugged
(models/plugins.py). The model a config builds, small, is run through what every entry of a registry must
honour: shapes, padding (a padded position changes nothing real), the causal mask (a later target token
changes no earlier output), finite gradients, determinism under a seed, K fused seeds equal to each alone
(models/ensemble.py), and, where an entry gives its formula (`reference`), its module against it in float64.
Each check says pass or its first difference, on the device given (a GPU where there is one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ablate.models import attention, build_model, positional_layers
from ablate.models.config import ModelConfig
from ablate.models.ensemble import fuse_models
from ablate.models.kinds import FAMILIES
from ablate.models.positional import POSITIONAL
from ablate.models.transformer_scores import TRANSFORMER_SCORES

VOCAB, PAD, B, S, T = 12, 0, 3, 7, 6  # a small batch: rows, source and target lengths
TOL = 1e-5


class Skipped(str):
    """What a check returns where it does not apply to this model: why."""


@dataclass
class Outcome:
    check: str
    passed: bool
    detail: str = ""
    ran: bool = True  # False: the check does not apply (detail says why)

    def __str__(self) -> str:
        said = "pass" if self.passed else f"FAIL, {self.detail}"
        return f"{self.check}: {said if self.ran else 'not run, ' + self.detail}"


def batch(device: torch.device, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources and targets of real tokens, the first source row and the second target row padded."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, VOCAB, (B, S), generator=g), torch.randint(3, VOCAB, (B, T), generator=g)
    src[0, S - 3 :] = PAD
    tgt[1, T - 2 :] = PAD
    return src.to(device), tgt.to(device)


def model(cfg: ModelConfig, device: torch.device, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, VOCAB, VOCAB, PAD).to(device).eval()


def first_difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """'' when equal to TOL, else where they first differ and by how much."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    actual, expected = actual.detach(), expected.detach()
    gap = (actual - expected).abs()
    if not bool((gap <= TOL + TOL * expected.abs()).all()):
        where = tuple(int(i) for i in (gap == gap.max()).nonzero()[0])
        return f"at {where}: {float(actual[where]):.6g} against {float(expected[where]):.6g}"
    return ""


def shapes(cfg: ModelConfig, device: torch.device) -> str:
    src, tgt = batch(device)
    logits = model(cfg, device)(src, tgt)
    if logits.shape != (B, T, VOCAB):
        return f"logits {tuple(logits.shape)}, expected {(B, T, VOCAB)}"
    return "" if bool(torch.isfinite(logits).all()) else "logits not finite"


def padding(cfg: ModelConfig, device: torch.device) -> str:
    """A row scored alone, at its own length, equals its padded self in a batch: padded positions change
    nothing real (a score or positional part that reads them fails)."""
    net, (src, tgt) = model(cfg, device), batch(device)
    together = net(src, tgt)
    src_len, tgt_len = int((src[0] != PAD).sum()), int((tgt[1] != PAD).sum())
    for row, (s, t) in ((0, (src[:1, :src_len], tgt[:1])), (1, (src[1:2], tgt[1:2, :tgt_len]))):
        alone = net(s, t)
        found = first_difference(together[row : row + 1, : t.size(1)], alone)
        if found:
            return f"row {row} alone differs from its padded self in the batch {found}"
    return ""


def causal(cfg: ModelConfig, device: torch.device) -> str:
    """With the causal mask, changing target tokens from position 3 on changes no output before 3."""
    if not cfg.causal_mask:
        return Skipped("model.causal_mask is false")
    net, (src, tgt) = model(cfg, device), batch(device)
    changed = tgt.clone()
    changed[:, 3:] = (tgt[:, 3:] - 2) % (VOCAB - 3) + 3  # another real token at every later position
    found = first_difference(net(src, changed)[:, :3], net(src, tgt)[:, :3])
    return f"an output before position 3 reads a later target token: {found}" if found else ""


def gradients(cfg: ModelConfig, device: torch.device) -> str:
    net, (src, tgt) = model(cfg, device).train(), batch(device)
    net(src, tgt).logsumexp(-1).mean().backward()
    bad = [name for name, p in net.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    return f"gradients not finite: {', '.join(bad[:3])}" if bad else ""


def deterministic(cfg: ModelConfig, device: torch.device) -> str:
    src, tgt = batch(device)
    found = first_difference(model(cfg, device)(src, tgt), model(cfg, device)(src, tgt))
    return f"two models built under one seed differ {found}" if found else ""


def fused(cfg: ModelConfig, device: torch.device) -> str:
    """Two seeds fused into one model give each seed's own outputs (rows seed-major)."""
    if not FAMILIES[cfg.arch].fuses:
        return Skipped(f"model.arch={cfg.arch} does not fuse seeds (its Family says so)")
    alone = [model(cfg, device, seed) for seed in (0, 1)]
    together = fuse_models(alone).eval()
    src, tgt = batch(device)
    both = together(torch.cat([src, src]), torch.cat([tgt, tgt]))
    for k, net in enumerate(alone):
        found = first_difference(both[k * B : (k + 1) * B], net(src, tgt))
        if found:
            return f"seed {k} fused differs from itself alone {found}"
    return ""


def reference(cfg: ModelConfig, device: torch.device) -> str:
    """The score's and each positional part's module, in float64, against the formula its entry gives."""
    nothing = Skipped("no entry of this model gives its formula")
    reads = cfg.read_keys()  # a classifier's with its own encoder: an LSTM's reads no Transformer score
    g = torch.Generator().manual_seed(2)
    draw = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(device)  # noqa: E731
    compared = []
    if "score" in reads and (formula := TRANSFORMER_SCORES[cfg.score].reference) is not None:
        score = TRANSFORMER_SCORES[cfg.score].build(attention, cfg).to(device).double()
        q, k = draw(B, cfg.heads, T, cfg.d_k), draw(B, cfg.heads, S, cfg.d_k)
        actual = score.scale * score.query(q) @ score.key(k).transpose(-2, -1)
        compared.append((f"score {cfg.score}", actual, formula(score, q, k, cfg)))
    for name in cfg.pos_encoding.split("+") if "pos_encoding" in reads else ():
        kind = POSITIONAL[name]
        if kind.reference is None:
            continue
        if len(kind.parts()) != 1:
            parts = ", ".join(sorted(kind.parts()))
            return f"pos_encoding {name} gives a reference for its parts {parts}; a reference is for one part"
        (part,) = kind.parts()
        if part == "score_bias":
            module, inputs = kind.score_bias(positional_layers, cfg, True), (T, S)
        else:
            module = getattr(kind, part)(positional_layers, cfg)
            inputs = (draw(B, S, cfg.d_model),) if part == "embedding" else (draw(B, cfg.heads, S, cfg.d_k),)
        module = module.to(device).double()
        compared.append((f"pos_encoding {name}", module(*inputs), kind.reference(module, cfg, *inputs)))
    for what, actual, expected in compared:
        if found := first_difference(actual, expected):
            return f"{what} differs from its reference {found}"
    return "" if compared else nothing


CHECKS: dict[str, Callable[[ModelConfig, torch.device], str]] = {
    "shapes": shapes, "padding": padding, "causal mask": causal, "gradients": gradients,
    "deterministic": deterministic, "fused": fused, "reference": reference,
}  # fmt: skip


def check(cfg: ModelConfig, device: torch.device) -> Iterator[Outcome]:
    """Each check's outcome for the model `cfg` builds, on `device` (dropout off: the checks compare outputs)."""
    cfg = cfg.model_copy(update={"dropout": 0.0})
    for name, run in CHECKS.items():
        try:
            found = run(cfg, device)
        except Exception as e:  # the entry's own fault: named, and the next check runs
            found = f"raised {type(e).__name__}: {e}"
        skipped = isinstance(found, Skipped)
        yield Outcome(name, skipped or not found, found, ran=not skipped)
