"""The private Optuna, optuna-integration and Lightning attributes this project relies on, in one place.

Each has no public equivalent for what we need; tests/test_compat.py pins the behaviour each use assumes,
so an upgrade that changes it fails there, by name, rather than somewhere inside a study."""

from __future__ import annotations

import optuna
from lightning.pytorch.callbacks import RichProgressBar
from optuna_integration import PyTorchLightningPruningCallback


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial. Workers claim queued trials themselves (set_trial_state_values) and
    beat their heartbeat, and both storage calls take this id; Optuna exposes only `number`, which is
    unique within one study, not within the storage that holds every variant's study."""
    return trial._trial_id


def pruning_trial(callback: PyTorchLightningPruningCallback) -> optuna.Trial:
    """The trial an optuna-integration pruning callback reports to. StepPruning reports at the global step
    instead of the epoch, and the callback keeps its trial only as `_trial`."""
    return callback._trial


class StepBudgetProgressBar(RichProgressBar):
    """Rich's bar, without the "Epoch 3/-2" it shows when a run is bounded by steps (max_epochs -1).
    `_get_train_description` is the one place the bar builds that text; no public hook sets it."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"Epoch {current_epoch}".ljust(len(self.validation_description))  # as wide: no flicker
