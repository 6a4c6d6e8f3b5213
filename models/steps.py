"""The step functions every loop runs, eager or compiled whole (`train.compile`): a trial's training loss, a
fused group's per-seed losses, and a validation batch's loss sums.

Compiled, each is one graph (`fullgraph=True`: a graph break is an error, not a silent fallback), backward
included; on CUDA it runs captured as CUDA graphs (`reduce-overhead`), where an eager step waits on Python
between a few hundred small kernels. Lengths are padded to a multiple of LENGTH_MULTIPLE
(harness/tasks/datamodule.py) so a run compiles for a bounded set of shapes; dynamo makes a length that
changes once symbolic from then on. What stays eager, and why: EAGER_PARTS.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ablate.models.config import ModelConfig
from ablate.models.kinds import FAMILIES
from ablate.models.sequences import PAD_ID

LENGTH_MULTIPLE = 8  # a batch's lengths are padded up to a multiple of this when compiled

# What cannot compile whole, with the reason: the first two keep a model's steps eager; the last two run
# eager inside a compiled run.
EAGER_PARTS = {
    # the LSTM's: its encoder packs each batch by lengths read on the host (models/kinds.py Family.eager)
    **{f"model.arch: {name}": family.eager for name, family in FAMILIES.items() if family.eager},
    "model.dropout > 0": "each seed draws its masks from its own generator over its own lengths, read on the "
    "host, so that a seed's masks are the same fused or alone",
    "decoding (greedy and beam search)": "each step grows the key/value cache by one position and the loop "
    "stops once every sequence has ended, a check on the host",
    "the test pass's teacher-forced forward": "it records attention weights and layer outputs through "
    "forward hooks (record_states), once per trial",
}

# On a CPU the compiled step was no faster (BENCHMARKS.md, figure j: 16.5 ms eager against 21.5 ms compiled
# at the quickstart's size, 909 against 883 ms at a GPU profile's, after 33 and 45 s of compiling), so auto
# compiles only on CUDA, where the eager step is bound by kernel launches.
AUTO_COMPILES_ON = ("cuda",)


def why_eager(cfg: ModelConfig) -> str | None:
    """Why this model's training step cannot compile whole, or None."""
    family = FAMILIES[cfg.arch]
    if family.eager and family.eager_when(cfg):
        return EAGER_PARTS[f"model.arch: {cfg.arch}"]
    if cfg.dropout > 0:
        return EAGER_PARTS["model.dropout > 0"]
    return None


def compiles(setting: bool | str, cfg: ModelConfig, device: str) -> bool:
    """train.compile resolved for a model on a device type: true compiles every model that compiles whole
    (why_eager); auto does so only on AUTO_COMPILES_ON devices; false never."""
    wanted = setting is True or (setting == "auto" and device in AUTO_COMPILES_ON)
    return wanted and why_eager(cfg) is None


def padded_length(length: int, cap: int) -> int:
    """A length rounded up to a multiple of LENGTH_MULTIPLE, never past `cap` (the longest of the split, which
    learned positions were checked against)."""
    return min(-(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, max(cap, length))


def padded_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch with each side's length rounded up as a compiled step's are (padded_length, uncapped): a
    synthetic batch at the lengths harness/tasks/datamodule.py's collate would give it."""
    return {
        name: F.pad(t, (0, padded_length(t.size(1), sys.maxsize) - t.size(1)), value=PAD_ID)
        for name, t in batch.items()
    }


def token_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """logits (B, T, V), target (B, T) -> cross entropy over the non-padding positions, in float32 under
    autocast. With smoothing eps the target is (1 - eps) on the gold token plus eps / V on every token, so
    the loss is (1 - eps) * NLL + eps * mean_v(-log p_v)."""
    return F.cross_entropy(
        logits.float().flatten(0, 1), target.flatten(),
        ignore_index=PAD_ID, label_smoothing=label_smoothing, reduction=reduction,
    )  # fmt: skip


def per_seed_loss(
    logits: torch.Tensor, target: torch.Tensor, seeds: int, label_smoothing: float = 0.0
) -> torch.Tensor:
    """A fused model's logits (K·B, T, V), target (K·B, T) -> (K,): each seed's mean token_cross_entropy.
    Train on their sum: a mean over seeds would divide each seed's gradient by K."""
    tokens = token_cross_entropy(logits, target, label_smoothing, reduction="none").view(seeds, -1)
    return tokens.sum(1) / (target != PAD_ID).view(seeds, -1).sum(1)


def penalised(model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The training forward: logits (B, T, V) and each example's penalty (B,) that its family adds to the
    loss (models/kinds.py Family.penalised; a captioner's doubly stochastic regularisation), or None."""
    if FAMILIES[model.cfg.arch].penalised:
        return model.penalised(src, tgt_in)
    return model(src, tgt_in), None


def training_loss(
    model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """A trial's training loss: the mean label-smoothed cross entropy over the non-padding target tokens,
    plus the examples' penalties (if any) over the same count of tokens, so that a penalty stands to the loss
    of a whole example as it does in its paper's per-example objective."""
    logits, penalty = penalised(model, src, tgt_in)
    loss = token_cross_entropy(logits, tgt_out, label_smoothing)
    return loss if penalty is None else loss + penalty.sum() / (tgt_out != PAD_ID).sum()


def seed_losses(
    model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, label_smoothing: float,
    seeds: int, training: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A fused group's step -> (the sum of the training seeds' losses, each seed's loss (K,)). training (K,)
    bool: a stopped seed's loss may be NaN, so it is selected out, not multiplied by 0."""
    logits, penalty = penalised(model, src, tgt_in)
    losses = per_seed_loss(logits, tgt_out, seeds, label_smoothing)
    if penalty is not None:
        losses = losses + penalty.view(seeds, -1).sum(1) / (tgt_out != PAD_ID).view(seeds, -1).sum(1)
    return torch.where(training, losses, torch.zeros_like(losses)).sum(), losses


def loss_sums(
    model: nn.Module, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """A validation batch's summed_losses."""
    return summed_losses(model(src, tgt_in), tgt_out, label_smoothing)


def summed_losses(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """(smoothed loss, NLL) summed over the non-padding target tokens, (2,) float64."""
    loss = token_cross_entropy(logits, target, label_smoothing, reduction="sum")
    nll = token_cross_entropy(logits, target, reduction="sum")
    return torch.stack([loss, nll]).double()


BACKEND: str | Callable = "inductor"  # tests set another dynamo backend: one that counts, or traces alone


def compiled(fn: Callable, device: str) -> Callable:
    """fn compiled whole, captured as CUDA graphs on CUDA."""
    mode = "reduce-overhead" if device == "cuda" and BACKEND == "inductor" else None
    return torch.compile(fn, fullgraph=True, mode=mode, backend=BACKEND)


# Dynamo keeps graphs per code object and a fullgraph compile fails at its recompile limit (8), which a worker
# running many variants would reach: so each model configuration compiles its own copy of each step.
_COMPILED: dict[tuple[str, ModelConfig, str], Callable] = {}


def own_copy(fn: Callable) -> Callable:
    """fn with a code object of its own, so dynamo's cache for it starts empty."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class Steps:
    """A model's step functions, eager or compiled (`compiles`) on the device the batch is on."""

    def __init__(self, setting: bool | str, cfg: ModelConfig):
        self.setting, self.cfg = setting, cfg
        self._resolved: dict[tuple[str, str], Callable] = {}  # (step, device type) -> what runs, every step

    def compiling(self, device: torch.device) -> bool:
        return compiles(self.setting, self.cfg, device.type)

    def resolve(self, fn: Callable, device: torch.device) -> Callable:
        """fn itself, or its compiled copy for this configuration and device type."""
        if not self.compiling(device):
            return fn
        key = (fn.__name__, self.cfg, device.type)
        if key not in _COMPILED:
            _COMPILED[key] = compiled(own_copy(fn), device.type)
        return _COMPILED[key]

    def run(
        self, fn: Callable, model: nn.Module, batch: dict[str, torch.Tensor], *args
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """fn(model, src, tgt_in, tgt_out, *args), compiled or not. Captured as CUDA graphs, its outputs live
        in memory the next replay reuses: each call is marked a new step and what it returns is copied
        (clone keeps the autograd graph), so a logged loss outlives the step."""
        device = batch["src"].device
        step = self._resolved.get((fn.__name__, device.type))
        if step is None:
            step = self._resolved[fn.__name__, device.type] = self.resolve(fn, device)
        captured = step is not fn and device.type == "cuda"
        if captured:
            torch.compiler.cudagraph_mark_step_begin()
        out = step(model, batch["src"], batch["tgt_in"], batch["tgt_out"], *args)
        if not captured:
            return out
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
