"""The Lightning callbacks a trial trains with: history of logged scalars, training cost, a validation
on stop, attention images, divergence and pruning."""

from __future__ import annotations

import contextlib
import resource
import time
from pathlib import Path

import lightning as L
import optuna
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import WandbLogger
from optuna_integration import PyTorchLightningPruningCallback

from ablate.harness.compat import pruning_trial
from ablate.harness.probes import Probe, capture, log_images
from ablate.models.module import Seq2SeqModule
from ablate.models.sequences import PAD_ID
from ablate.schema.errors import RunFailed


class TrialFailed(RunFailed):
    """A trial that ran but produced no usable result (it diverged, or its metric is missing)."""


class DivergenceGuard(L.Callback):
    """Stops a trial whose loss or weights stopped being finite: nothing is learned after that point.

    Each step's loss is checked on the device, without a sync; the flag and the weights are read before
    each validation and at the end of training, so no NaN model is validated, probed or tested."""

    def __init__(self):
        self.nonfinite_loss: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        bad = ~torch.isfinite(loss.detach())
        self.nonfinite_loss = bad if self.nonfinite_loss is None else self.nonfinite_loss | bad

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.nonfinite_loss is not None and bool(self.nonfinite_loss):
            raise TrialFailed(f"diverged: train/loss is not finite (by step {trainer.global_step})")
        if not all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()):
            raise TrialFailed(f"diverged: weights are not finite at step {trainer.global_step}")


def report_step(trial: optuna.Trial, score: float, step: int, prune: bool = False) -> None:
    """A validation's score reported to its trial at the training step it ran at; with `prune`, the trial
    stops there (optuna.TrialPruned) when its pruner says so. Every trial reports through here, alone
    (StepPruning, ReportValidation) or fused (harness/fused.py's on_validation)."""
    trial.report(float(score), step=step)
    if prune and trial.should_prune():
        raise optuna.TrialPruned(f"pruned at step {step}")


class StepPruning(PyTorchLightningPruningCallback):
    """Reports the monitored metric at the global step, not the epoch: training is budgeted in steps and
    validates several times per epoch, and Hyperband's resource is then the number of training steps."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_ddp_backend:
            return super().on_validation_end(trainer, pl_module)
        score = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or score is None:
            return
        report_step(pruning_trial(self), score, trainer.global_step, prune=True)


class HistoryCallback(L.Callback):
    """Keeps every logged scalar by step, so learning curves survive without any external logger."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            row = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
            self.rows.append({"step": trainer.global_step, **row})

    def state_dict(self) -> dict:
        return {"rows": self.rows}  # a resumed trial's history starts where the checkpoint's ended

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict["rows"])


def reset_peak_rss() -> None:
    """Restarts the kernel's peak-RSS count (Linux), so a long-lived worker reports each trial's own peak
    rather than the largest of all it ran."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # never reset; KiB on Linux


class CostMonitor(L.Callback):
    """Training throughput in tokens per second and peak memory.

    Tokens are counted on the device and read back once per logging interval (or validation), so
    counting adds no per-step sync; validation time is excluded from the throughput."""

    def __init__(self):
        self.tokens, self.train_seconds, self.peak_mem_mb = 0, 0.0, 0.0
        self._window_tokens: torch.Tensor | int = 0
        self._window_start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        else:
            reset_peak_rss()
        self._window_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        real = (batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum()
        self._window_tokens = self._window_tokens + real
        if trainer.loggers and trainer.global_step % trainer.log_every_n_steps == 0:
            rate = self._close_window()
            for logger in trainer.loggers:
                logger.log_metrics({"train/tokens_per_sec": rate}, step=trainer.global_step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._window_start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window()
        if pl_module.device.type == "cuda":
            self.peak_mem_mb = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        else:
            self.peak_mem_mb = peak_rss_mb()

    def _close_window(self) -> float:
        tokens = int(self._window_tokens)
        seconds = time.perf_counter() - self._window_start
        self.tokens, self.train_seconds = self.tokens + tokens, self.train_seconds + seconds
        self._window_tokens, self._window_start = 0, time.perf_counter()
        return tokens / max(seconds, 1e-9)

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / max(self.train_seconds, 1e-9)


class ValidateOnStop(L.Callback):
    """Ends training on a validation: Lightning validates when asked to stop, so the weights of the last
    step (max_steps reached mid-interval) are scored and can become the best checkpoint."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class AttentionImages(L.Callback):
    """Logs the probes' attention heatmaps to W&B after every validation, to watch alignments form."""

    def __init__(self, probes: list[Probe]):
        self.probes = probes

    def on_validation_end(self, trainer: L.Trainer, pl_module: Seq2SeqModule) -> None:
        if not trainer.sanity_checking and any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
            log_images(trainer.loggers, capture(pl_module, self.probes), trainer.global_step)


class ReportValidation(L.Callback):
    """Reports the monitored metric to the trial at each validation (at the global step), so the dashboard
    draws an eval trial's learning curve while it runs; nothing is pruned (see StepPruning for tuning)."""

    def __init__(self, trial: optuna.Trial, monitor: str):
        self.trial, self.monitor = trial, monitor

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        score = trainer.callback_metrics.get(self.monitor)
        if not trainer.sanity_checking and score is not None:
            report_step(self.trial, score, trainer.global_step)


class StepBudgetProgressBar(RichProgressBar):
    """Rich's bar, counting the optimizer steps of a step budget (train.max_steps) on one bar across epochs,
    where Lightning counts each epoch's batches under "Epoch 3/-2" (max_epochs is -1 then); an epoch budget
    keeps Lightning's bar. Lightning's hooks and Rich's Progress only: no private Lightning API."""

    DESCRIPTION = "steps"

    @staticmethod
    def by_steps(trainer: L.Trainer) -> bool:
        return trainer.max_epochs == -1 and trainer.max_steps > 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.by_steps(trainer):
            self.add_step_bar(trainer)
        else:
            super().on_train_epoch_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.by_steps(trainer):
            self.add_step_bar(trainer)  # a run resumed mid-epoch starts no epoch
            batch_idx = trainer.global_step - 1  # the bar's position: Lightning's is batch_idx + 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def add_step_bar(self, trainer: L.Trainer) -> None:
        """The one bar of the whole budget, added once."""
        if self.progress is None or self.train_progress_bar_id is not None:
            return
        description = self.DESCRIPTION.ljust(len(self.validation_description))  # no flicker
        style = self.theme.description
        self.train_progress_bar_id = self.progress.add_task(
            f"[{style}]{description}" if style else description,
            total=trainer.max_steps,
            completed=trainer.global_step,
        )
        self.refresh()
