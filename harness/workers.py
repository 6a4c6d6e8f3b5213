"""Workers: claim a queued trial, run it, store its result and artifacts, until none is left.

A worker runs the tune trials of every variant first (each variant's own TPE study, pruned through
optuna-integration's Lightning callback), then the eval grid: an eval trial of a variant is claimed only
once that variant's tuning is finished, and runs with its best parameters. Any number of workers, local or
on other machines, may join the same storage; `spawn_workers` starts local ones, pinned to GPUs or not.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import optuna
import torch
from optuna.trial import TrialState
from optuna_integration import PyTorchLightningPruningCallback

from harness import provenance, tracking
from harness.artifacts import artifact_store, study_dir, trial_dir, upload_trial_files
from harness.study.looks import queue_next_look
from harness.study.queue import (
    EVAL,
    TUNE,
    best_tuned_params,
    grid_point,
    load_phase_study,
    suggest,
    trial_variant,
)
from harness.study.spec import StudySpec, slugify, tune_metric
from harness.study.storage import retry_callback

POLL_S = 2.0  # how often a worker with nothing claimable looks again while tuning finishes elsewhere


class TrialFailed(RuntimeError):
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


class StepPruning(PyTorchLightningPruningCallback):
    """Reports the monitored metric at the global step, not the epoch: training is budgeted in steps and
    validates several times per epoch, and Hyperband's resource is then the number of training steps."""

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_ddp_backend:
            return super().on_validation_end(trainer, pl_module)
        score = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or score is None:
            return
        self._trial.report(float(score), step=trainer.global_step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {trainer.global_step}")


@dataclass
class Claim:
    study: optuna.Study
    trial: optuna.Trial
    phase: str
    variant: str


@contextmanager
def heartbeat(storage, trial_id: int) -> Iterator[None]:
    """Records the trial's heartbeat in the background while it runs: a trial whose worker dies stops
    beating, and the next worker to look fails it and queues a retry (see study.open_storage)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception as e:  # the database blinked: beat again next time rather than stop beating
                print(
                    f"heartbeat of trial {trial_id} not recorded ({type(e).__name__}); retrying",
                    file=sys.stderr,
                )
            if stop.wait(storage.get_heartbeat_interval()):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Worker:
    """One process's share of a study: claims, runs and records trials until none is left to claim."""

    def __init__(self, spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode="offline"):
        self.spec, self.storage, self.wandb_mode = spec, storage, wandb_mode
        self.variants = spec.variant_overrides()
        self.root = study_dir(spec.slug, runs_root)
        self.store = artifact_store(spec.slug, runs_root)
        self.eval = load_phase_study(spec, storage, EVAL)
        self.tune = {v: load_phase_study(spec, storage, TUNE, v) for v in self.variants} if spec.tune else {}

    def run(self) -> None:
        """Runs trials until nothing is queued or running and no claim wants more seeds (study.looks); waits
        while eval trials wait for tuning elsewhere, and while other workers' trials run: one whose worker
        died is queued again once its heartbeat is stale, and somebody must be left to run it."""
        while True:
            claim = self.claim()
            if claim is not None:
                self.run_claimed(claim)
            elif self.anything_pending():
                time.sleep(POLL_S)
            elif not queue_next_look(self.spec, self.storage):
                return

    def studies(self) -> list[optuna.Study]:
        return [*self.tune.values(), self.eval]

    def anything_pending(self) -> bool:
        pending = (TrialState.WAITING, TrialState.RUNNING)
        return any(s.get_trials(deepcopy=False, states=pending) for s in self.studies())

    def tuning_finished(self, variant: str) -> bool:
        if variant not in self.tune:
            return True
        pending = (TrialState.WAITING, TrialState.RUNNING)
        return not self.tune[variant].get_trials(deepcopy=False, states=pending)

    def claim(self) -> Claim | None:
        """Atomically takes the next WAITING trial that can run now: tune trials first, then eval trials of
        tuned variants."""
        for study in self.studies():
            # A worker that died mid-trial left it RUNNING; failing it queues its retry (heartbeat).
            with quiet_experimental():
                optuna.storages.fail_stale_trials(study)
        for study in self.tune.values():
            claim = self._claim_from(study, TUNE)
            if claim:
                return claim
        return self._claim_from(self.eval, EVAL)

    def _claim_from(self, study: optuna.Study, phase: str) -> Claim | None:
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            variant = trial_variant(frozen)
            if phase == EVAL and not self.tuning_finished(variant):
                continue
            # The WAITING -> RUNNING transition succeeds for exactly one process. The list read above may
            # be stale: another worker may have claimed this trial and even finished it since.
            try:
                claimed = self.storage.set_trial_state_values(frozen._trial_id, TrialState.RUNNING)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            if claimed:
                return Claim(study, optuna.Trial(study, frozen._trial_id), phase, variant)
        return None

    def run_claimed(self, claim: Claim) -> None:
        trial, study = claim.trial, claim.study
        start = time.monotonic()

        def say(outcome: str) -> None:
            where = trial.user_attrs.get("grid_point", claim.variant)
            print(f"{claim.phase} trial {trial.number} {where}: {outcome} ({time.monotonic() - start:.0f} s)",
                  flush=True)  # fmt: skip

        try:
            with heartbeat(self.storage, trial._trial_id):
                value = self.objective(claim)
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            say("pruned")
        except (KeyboardInterrupt, SystemExit):
            # Lightning turns Ctrl-C during fit into SystemExit; either way: no trial left RUNNING, the
            # grid point queued again for the next run, then stop.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.requeue(study, trial, "interrupted")
            raise KeyboardInterrupt from None
        except Exception as e:
            trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
            trial.set_user_attr("traceback", traceback.format_exc()[-4000:])
            study.tell(trial, state=TrialState.FAIL)
            free_device_memory()
            say(f"FAILED, {type(e).__name__}: {e}"[:300])
        else:
            study.tell(trial, value)
            say(f"{self.metric_name(claim)} = {value:.4g}")

    def metric_name(self, claim: Claim) -> str:
        return tune_metric(self.spec).name if claim.phase == TUNE else self.spec.metric.name

    def requeue(self, study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
        """Fails the trial with `reason` and queues a copy of it (same grid point) as WAITING."""
        before = self.storage.get_trial(trial._trial_id)  # the copy must not inherit the fail reason
        trial.set_user_attr("fail_reason", reason)
        study.tell(trial, state=TrialState.FAIL)
        retry_callback(None)(study, before)

    def objective(self, claim: Claim) -> float:
        spec, trial, variant = self.spec, claim.trial, claim.variant
        overrides = self.variants[variant]
        callbacks: list[L.Callback] = [DivergenceGuard()]
        if claim.phase == TUNE:
            assert spec.tune is not None
            seed = spec.seed_pool[0]
            extra = {key: suggest(trial, key, space) for key, space in spec.tune.params.items()}
            callbacks.append(StepPruning(trial, monitor=self.metric_name(claim)))
            name = f"{variant}-seed{seed}-tune{trial.number}"
        else:
            # The stored fixed params make these return the queued grid point, recorded as trial params.
            variant = trial.suggest_categorical("variant", list(self.variants))
            seed = trial.suggest_categorical("seed", spec.seed_pool)
            extra = {}
            if spec.tune:
                extra, best_number = best_tuned_params(spec, self.storage, variant)
                trial.set_user_attr("tuned", extra)
                trial.set_user_attr("tune_trial", best_number)
            name = f"{variant}-seed{seed}"
        cfg = spec.config_for(overrides, seed, extra)
        trial.set_user_attr("factors", overrides)
        trial.set_user_attr("config", cfg.flat())
        trial.set_user_attr("grid_point", grid_point(variant, seed))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")  # who ran it, for post-mortems
        trial.set_user_attr("hardware", provenance.hardware())
        trial.set_user_attr("versions", provenance.versions())
        trial.set_user_attr("git_commit", provenance.git_commit())
        out_dir = trial_dir(
            self.root, claim.phase, trial.number, slugify(variant) if claim.phase == TUNE else None
        )
        tags = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()]
        from harness.trial import run_trial

        try:
            with tracking.wandb_logger(
                self.wandb_mode, self.root, group=spec.name, name=name, job_type=claim.phase, tags=tags,
                config=cfg.flat(),
            ) as logger:  # fmt: skip
                result = run_trial(
                    cfg, out_dir=out_dir, loggers=[logger] if logger else None, callbacks=callbacks
                )
        except BaseException as failure:
            # A failed trial keeps what it wrote, for a post-mortem; its own error stays the reason.
            try:
                self.store_artifacts(trial, out_dir)
            except Exception as e:
                failure.add_note(f"Its artifacts could not be stored either: {type(e).__name__}: {e}")
            raise
        self.store_artifacts(trial, out_dir)
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("params", result.params)
        trial.set_user_attr("wall_time", result.wall_time)
        trial.set_user_attr("split_sizes", result.split_sizes)
        metric = self.metric_name(claim)
        value = result.metrics.get(metric)
        if value is None or not math.isfinite(value):
            raise TrialFailed(f"metric {metric} is {value!r}")
        return value

    def store_artifacts(self, trial: optuna.Trial, out_dir: Path) -> None:
        if out_dir.is_dir():
            trial.set_user_attr("artifacts", upload_trial_files(trial, out_dir, self.store))


@contextmanager
def quiet_experimental() -> Iterator[None]:
    """Heartbeat failing and retry copies are stable in practice but still flagged experimental."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def free_device_memory() -> None:
    """After a failed trial (CUDA out of memory among others), return its cached blocks to the device."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_worker(spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode="offline") -> Worker:
    """Runs queued trials of a prepared study (see study.prepare_study) until none is left."""
    from harness.trial import quiet_lightning

    quiet_lightning()
    worker = Worker(spec, storage, runs_root, wandb_mode)
    worker.run()
    return worker


# Local worker processes ------------------------------------------------------------------------------------


def worker_slots(workers: int | None, devices: list[str] | None, per_device: int) -> list[dict[str, str]]:
    """The environment of each local worker process: K per listed GPU, each seeing only its GPU; N CPU
    workers (GPUs hidden); or one worker with the environment as it is."""
    if devices:
        return [{"CUDA_VISIBLE_DEVICES": d} for d in devices for _ in range(per_device)]
    if workers:
        return [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(workers)]
    return [{}]


def spawn_workers(
    study_name: str, storage_url: str, runs_root: str | Path, wandb_mode: str, slots: list[dict[str, str]]
) -> list[subprocess.Popen]:
    """Starts one `ablate worker` process per slot, each with CPU threads = cores / processes."""
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    command = [sys.executable, "-m", "harness.cli", "worker", study_name, "--storage", storage_url,
               "--out", str(runs_root), "--wandb", wandb_mode, "--threads", str(threads)]  # fmt: skip
    return [subprocess.Popen(command, env={**os.environ, **slot}) for slot in slots]


def stop_workers(procs: list[subprocess.Popen], grace_s: float = 30.0) -> None:
    """Ctrl-C: the workers got SIGINT too (same process group) and are closing their trials; SIGINT those
    that did not, then wait, then kill what is left (its trial is retried through the heartbeat)."""
    deadline = time.monotonic() + 5
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
