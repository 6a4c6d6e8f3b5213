"""What a step costs on a device, found on this machine's CPU: the ATen kernels a training step, a validation
batch or a decoding launches and their FLOPs, counted as torch dispatches them, and priced by a device's
constants, which are fitted to training steps measured on that device (`ANCHORS`). `ablate plan`
(harness/study/cost.py) sums them over a study; the device check (scripts/device_check.py) measures the
figures that will replace the anchors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ablate.harness.compat import returns_a_view
from ablate.harness.fused import stack_batches
from ablate.models import build_model
from ablate.models.config import PRESETS, ModelConfig
from ablate.models.ensemble import seed_dropout
from ablate.models.rnn import RNN
from ablate.models.sequences import BOS_ID, PAD_ID
from ablate.models.steps import loss_sums, seed_losses, training_loss

# What a trial pays on the device beyond its kernels, measured there once (BENCHMARKS.md, "GPU: measured once"):
HOST_S = 25.6e-3 - 15.8e-3  # a step in a trial against the same step in a plain loop, both eager: the loop's
COMPILE_S = 14.0  # one graph compiled and captured (`reduce-overhead`), the quickstart's training step
WORKER_S = 28.0  # a worker's start: imports (Lightning's 14 s) and CUDA's initialisation


# Counting ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What a piece of computation launches: ATen kernels (views and other aliases launch nothing) and FLOPs."""

    kernels: int = 0
    flops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.kernels + other.kernels, self.flops + other.flops)

    def __mul__(self, n: float) -> Work:
        return Work(round(self.kernels * n), self.flops * n)


class _Kernels(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not returns_a_view(func):
            self.kernels += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def as_cudnn_runs() -> Iterator[None]:
    """RNN layers run as CUDA runs them: cuDNN takes a packed layer whole, in as many kernels as an unpacked
    one, where a CPU steps it position by position (a 2-layer bidirectional LSTM over 40 positions: 5,349
    kernels against 18). So while counting, each RNN runs its batch unpacked: cuDNN's kernels, and its FLOPs
    but for the padding's."""
    forward = RNN.forward

    def unpacked(self, x, state=None, lengths=None, offset=0):
        return forward(self, x, state, None, offset)

    RNN.forward = unpacked
    try:
        yield
    finally:
        RNN.forward = forward


def counted(run: Callable[[], object]) -> Work:
    kernels, flops = _Kernels(), FlopCounterMode(display=False)
    with as_cudnn_runs(), flops, kernels:
        run()
    return Work(kernels.kernels, float(flops.get_total_flops()))


ROWS = 2  # rows of a batch a count runs on (on_rows)


def on_rows(count: Callable[[dict[str, torch.Tensor]], Work], batch: dict[str, torch.Tensor]) -> Work:
    """count(batch) from the batch's first ROWS rows, at its padded lengths: the kernels launched do not
    depend on a batch's rows and its FLOPs are proportional to them, so a wide model's big batch (a language
    model's 16 windows of 512 tokens, three seeds fused) is counted in the memory and time of two rows."""
    rows = next(iter(batch.values())).size(0)
    work = count({name: t[:ROWS] for name, t in batch.items()})
    return Work(work.kernels, work.flops * rows / min(rows, ROWS))


def model_of(cfg: ModelConfig, vocab: tuple[int, int], seeds: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(cfg, *vocab, PAD_ID, ensemble=seeds)
    seed_dropout(model, list(range(seeds)))
    return model


def step_work(cfg: ModelConfig, vocab: tuple[int, int], batch: dict[str, torch.Tensor], seeds: int) -> Work:
    """One training step's forward, loss and backward: a trial's (seeds 1) or a fused group's of K seeds.
    The optimizer (one fused AdamW kernel a step on CUDA) is not counted; the fitted constants hold it."""
    model = model_of(cfg, vocab, seeds).train()
    b = stack_batches([batch] * seeds, torch.device("cpu"))  # (K·B, ...) as a fused group's step takes it

    def run() -> None:
        if seeds == 1:
            loss = training_loss(model, b["src"], b["tgt_in"], b["tgt_out"], 0.0)
        else:
            loss, _ = seed_losses(
                model, b["src"], b["tgt_in"], b["tgt_out"], 0.0, seeds, torch.ones(seeds, dtype=torch.bool)
            )
        loss.backward()

    return counted(run)


def forward_work(cfg: ModelConfig, vocab: tuple[int, int], batch: dict[str, torch.Tensor]) -> Work:
    """A validation batch: the teacher-forced forward and its loss sums. Counted with autograd on, as the
    other counts are (it launches no kernel of its own; FlopCounterMode's module hooks fail under no_grad on
    a module that returns a parameter, as a classifier's learned query does)."""
    model = model_of(cfg, vocab, 1).eval()
    return counted(lambda: loss_sums(model, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0))


def decode_work(cfg: ModelConfig, vocab: tuple[int, int], src: torch.Tensor, steps: int) -> Work:
    """Greedy decoding of a batch for `steps` tokens: the encoder once, then one step a token (every step
    launches the same kernels; its FLOPs are counted at the first, where the cache is shortest)."""
    model = model_of(cfg, vocab, 1).eval()
    state: dict = {}
    start = counted(lambda: state.update(model.init_state(src)))
    prev = torch.full((src.size(0),), BOS_ID, dtype=torch.long)
    step = counted(lambda: model.step(state, prev))
    return start + step * steps


# The device ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    """A training step measured on a device: a Transformer of `d_model` and `layers` (encoder and decoder
    each) on a batch of `batch` rows of `length` tokens, eager or captured as one CUDA graph."""

    d_model: int
    layers: int
    d_ff: int
    batch: int
    length: int
    seconds: float
    captured: bool

    def config(self) -> ModelConfig:
        preset = PRESETS["transformer"]
        return ModelConfig(**{**preset, "d_model": self.d_model, "layers": self.layers, "d_ff": self.d_ff,
                              "heads": 4, "dropout": 0.0})  # fmt: skip

    def work(self) -> Work:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(4, VOCAB, (self.batch, self.length + 1), generator=g)
        tokens[:, 0] = BOS_ID
        batch = {"src": tokens[:, 1:], "tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}
        return on_rows(partial(step_work, self.config(), (VOCAB, VOCAB), seeds=1), batch)


VOCAB = 14  # the quickstart's: ten symbols and four specials
# One H100 80GB, the project at b4d8fdd, the training step in a plain loop, fp32 (BENCHMARKS.md, "GPU: measured
# once"). The quickstart's size fits the time a kernel costs, eager and captured; the profile's size at two
# batches fits the FLOP rate; the profile's size at batch 64 is held out, to say how far the fit is off.
ANCHORS = {
    "quickstart, eager": Anchor(64, 2, 128, 64, 10, 15.8e-3, captured=False),
    "quickstart, captured": Anchor(64, 2, 128, 64, 10, 1.52e-3, captured=True),
    "profile, captured": Anchor(256, 4, 1024, 64, 40, 7.9e-3, captured=True),
    "profile x4, captured": Anchor(256, 4, 1024, 256, 40, 19.8e-3, captured=True),
}
HELD_OUT = "profile, captured"


@dataclass(frozen=True)
class Device:
    """Seconds a kernel costs (eager: launched from Python; captured: replayed in a CUDA graph) and the FP32
    FLOP rate a step reaches, fitted to ANCHORS; `held_out`: the held-out anchor, predicted and measured."""

    name: str
    eager_kernel_s: float
    captured_kernel_s: float
    flops_per_s: float
    held_out: tuple[float, float]

    def step_s(self, work: Work, captured: bool) -> float:
        device = work.kernels * (self.captured_kernel_s if captured else self.eager_kernel_s)
        device += work.flops / self.flops_per_s
        # Eager, the host launches each kernel in turn (the kernel time is the host's); captured, it runs
        # the Trainer's loop while the graph replays.
        return max(device, HOST_S) if captured else device + HOST_S

    def pass_s(self, work: Work) -> float:
        """An evaluation pass's batch: eager, no per-step host time beyond its kernels."""
        return work.kernels * self.eager_kernel_s + work.flops / self.flops_per_s


@cache
def h100() -> Device:
    works = {name: anchor.work() for name, anchor in ANCHORS.items()}
    one, four = works["profile, captured"], works["profile x4, captured"]
    rate = (four.flops - one.flops) / (
        ANCHORS["profile x4, captured"].seconds - ANCHORS["profile, captured"].seconds
    )

    def per_kernel(name: str) -> float:
        return (ANCHORS[name].seconds - works[name].flops / rate) / works[name].kernels

    captured = per_kernel("quickstart, captured")
    predicted = works[HELD_OUT].kernels * captured + works[HELD_OUT].flops / rate
    return Device(
        "h100", per_kernel("quickstart, eager"), captured, rate, (predicted, ANCHORS[HELD_OUT].seconds)
    )


DEVICES = {"h100": h100}  # what `ablate plan --device` accepts
