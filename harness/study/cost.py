"""What a study costs on a GPU before it runs (`ablate plan`): each variant's training step, validation pass
and test pass counted on this machine's CPU at the study's own batches and priced on the device
(harness/step_cost.py), summed over the runs the study will make there, fused and compiled as they will be,
and cut into commands of `ablate sweep --time-limit`.

An estimate, and an upper one where nothing was measured (`ASSUMED`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cache, partial

import torch

from ablate.harness.grouping import FUSE_AT_MOST, why_alone
from ablate.harness.signals import STOP_GRACE_S
from ablate.harness.step_cost import (
    COMPILE_S,
    DEVICES,
    WORKER_S,
    Device,
    Work,
    decode_work,
    forward_work,
    on_rows,
    step_work,
)
from ablate.harness.tasks import build_task
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.models.decoding import SYNC_EVERY
from ablate.models.steps import compiles
from ablate.schema.config import ExperimentConfig
from ablate.schema.errors import ConfigError
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL, TUNE

GRAPHS = 4  # graphs a variant compiles in a worker: the training and validation steps, static then dynamic

ASSUMED = (
    "every trial trains to train.max_steps (no early stop, no pruning) and every adaptive look runs",
    "one worker per device: trials and fused groups one after another",
    "a step costs at least the host time of a trial's step on the device, measured before the step compiled",
    "an evaluation pass decodes its split's longest target (+ EOS) for every batch, eager",
    "an RNN layer over packed sequences is one kernel, as cuDNN runs it (counted unpacked: as_cudnn_runs)",
    "each command restarts its worker and compiles its variant again",
)


# A study ----------------------------------------------------------------------------------------------------


@dataclass
class Group:
    """Trials of one variant and phase that cost alike: `count` runs of `seeds` seeds (fused when > 1)."""

    variant: str
    phase: str
    count: int
    seeds: int
    steps: int
    step_s: float  # one training step of the group
    captured: bool
    validation_s: float  # every validation of a run, all its seeds
    test_s: float  # the test pass of a run, all its seeds
    why_alone: str | None = None

    @property
    def run_s(self) -> float:
        return self.steps * self.step_s + self.validation_s + self.test_s

    @property
    def total_s(self) -> float:
        return self.count * self.run_s


@dataclass
class Estimate:
    study: str
    profile: str | None
    device: Device
    groups: list[Group] = field(default_factory=list)

    @property
    def variants(self) -> int:
        return len({g.variant for g in self.groups})  # every variant has a run

    @property
    def compile_s(self) -> float:
        captured = {g.variant for g in self.groups if g.captured}
        return len(captured) * GRAPHS * COMPILE_S

    @property
    def total_s(self) -> float:
        return WORKER_S + self.compile_s + sum(g.total_s for g in self.groups)

    def summary(self, limit_s: float) -> dict:
        """The estimate as JSON: the device's fit, every group, the total and the commands it takes."""
        return {
            "study": self.study, "profile": self.profile, "device": asdict(self.device),
            "groups": [{**asdict(g), "total_s": g.total_s} for g in self.groups],
            "worker_s": WORKER_S, "compile_s": self.compile_s, "total_s": self.total_s,
            "time_limit_s": limit_s, "commands": self.parts(limit_s), "assumed": list(ASSUMED),
        }  # fmt: skip

    def lines(self, limit_s: float, command: str) -> list[str]:
        """What the estimate says, in words, after its table."""
        predicted, measured = self.device.held_out
        parts = self.parts(limit_s)
        return [
            f"a worker's start {WORKER_S:.0f} s; compiling {self.compile_s:.0f} s ({GRAPHS} graphs of "
            f"{COMPILE_S:.0f} s for each variant whose step compiles)",
            f"expected on one {self.device.name.upper()}: {self.total_s / 60:.0f} min, "
            + (
                f"one command: `{command}`"
                if parts == 1
                else f"{parts} commands of `{command}`, each continuing the last"
            ),  # fmt: skip
            f"device constants fitted to steps measured once on it (BENCHMARKS.md): a kernel "
            f"{self.device.eager_kernel_s * 1e6:.0f} us eager, {self.device.captured_kernel_s * 1e6:.1f} us "
            f"captured, {self.device.flops_per_s / 1e12:.0f} TFLOP/s in fp32; the held-out step predicted "
            f"{predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms",
            *(f"assumed: {a}" for a in ASSUMED),
        ]

    def parts(self, limit_s: float) -> int:
        """Commands of `--time-limit limit_s` that run it, each continuing the last from the storage; each
        restarts its worker, compiles what it trains again and loses what its stop cuts off."""
        return max(1, math.ceil((self.total_s - WORKER_S) / training_s(limit_s)))


def training_s(limit_s: float) -> float:
    """What a command of `--time-limit limit_s` has left to train after its worker's start, its compiling and
    its stop; ConfigError where nothing is left (checked before a study is priced)."""
    usable = limit_s - WORKER_S - GRAPHS * COMPILE_S - STOP_GRACE_S
    if usable <= 0:
        raise ConfigError(f"--time-limit {limit_s:g}: leaves nothing to train after a worker's start, its "
                          f"compiling and its stop ({limit_s - usable:.0f} s)")  # fmt: skip
    return usable


def batch_of(dm: Seq2SeqDataModule, split: str, indices: list[int]) -> dict[str, torch.Tensor]:
    return dm.collate(split, [dm.encoded[split][i] for i in indices])


def typical_batch(dm: Seq2SeqDataModule) -> dict[str, torch.Tensor]:
    """The training batch of median padded size among an epoch's first 64."""
    src, tgt = dm.encoded["train"].lengths()
    batches = dm.sampler("train", shuffle=True).batches(0)[:64]
    median = sorted(batches, key=lambda b: len(b) * (src[b].max() + tgt[b].max()))[len(batches) // 2]
    return batch_of(dm, "train", median)


def split_s(cfg: ExperimentConfig, dm: Seq2SeqDataModule, split: str, device: Device, beam: int) -> float:
    """One evaluation pass over `split`, eager: each batch's teacher-forced forward and its decoding of the
    split's longest target (+ EOS, to the next check that every row has ended), `beam` rows an example."""
    vocab = (len(dm.data.src_vocab), len(dm.data.tgt_vocab))
    batches = dm.sampler(split, shuffle=False).batches(0)
    _, tgt = dm.encoded[split].lengths()
    steps = math.ceil((int(tgt.max()) + 1) / SYNC_EVERY) * SYNC_EVERY
    batch = batch_of(dm, split, batches[0])
    forward = on_rows(lambda b: forward_work(cfg.model, vocab, b), batch)
    beams = {"src": batch["src"].repeat_interleave(beam, 0)}
    decoded = on_rows(lambda b: decode_work(cfg.model, vocab, b["src"], steps), beams)
    return len(batches) * device.pass_s(forward + decoded)


def eval_s(cfg: ExperimentConfig, dm: Seq2SeqDataModule, device: Device) -> tuple[float, float]:
    """(every validation of a run, its test pass), one seed: validations decode greedily, the test splits
    with train.beam_size."""
    validations = cfg.train.max_steps // cfg.train.val_every + 1
    test = sum(split_s(cfg, dm, split, device, cfg.train.beam_size) for split in dm.eval_splits)
    return validations * split_s(cfg, dm, "valid", device, 1), test


@dataclass(frozen=True)
class Counted:
    """A configuration's work, counted once for every variant and phase that share it: a training step of one
    seed, of two and three fused (None where nothing fuses), every validation and the test pass in seconds."""

    one: Work
    two: Work | None
    three: Work | None
    captured: bool
    validation_s: float
    test_s: float

    def step(self, seeds: int) -> Work:
        """A step of K fused seeds. A fused model runs other kernels than a plain one (batched matmuls over the
        seeds), so K is extrapolated from two and three: kernels stay where seeds share each kernel and grow
        by a step's where a family runs its seeds in turn; FLOPs grow by a seed's."""
        if seeds == 1:
            return self.one
        extra = Work(self.three.kernels - self.two.kernels, self.three.flops - self.two.flops)
        return self.two + extra * (seeds - 2)


@cache
def counted_config(cfg: ExperimentConfig, device: Device) -> Counted:
    """`cfg`'s work, from its data built as a trial builds it."""
    data = build_task(cfg.task, cfg.seed)
    captured = compiles(cfg.train.compile, cfg.model, "cuda")
    dm = Seq2SeqDataModule(data, cfg.train.batch_size, cfg.seed, batch_tokens=cfg.train.batch_tokens,
                           bounded_lengths=captured)  # fmt: skip
    vocab, batch = (len(data.src_vocab), len(data.tgt_vocab)), typical_batch(dm)
    alone = why_alone(cfg, cuda=True)
    one, two, three = [
        None if k > 1 and alone else on_rows(partial(step_work, cfg.model, vocab, seeds=k), batch) for k in (1, 2, 3)
    ]  # fmt: skip
    return Counted(one, two, three, captured, *eval_s(cfg, dm, device))


def groups_of(spec: StudySpec, variant: str, overrides: dict, device: Device) -> list[Group]:
    """A variant's runs on `device`: each look's new eval seeds one fused group (or trials alone), and each
    tune trial one group of its seeds."""
    cfg = spec.config_for(overrides, spec.seed_pool[0])
    work, alone = counted_config(cfg, device), why_alone(cfg, cuda=True)
    looks = spec.seed_looks
    runs = [(EVAL, n - m) for m, n in zip([0, *looks], looks)]
    if spec.tune is not None and variant in spec.tuned_variants:
        runs = [(TUNE, len(spec.tune_seeds))] * spec.tune.trials + runs
    groups: dict[tuple[str, int], Group] = {}
    for phase, seeds in runs:
        sizes = [1] * seeds if alone else [FUSE_AT_MOST] * (seeds // FUSE_AT_MOST) + [seeds % FUSE_AT_MOST]
        for k in filter(None, sizes):
            if (phase, k) not in groups:
                step_s = device.step_s(work.step(k), work.captured)
                groups[phase, k] = Group(variant, phase, 0, k, cfg.train.max_steps, step_s, work.captured,
                                         k * work.validation_s, k * work.test_s, alone)  # fmt: skip
            groups[phase, k].count += 1
    return list(groups.values())


def estimate(spec: StudySpec, device: str = "h100") -> Estimate:
    """The study's trials on one `device`, as `ablate sweep` would run them there."""
    found = Estimate(spec.name, spec.profile, DEVICES[device]())
    for name, overrides in spec.variant_overrides().items():
        found.groups += groups_of(spec, name, overrides, found.device)
    return found
