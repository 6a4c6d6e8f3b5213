"""The Lightning callbacks a trial alone trains with: thin holders of harness/rules.py's rules (divergence,
early stopping, cost), the validation history, the last validation on stop, attention images, the report to
Optuna and pruning, and the step-budget progress bar."""

from __future__ import annotations

import dataclasses

import lightning as L
import optuna
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import WandbLogger

from ablate.harness.probes import Probe, capture, log_images
from ablate.harness.rules import MONITOR, Cost, Divergence, Patience
from ablate.models.module import Seq2SeqModule


class DivergenceGuard(L.Callback):
    """rules.Divergence for a trial alone: each step's loss observed, the rule asked before each validation
    and at the end of training."""

    def __init__(self):
        self.rule = Divergence()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rule.observe(outputs["loss"] if isinstance(outputs, dict) else outputs)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        failure = self.rule.failure(trainer.global_step, pl_module.parameters())
        if failure is not None:
            raise failure


class EarlyStop(L.Callback):
    """rules.Patience for a trial alone, after each validation; its count resumes with the trial."""

    def __init__(self, patience: int):
        self.rule = Patience(patience)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        score = trainer.callback_metrics.get(MONITOR)
        if score is not None and not trainer.sanity_checking and self.rule.stops(float(score)):
            trainer.should_stop = True

    def state_dict(self) -> dict:
        return dataclasses.asdict(self.rule)

    def load_state_dict(self, state_dict: dict) -> None:
        self.rule = Patience(**state_dict)


def report_step(trial: optuna.Trial, score: float, step: int, prune: bool = False) -> None:
    """A validation's score reported to its trial at its training step; with `prune`, optuna.TrialPruned
    when the pruner says so. Every trial reports here, alone (ReportValidation) or fused."""
    trial.report(float(score), step=step)
    if prune and trial.should_prune():
        raise optuna.TrialPruned(f"pruned at step {step}")


class HistoryCallback(L.Callback):
    """Every logged scalar of a trial alone's validations by step, so learning curves survive without any
    external logger (a fused seed keeps the same rows)."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            scalars = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
            self.rows.append({"step": trainer.global_step, **scalars})

    def state_dict(self) -> dict:
        return {"rows": self.rows}  # a resumed trial's history starts where the checkpoint's ended

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict["rows"])


class CostMonitor(L.Callback):
    """rules.Cost of a trial alone, its window's throughput logged every logging interval."""

    def __init__(self):
        self.cost = Cost()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.cost.start(pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.cost.count(batch)
        if trainer.loggers and trainer.global_step % trainer.log_every_n_steps == 0:
            rate = self.cost.lap()
            for logger in trainer.loggers:
                logger.log_metrics({"train/tokens_per_sec": rate}, step=trainer.global_step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.cost.lap()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.cost.resume()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.cost.finish(pl_module.device)


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
    """Reports the monitored metric to the trial at each validation, at the global step, not the epoch as
    optuna-integration's pruning callback does: training is budgeted in steps and validates several times per
    epoch, so Hyperband's resource is the number of training steps. With `prune` (tuning), optuna.TrialPruned
    when the pruner says so; without (an eval trial), the dashboard draws its learning curve while it runs."""

    def __init__(self, trial: optuna.Trial, monitor: str, prune: bool = False):
        self.trial, self.monitor, self.prune = trial, monitor, prune

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        score = trainer.callback_metrics.get(self.monitor)
        if not trainer.sanity_checking and score is not None:
            report_step(self.trial, score, trainer.global_step, prune=self.prune)

    def report_row(self, row: dict[str, float]) -> None:
        """A fused seed's validation row (harness/fused.py), reported as the trial alone's validation is."""
        if self.monitor in row:
            report_step(self.trial, row[self.monitor], int(row["step"]), prune=self.prune)


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
