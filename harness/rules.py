"""The training rules of a trial, each written once: when it validates, saves its resume checkpoint and
stops (Schedule), divergence, early stopping (Patience), the best weights (Best) and the training cost. A
trial alone holds one of each through thin Lightning callbacks (harness/callbacks.py,
harness/checkpoints.py), a fused group one per seed (harness/fused.py), so a seed follows the same rules
fused as alone by construction. Torch only: no Lightning, no Optuna (reporting to Optuna and pruning:
harness/callbacks.py `report_step`)."""

from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ablate.models.sequences import PAD_ID
from ablate.schema.config import TrainConfig
from ablate.schema.errors import RunFailed

MONITOR = "val/loss"  # what selects the best weights and drives early stopping


class TrialFailed(RunFailed):
    """A trial that ran but produced no usable result (it diverged, or its metric is missing)."""


@dataclass(frozen=True)
class Schedule:
    """train.*'s budgets and cadences: validation every val_every steps, counted across epochs (an epoch
    shorter than val_every does not cut the interval), or at each epoch's end with max_epochs, and once more
    when training stops; the resume checkpoint every checkpoint_every steps before the last."""

    train: TrainConfig

    def trainer_args(self) -> dict[str, Any]:
        """The schedule as Lightning's Trainer arguments (the last validation: callbacks.ValidateOnStop)."""
        t, by_steps = self.train, self.train.max_epochs is None
        return {
            "max_steps": t.max_steps,
            "max_epochs": -1 if by_steps else t.max_epochs,
            "max_time": {"seconds": t.max_time} if t.max_time else None,
            "val_check_interval": t.val_every if by_steps else None,
            "check_val_every_n_epoch": None if by_steps else 1,  # None: val_check_interval counts global steps
        }

    def validates(self, step: int, epoch_ended: bool) -> bool:
        return epoch_ended if self.train.max_epochs is not None else step % self.train.val_every == 0

    def done(self, step: int, epochs_done: int, seconds: float) -> bool:
        t = self.train
        return (
            step >= t.max_steps
            or (t.max_epochs is not None and epochs_done >= t.max_epochs)
            or (t.max_time is not None and seconds >= t.max_time)
        )

    def checkpoints(self, step: int) -> bool:
        every = self.train.checkpoint_every
        return bool(every) and step % every == 0 and step < self.train.max_steps


class Divergence:
    """A loss or weights that stopped being finite: nothing is learned after that point. Each step's loss is
    checked on the device, without a sync; the flag is read when asked, before each validation and at the end
    of training, so no NaN model is validated, kept as the best or tested."""

    def __init__(self):
        self.nonfinite: torch.Tensor | None = None

    def observe(self, loss: torch.Tensor) -> None:
        bad = ~torch.isfinite(loss.detach())
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite | bad

    def failure(self, step: int, weights: Iterable[torch.Tensor]) -> TrialFailed | None:
        if self.nonfinite is not None and bool(self.nonfinite):
            return TrialFailed(f"diverged: train/loss is not finite (by step {step})")
        if not all(bool(torch.isfinite(w).all()) for w in weights):
            return TrialFailed(f"diverged: weights are not finite at step {step}")
        return None


@dataclass
class Patience:
    """Lightning's EarlyStopping on val/loss (min_delta 0): stop after `patience` validations without a
    strictly better score, or at a score that is not finite."""

    patience: int
    best: float = math.inf
    wait: int = 0

    def stops(self, score: float) -> bool:
        if not math.isfinite(score):
            return True
        if score < self.best:
            self.best, self.wait = score, 0
        else:
            self.wait += 1
        return self.wait >= self.patience


@dataclass
class Best:
    """The validation whose weights are tested: the lowest val/loss, strictly lower to replace one (NaN counts
    as +inf, as ModelCheckpoint counts it; the first validation is always kept)."""

    score: float = math.inf
    step: int | None = None

    def improves(self, score: float, step: int) -> bool:
        score = math.inf if math.isnan(score) else score
        if self.step is not None and not score < self.score:
            return False
        self.score, self.step = score, step
        return True


def peak_rss_mb() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # never reset; KiB on Linux


class Cost:
    """Training throughput in tokens per second (source and target tokens without padding, validation time
    excluded) and peak memory. Tokens are counted on the device and read when a window closes, so counting
    adds no per-step sync. A resumed trial counts from its resumption."""

    def __init__(self):
        self.tokens, self.train_seconds, self.peak_mem_mb = 0, 0.0, 0.0
        self.window_tokens: torch.Tensor | int = 0
        self.window_start = 0.0

    def start(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:  # restarts the kernel's peak-RSS count (Linux): a long-lived worker reports each trial's own peak
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")
        self.resume()

    def count(self, batch: dict[str, torch.Tensor]) -> None:
        self.window_tokens = (
            self.window_tokens + (batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum()
        )

    def lap(self) -> float:
        """Closes the window (its tokens and seconds join the totals), opens the next; the window's rate."""
        tokens, seconds = int(self.window_tokens), time.perf_counter() - self.window_start
        self.tokens, self.train_seconds = self.tokens + tokens, self.train_seconds + seconds
        self.window_tokens = 0
        self.resume()
        return tokens / max(seconds, 1e-9)

    def resume(self) -> None:
        """The clock restarts here (after a validation, which the throughput leaves out)."""
        self.window_start = time.perf_counter()

    def finish(self, device: torch.device) -> None:
        self.lap()
        self.peak_mem_mb = (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mb()
        )

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / max(self.train_seconds, 1e-9)
