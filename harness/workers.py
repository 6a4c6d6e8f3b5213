"""Workers: claim a queued trial, run it, store its result and artifacts, until none is left.

A worker runs the tune trials of every variant first (each variant's own TPE study, pruned through
optuna-integration's Lightning callback), then the eval grid: an eval trial of a variant is claimed only
once that variant's tuning is finished, and runs with its best parameters. Any number of workers, local or
on other machines, may join the same storage; harness/launchers start them (`local.py` on this machine).
"""

from __future__ import annotations

import errno
import math
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import optuna
import torch
from optuna.trial import TrialState

from ablate.harness import compat, provenance, signals, tracking
from ablate.harness.artifacts import (
    CHECKPOINTS,
    RESUME_CHECKPOINT,
    artifact_store,
    slugify,
    study_dir,
    trial_dir,
    upload_trial_files,
)
from ablate.harness.callbacks import ReportValidation, StepPruning, TrialFailed
from ablate.harness.checkpoints import RESUME_ATTR, Preempted, StoredCheckpoints, fetch
from ablate.harness.launchers.commands import NO_SPACE_EXIT, STORAGE_FULL_EXIT
from ablate.harness.study.looks import queue_next_look
from ablate.harness.study.queue import (
    EVAL,
    TUNE,
    best_tuned_params,
    grid_point,
    load_phase_study,
    suggest,
    trial_seed,
    trial_variant,
)
from ablate.harness.study.spec import StudySpec, tune_metric, validation_metric
from ablate.harness.study.storage import chain, masked_url, quiet_experimental, storage_full

POLL_S = 2.0  # how often a worker with nothing claimable looks again while tuning finishes elsewhere


@dataclass
class Claim:
    study: optuna.Study
    trial: optuna.Trial
    phase: str
    variant: str
    seed: int | None = None  # eval trials: the queued grid point's


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

    def __init__(
        self, spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode="offline",
        artifacts: str | None = None,
    ):  # fmt: skip
        self.spec, self.storage, self.wandb_mode = spec, storage, wandb_mode
        self.variants = spec.variant_overrides()
        self.root = study_dir(spec.slug, runs_root)
        self.store = artifact_store(spec.slug, runs_root, artifacts)
        self.eval = load_phase_study(spec, storage, EVAL)
        self.tune = {v: load_phase_study(spec, storage, TUNE, v) for v in self.variants} if spec.tune else {}
        self.finished_last = False
        self.stopped: str | None = None  # why the worker stopped before the study was done (one line)
        self.storage_full = False  # stopped because the storage could not write

    def run(self) -> None:
        """Runs trials until nothing is queued or running and no claim wants more seeds (study.looks); waits
        while eval trials wait for tuning elsewhere, and while other workers' trials run: one whose worker
        died is queued again once its heartbeat is stale, and somebody must be left to run it.
        `finished_last` says whether this worker recorded its last trial and that left nothing pending: then
        it finished the study. Stops early after a stop signal or a full disk."""
        while self.stopped is None:
            if signals.received():
                self.stopped = f"{signals.received().name}: no trial was running; stopped"
                return
            claim = None
            try:
                claim = self.claim()
                if claim is not None:
                    recorded = self.run_claimed(claim)
                    self.finished_last = recorded and not self.anything_pending()
                elif self.anything_pending():
                    time.sleep(POLL_S)
                elif not queue_next_look(self.spec, self.storage):
                    return
            except Exception as e:  # the storage's disk filled up between trials, or as one was recorded
                if not no_space(e):
                    raise
                self.stop_for_space(e, claim)

    @property
    def stop_code(self) -> int:
        """The exit code of a worker that stopped early: 128 + the stop signal's number, or a full disk's."""
        if signals.received():
            return signals.exit_code(signals.received())
        return STORAGE_FULL_EXIT if self.storage_full else NO_SPACE_EXIT

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
                claimed = self.storage.set_trial_state_values(compat.trial_id(frozen), TrialState.RUNNING)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            if claimed:
                try:
                    # A trial queued again keeps its old heartbeat, stale at once: beat before anyone looks.
                    self.storage.record_heartbeat(compat.trial_id(frozen))
                except Exception:
                    # Without a heartbeat no worker would ever find it stale and run it again.
                    self.storage.set_trial_state_values(compat.trial_id(frozen), TrialState.WAITING)
                    raise
                return Claim(
                    study, optuna.Trial(study, compat.trial_id(frozen)), phase, variant, trial_seed(frozen)
                )
        return None

    def run_claimed(self, claim: Claim) -> bool:
        """Runs the claimed trial and records its outcome; False when another worker finished it meanwhile.
        Then this worker was paused past the heartbeat's grace (SIGSTOP, a frozen machine), the next worker
        to look failed the trial and queued a copy under a new number, with a folder of its own, and every
        write of this worker's result was refused: one line says so, and the result is left to the copy."""
        try:
            self.run_and_record(claim)
        except Exception:
            if not self.retried_elsewhere(claim):
                raise
            print(f"{claim.phase} trial {claim.trial.number} was retried elsewhere while this worker was "
                  "paused (its heartbeat went stale); its result here is discarded", flush=True)  # fmt: skip
            free_device_memory()
            return False
        return True

    def retried_elsewhere(self, claim: Claim) -> bool:
        """Whether the heartbeat failed the trial this worker runs and queued a copy of it: the trial is
        finished in the storage and a trial's retry history names it. Finished without a copy (its retries
        used up, or finished by this worker itself before an error) is not: that error stays the worker's."""
        if not self.storage.get_trial(compat.trial_id(claim.trial)).state.is_finished():
            return False
        number = claim.trial.number
        trials = claim.study.get_trials(deepcopy=False)
        return any(number in t.system_attrs.get("retry_history", ()) for t in trials)

    def run_and_record(self, claim: Claim) -> None:
        trial, study = claim.trial, claim.study
        start = time.monotonic()

        def say(outcome: str) -> None:
            where = trial.user_attrs.get("grid_point", claim.variant)
            print(f"{claim.phase} trial {trial.number} {where}: {outcome} ({time.monotonic() - start:.0f} s)",
                  flush=True)  # fmt: skip

        try:
            with heartbeat(self.storage, compat.trial_id(trial)):
                value = self.objective(claim)
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            say("pruned")
        except (Preempted, KeyboardInterrupt, SystemExit) as stop:
            # SIGTERM / SIGINT (or Lightning's SystemExit for them mid-validation): the trial waits again
            # and resumes from its latest checkpoint, on this machine or another.
            self.queue_again(trial)
            step = f"at step {stop.step}" if isinstance(stop, Preempted) else "from its last checkpoint"
            name = signals.received().name if signals.received() else type(stop).__name__
            self.stopped = f"{name}: {claim.phase} trial {trial.number} checkpointed and queued again {step}"
            say(f"queued again ({name})")
        except Exception as e:
            if not no_space(e):
                self.fail(claim, e)
                say(f"FAILED, {type(e).__name__}: {e}"[:300])
                return
            self.stop_for_space(e, claim)
            say("stopped (disk full)")
        else:
            study.tell(trial, value)
            say(f"{self.metric_name(claim)} = {value:.4g}")

    def stop_for_space(self, e: BaseException, claim: Claim | None) -> None:
        """Every later trial would fail the same way: the claimed one waits, as it was, for space to be freed."""
        self.storage_full = storage_full(e)
        where = (
            f"for the storage {masked_url(self.storage.url)}" if self.storage_full else f"under {self.root}"
        )
        self.stopped = f"no space left on device {where}"
        if claim is None:
            return
        try:
            self.queue_again(claim.trial)
            self.stopped += f"; trial {claim.trial.number} queued again"
        except Exception as again:
            if not no_space(again):
                raise
            # Not even its state could be written: its heartbeat goes stale, and a worker retries it.
            self.stopped += f"; trial {claim.trial.number} is retried once space is freed"

    def fail(self, claim: Claim, e: Exception) -> None:
        trial = claim.trial
        trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
        trial.set_user_attr("traceback", traceback.format_exc()[-4000:])
        claim.study.tell(trial, state=TrialState.FAIL)
        free_device_memory()

    def metric_name(self, claim: Claim) -> str:
        return tune_metric(self.spec).name if claim.phase == TUNE else self.spec.metric.name

    def queue_again(self, trial: optuna.Trial) -> None:
        """RUNNING -> WAITING: the same trial is claimed again, keeping its number, folder and checkpoint."""
        self.storage.set_trial_state_values(compat.trial_id(trial), TrialState.WAITING)

    def objective(self, claim: Claim) -> float:
        spec, trial, variant = self.spec, claim.trial, claim.variant
        overrides = self.variants[variant]
        callbacks: list[L.Callback] = []
        if claim.phase == TUNE:
            assert spec.tune is not None
            seed = spec.seed_pool[0]
            extra = {key: suggest(trial, key, space) for key, space in spec.tune.params.items()}
            callbacks.append(StepPruning(trial, monitor=self.metric_name(claim)))
            name = f"{variant}-seed{seed}-tune{trial.number}"
        else:
            # The stored fixed param makes this return the queued variant, recorded as a trial param.
            variant = trial.suggest_categorical("variant", list(self.variants))
            seed = claim.seed
            callbacks.append(ReportValidation(trial, validation_metric(spec.metric).name))
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
        tags = tracking.run_tags(overrides)
        from ablate.harness.trial import run_trial

        # Preempted, or the copy of a trial whose worker died (it inherits the user attrs): resume.
        resumed = trial.user_attrs.get(RESUME_ATTR)
        resume_from = fetch(self.store, resumed, out_dir / CHECKPOINTS) if resumed else None
        stored = StoredCheckpoints(self.store, trial)
        try:
            with tracking.wandb_logger(
                self.wandb_mode, self.root, group=spec.name, name=name, job_type=claim.phase, tags=tags,
                config=cfg.flat(),
            ) as logger:  # fmt: skip
                result = run_trial(
                    cfg, out_dir=out_dir, loggers=[logger] if logger else None, callbacks=callbacks,
                    resume_from=resume_from, publish=stored.publish,
                )  # fmt: skip
        except BaseException as failure:
            # A pruned trial is final, so its resume state is waste; a failed one keeps what it wrote, for a
            # post-mortem or a retry. A trial retried elsewhere keeps nothing of this copy: its retry resumes
            # from the stored checkpoints, which must stay. Either way its own error stays the reason.
            try:
                if not self.retried_elsewhere(claim):
                    if isinstance(failure, optuna.TrialPruned) and not cfg.train.keep_checkpoints:
                        (out_dir / CHECKPOINTS / RESUME_CHECKPOINT).unlink(missing_ok=True)
                        stored.discard(resumed, trial.user_attrs.get(RESUME_ATTR))
                    self.store_artifacts(trial, out_dir)
            except Exception as e:
                failure.add_note(f"Its artifacts could not be stored either: {type(e).__name__}: {e}")
            raise
        self.store_artifacts(trial, out_dir)
        if not cfg.train.keep_checkpoints:
            stored.discard(resumed, trial.user_attrs.get(RESUME_ATTR))
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("params", result.params)
        trial.set_user_attr("wall_time", result.wall_time)
        trial.set_user_attr("resumed_from_step", result.resumed_from_step)
        trial.set_user_attr("split_sizes", result.split_sizes)
        if result.signatures:  # how BLEU / chrF were computed, for the report
            trial.set_user_attr("signatures", result.signatures)
        metric = self.metric_name(claim)
        value = result.metrics.get(metric)
        if value is None or not math.isfinite(value):
            raise TrialFailed(f"metric {metric} is {value!r}")
        return value

    def store_artifacts(self, trial: optuna.Trial, out_dir: Path) -> None:
        if out_dir.is_dir():
            trial.set_user_attr("artifacts", upload_trial_files(trial, out_dir, self.store))


def no_space(e: BaseException) -> bool:
    """The disk filled up: an OSError ENOSPC, torch.save's RuntimeError for a write that failed, or the
    storage's disk (storage_full), anywhere in the exception's chain."""
    return storage_full(e) or any(
        (isinstance(c, OSError) and c.errno == errno.ENOSPC) or "file write failed" in str(c)
        for c in chain(e)
    )


def free_device_memory() -> None:
    """After a failed trial (CUDA out of memory among others), return its cached blocks to the device."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_worker(
    spec: StudySpec,
    storage,
    runs_root: str | Path = "runs",
    wandb_mode="offline",
    artifacts: str | None = None,
) -> Worker:
    """Runs queued trials of a prepared study (see study.prepare_study) until none is left, or until a stop
    signal or a full disk (worker.stopped says which)."""
    signals.install()
    worker = Worker(spec, storage, runs_root, wandb_mode, artifacts)
    worker.run()
    return worker

