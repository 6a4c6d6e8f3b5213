"""Resume, not restart: periodic checkpoints of a running trial, published to the artifact store, and the
stop that a stop signal (harness.signals) asks for. Every `train.checkpoint_every` steps, and on that stop,
the trial's full state (weights, optimizer, schedule, loop counters, callbacks, RNG states) goes to
checkpoints/resume.ckpt and, under a worker, to the artifact store, recorded in the user attr `resume`. A
trial queued again (preempted) or copied by the heartbeat retry (the copy inherits the user attrs) resumes
from it with the same batch sequence: in deterministic mode its numbers equal an uninterrupted run's."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from ablate.harness import compat, signals
from ablate.harness.artifacts import BEST_CHECKPOINT, RESUME_CHECKPOINT
from ablate.harness.rules import MONITOR, Best, Schedule

RESUME_ATTR = "resume"  # user attr: {"step", "key", "state": artifact id, "best": artifact id or absent, "kind"}
BEST_FILE = f"{BEST_CHECKPOINT}.ckpt"
# The kind of a fused seed's resume checkpoint (harness/fused.py), which only a fused run resumes; a
# record without a kind is Lightning's, which only a trial alone resumes.
FUSED_STATE = "fused-seed"


def resume_point(user_attrs: dict) -> tuple[str | None, int]:
    """Where a trial resumes: (its checkpoint's kind, step); (None, 0) for a trial that starts afresh."""
    record = user_attrs.get(RESUME_ATTR)
    return (record.get("kind", "lightning"), record["step"]) if record else (None, 0)


class Preempted(Exception):
    """A stop signal arrived; the trial's state at `step` is saved and it can go back to the queue."""

    def __init__(self, signum: signal.Signals, step: int):
        super().__init__(f"{signum.name} at step {step}")
        self.signum, self.step = signum, step


class Checkpointer(L.Callback):
    """Saves the full training state when the schedule says (rules.Schedule.checkpoints) and on a stop
    signal, hands it to `publish`, then raises Preempted for a signal. A validating periodic step is saved
    after its validation, which a resumed run does not repeat and its history and best checkpoint must
    hold; a signal cannot wait (Lightning stops right after the step on SIGTERM), so a run stopped there
    lacks that one validation, its training the same. Its own state is the RNG states (Lightning's holds
    none), so dropout continues the same stream; on resume the sampler skips the epoch's used batches."""

    def __init__(self, directory: Path, schedule: Schedule, publish: Callable[[Path, int], None] | None):
        self.directory, self.schedule, self.publish = Path(directory), schedule, publish
        self.resumed_from_step = 0
        self.restored_rng: dict[str, Any] | None = None
        self.after_validation = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.resumed_from_step = trainer.global_step
        if trainer.global_step:
            # Lightning restarts a mid-epoch checkpoint's epoch from its first batch, and sets no epoch on a
            # batch sampler: continue its epoch after the batches trained on (saved in on_train_batch_end,
            # the last one counts as processed, not yet completed).
            done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            trainer.train_dataloader.batch_sampler.resume_at(trainer.current_epoch, done)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, stop = trainer.global_step, signals.received()
        periodic = self.schedule.checkpoints(step)
        if periodic and not stop and compat.validates_this_step(trainer):
            self.after_validation = True
        elif stop or periodic:
            self.save(trainer)
        if stop:
            raise Preempted(stop, step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.after_validation:
            self.after_validation = False
            self.save(trainer)

    def save(self, trainer: L.Trainer) -> None:
        path = self.directory / RESUME_CHECKPOINT
        partial = path.with_suffix(".partial")  # a kill mid-write leaves the previous checkpoint whole
        trainer.save_checkpoint(partial, weights_only=False)
        os.replace(partial, path)
        if self.publish is not None:
            self.publish(self.directory, trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        rng = compat.rng_states()
        # numpy's key array as a tensor: the checkpoint stays loadable with torch.load(weights_only=True).
        name, keys, *rest = rng["numpy"]
        return {"rng": {**rng, "numpy": (name, torch.from_numpy(keys.astype(np.int64)), *rest)}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rng = state_dict["rng"]
        name, keys, *rest = rng["numpy"]
        self.restored_rng = {**rng, "numpy": (name, keys.numpy().astype(np.uint32), *rest)}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # Restored here, not on load: whatever Lightning does before the first resumed step stays out of it.
        if self.restored_rng is not None:
            compat.restore_rng_states(self.restored_rng)
            self.restored_rng = None


class BestCheckpoint(L.Callback):
    """rules.Best of a trial alone: each better validation's weights (no optimizer state) written whole to
    `directory`/best.ckpt; its score resumes with the trial, whose best file the worker fetched there."""

    def __init__(self, directory: Path):
        self.path, self.rule = Path(directory) / BEST_FILE, Best()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        score, step = trainer.callback_metrics.get(MONITOR), trainer.global_step
        if not trainer.sanity_checking and score is not None and self.rule.improves(float(score), step):
            partial = self.path.with_suffix(".partial")  # a kill mid-write leaves the previous best whole
            trainer.save_checkpoint(partial, weights_only=True)
            os.replace(partial, self.path)

    @property
    def best_model_path(self) -> str:
        return str(self.path) if self.rule.step is not None else ""

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.rule)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rule = Best(**state_dict)


class StoredCheckpoints:
    """A trial's resume checkpoints in the artifact store, for a worker on another machine. Each attempt
    alternates two ids of its own, so a worker killed mid-upload leaves the last recorded one whole."""

    def __init__(self, store, trial, kind: str | None = None):
        self.store, self.trial, self.kind = store, trial, kind  # kind: FUSED_STATE for a fused seed
        self.key = f"resume-{uuid.uuid4().hex}"
        self.saves = 0
        self.best_id: str | None = None
        self.best_mtime = 0

    def publish(self, directory: Path, step: int) -> None:
        slot = self.saves % 2
        state = self._write(directory / RESUME_CHECKPOINT, f"{self.key}-{slot}")
        record = {"step": step, "key": self.key, "state": state, **({"kind": self.kind} if self.kind else {})}
        best = directory / BEST_FILE
        if best.is_file() and best.stat().st_mtime_ns != self.best_mtime:
            self.best_mtime = best.stat().st_mtime_ns
            self.best_id = self._write(best, f"{self.key}-best-{slot}")
        if self.best_id:
            record["best"] = self.best_id
        self.trial.set_user_attr(RESUME_ATTR, record)
        self.saves += 1

    def _write(self, path: Path, artifact_id: str) -> str:
        with path.open("rb") as f:
            self.store.write(artifact_id, f)
        return artifact_id

    def discard(self, *records: dict | None) -> None:
        """Removes every file of the attempts that wrote the given records (a finished trial needs none)."""
        for key in {record["key"] for record in filter(None, records)}:
            for artifact_id in (f"{key}-{slot}" for slot in ("0", "1", "best-0", "best-1")):
                try:
                    self.store.remove(artifact_id)
                except Exception:  # already gone (another attempt removed it): nothing left to free
                    continue


def fetch(store, record: dict, directory: Path) -> Path:
    """Downloads a resume record's checkpoints into `directory`; returns the path to resume from."""
    directory.mkdir(parents=True, exist_ok=True)
    for artifact_id, name in ((record["state"], RESUME_CHECKPOINT), (record.get("best"), BEST_FILE)):
        if artifact_id:
            with store.open_reader(artifact_id) as reader, (directory / name).open("wb") as f:
                shutil.copyfileobj(reader, f)
    return directory / RESUME_CHECKPOINT
