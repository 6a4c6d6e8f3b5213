"""Workers: claim a queued trial, run it, store its result and artifacts, until none is left.

A worker runs the tune trials first (each tuned variant's own TPE study, pruned through
optuna-integration's Lightning callback; every variant, or the baseline alone with `tune.arm: baseline`),
then the eval grid: an eval trial of a variant is claimed only once the tuning that chooses its parameters
is finished, and runs with that tuning's best parameters. Any number of workers, local or
on other machines, may join the same storage; harness/launchers start them (`local.py` on this machine).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import math
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
    check_run_folder,
    study_dir,
    trial_dir,
    upload_trial_files,
)
from ablate.harness.callbacks import ReportValidation, StepPruning, TrialFailed, report_step
from ablate.harness.chatter import quiet_experimental
from ablate.harness.checkpoints import (
    FUSED_STATE,
    RESUME_ATTR,
    Preempted,
    StoredCheckpoints,
    fetch,
    resume_kind,
    resume_point,
)
from ablate.harness.fused import Member, run_fused
from ablate.harness.grouping import FUSE_AT_MOST, wants_fusion, why_not_fused
from ablate.harness.launchers.commands import NO_SPACE_EXIT, STORAGE_FULL_EXIT
from ablate.harness.study.looks import queue_next_look
from ablate.harness.study.queue import best_tuned_params, load_phase_study, suggest, tune_sampler
from ablate.harness.study.storage import chain, masked_url, storage_full
from ablate.schema.config import ExperimentConfig
from ablate.schema.names import slugify
from ablate.schema.spec import StudySpec, tune_metric, validation_metric
from ablate.schema.trials import EVAL, TUNE, grid_point, trial_seed, trial_variant

POLL_S = 2.0  # how often a worker with nothing claimable looks again while tuning finishes elsewhere


@dataclasses.dataclass
class Claim:
    study: optuna.Study
    trial: optuna.Trial
    phase: str
    variant: str
    seed: int | None = None  # eval trials: the queued grid point's
    fused: bool = False  # trains in a fused group (Worker.claim decides, once)


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


@contextmanager
def heartbeats(storage, trial_ids: list[int]) -> Iterator[None]:
    """Each trial's heartbeat, for a fused group's K trials at once."""
    with ExitStack() as stack:
        for trial_id in trial_ids:
            stack.enter_context(heartbeat(storage, trial_id))
        yield


@dataclasses.dataclass
class Job:
    """A claimed trial made ready to run: its config, folder, W&B run, and the checkpoint it resumes from."""

    claim: Claim
    cfg: ExperimentConfig
    out_dir: Path
    name: str
    tags: list[str]
    resumed: dict | None
    resume_from: Path | None
    stored: StoredCheckpoints
    callbacks: list[L.Callback]


class Worker:
    """One process's share of a study: claims, runs and records trials until none is left to claim."""

    def __init__(
        self, spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode="offline",
        artifacts: str | None = None,
    ):  # fmt: skip
        self.spec, self.storage, self.wandb_mode = spec, storage, wandb_mode
        self.variants = spec.variant_overrides()
        check_run_folder(spec.slug, runs_root)
        self.root = study_dir(spec.slug, runs_root)
        self.store = artifact_store(spec.slug, runs_root, artifacts)
        self.eval = load_phase_study(spec, storage, EVAL)
        self.tune = {v: load_phase_study(spec, storage, TUNE, v) for v in spec.tuned_variants}
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
            claims: list[Claim] = []
            try:
                claims = self.claim()
                if claims:
                    recorded = self.run_claimed(claims)
                    self.finished_last = recorded and not self.anything_pending()
                elif self.anything_pending():
                    time.sleep(POLL_S)
                elif not queue_next_look(self.spec, self.storage):
                    return
            except Exception as e:  # the storage's disk filled up between trials, or as one was recorded
                if not no_space(e):
                    raise
                self.stop_for_space(e, claims)

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
        """Whether the tune trials that choose `variant`'s parameters are all done (none when not tuned)."""
        if not self.tune:
            return True
        pending = (TrialState.WAITING, TrialState.RUNNING)
        return not self.tune[self.spec.tuned_from(variant)].get_trials(deepcopy=False, states=pending)

    def claim(self) -> list[Claim]:
        """Atomically takes the next WAITING trial that can run now: tune trials first, then eval trials of
        tuned variants; with it, the variant's other waiting seeds that train fused with it (`fuses`)."""
        for study in self.studies():
            # A worker that died mid-trial left it RUNNING; failing it queues its retry (heartbeat).
            with quiet_experimental():
                optuna.storages.fail_stale_trials(study)
        for study in self.tune.values():
            claim = self._claim_from(study, TUNE)
            if claim:
                return [claim]
        claim = self._claim_from(self.eval, EVAL)
        if claim is None:
            return []
        claim.fused = self.fuses(claim)
        group = [claim]
        while claim.fused and len(group) < FUSE_AT_MOST:
            more = self._claim_from(self.eval, EVAL, joining=claim)
            if more is None:
                break
            more.fused = True
            group.append(more)
        return group

    def fuses(self, claim: Claim) -> bool:
        """Whether an eval trial trains fused: its resume checkpoint is a fused seed's, or it starts afresh
        and its variant's train.fuse_seeds asks for fusion here and allows it."""
        if claim.phase != EVAL:
            return False
        kind = resume_kind(claim.trial.user_attrs)
        if kind is not None:
            return kind == FUSED_STATE
        cfg = self.spec.config_for(self.variants[claim.variant], claim.seed)
        return wants_fusion(cfg, torch.cuda.is_available()) and why_not_fused([cfg]) is None

    def _claim_from(self, study: optuna.Study, phase: str, joining: Claim | None = None) -> Claim | None:
        """The first claimable WAITING trial of `study`; with `joining`, one that trains fused with that
        claim: its variant's, resuming from a fused seed's checkpoint of the same step or starting afresh as
        it does."""
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            variant = trial_variant(frozen)
            if phase == EVAL and not self.tuning_finished(variant):
                continue
            if joining is not None and (
                variant != joining.variant or resume_point(frozen.user_attrs) != resume_point(joining.trial.user_attrs)
            ):
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

    def run_claimed(self, claims: list[Claim]) -> bool:
        """Runs the claimed trials and records their outcomes; False when another worker finished them
        meanwhile. Then this worker was paused past the heartbeat's grace (SIGSTOP, a frozen machine), the
        next worker to look failed its trials (queuing a copy of each under a new number, with a folder of its
        own, while retries are left) and every write of this worker's result was refused: one line each says
        so, and the result is left to the copy (or to nobody, once the retries are used up)."""
        try:
            self.run_and_record(claims)
        except Exception:
            reasons = [self.finished_elsewhere(claim) for claim in claims]
            if not all(reasons):
                raise
            for claim, reason in zip(claims, reasons):
                print(f"{claim.phase} trial {claim.trial.number} {reason}; its result here is discarded", flush=True)
            free_device_memory()
            return False
        return True

    def finished_elsewhere(self, claim: Claim) -> str | None:
        """How the heartbeat finished the trial this worker runs, if it did: failed and queued as a copy whose
        retry history names it, or failed for good without this worker's reason (its retries used up).
        Finished by this worker itself before an error is not: that error stays the worker's."""
        frozen = self.storage.get_trial(compat.trial_id(claim.trial))
        if not frozen.state.is_finished():
            return None
        number = claim.trial.number
        if any(number in t.system_attrs.get("retry_history", ()) for t in claim.study.get_trials(deepcopy=False)):
            return "was retried elsewhere while this worker was paused (its heartbeat went stale)"
        if frozen.state == TrialState.FAIL and "fail_reason" not in frozen.user_attrs:
            return "was failed by the heartbeat while this worker was paused, with no retries left"
        return None

    def run_and_record(self, claims: list[Claim]) -> None:
        """Runs one trial, or a fused group of eval trials, and records each outcome in the storage."""
        start = time.monotonic()

        def say(claim: Claim, outcome: str) -> None:
            where = claim.trial.user_attrs.get("grid_point", claim.variant)
            print(f"{claim.phase} trial {claim.trial.number} {where}: {outcome} "
                  f"({time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip

        try:
            with heartbeats(self.storage, [compat.trial_id(claim.trial) for claim in claims]):
                outcomes = self.objective(claims)
        except optuna.TrialPruned:
            (claim,) = claims  # only tune trials are pruned, and they run alone
            claim.study.tell(claim.trial, state=TrialState.PRUNED)
            say(claim, "pruned")
            return
        except (Preempted, KeyboardInterrupt, SystemExit) as stop:
            # SIGTERM / SIGINT (or Lightning's SystemExit for them mid-validation): the trials wait again
            # and resume from their latest checkpoints, on this machine or another.
            for claim in claims:
                self.queue_again(claim.trial)
            step = f"at step {stop.step}" if isinstance(stop, Preempted) else "from its last checkpoint"
            name = signals.received().name if signals.received() else type(stop).__name__
            numbers = ", ".join(str(claim.trial.number) for claim in claims)
            self.stopped = f"{name}: {claims[0].phase} trial {numbers} checkpointed and queued again {step}"
            for claim in claims:
                say(claim, f"queued again ({name})")
            return
        except Exception as e:
            if no_space(e):
                self.stop_for_space(e, claims)
                for claim in claims:
                    say(claim, "stopped (disk full)")
                return
            outcomes = [e] * len(claims)
        for claim, outcome in zip(claims, outcomes):
            if isinstance(outcome, BaseException):
                self.fail(claim, outcome)
                say(claim, f"FAILED, {type(outcome).__name__}: {outcome}"[:300])
            else:
                claim.study.tell(claim.trial, outcome)
                say(claim, f"{self.metric_name(claim)} = {outcome:.4g}")

    def stop_for_space(self, e: BaseException, claims: list[Claim]) -> None:
        """Every later trial would fail the same way: the claimed ones wait, as they were, for space to be
        freed."""
        self.storage_full = storage_full(e)
        where = (
            f"for the storage {masked_url(self.storage.url)}" if self.storage_full else f"under {self.root}"
        )
        self.stopped = f"no space left on device {where}"
        for claim in claims:
            try:
                self.queue_again(claim.trial)
                self.stopped += f"; trial {claim.trial.number} queued again"
            except Exception as again:
                if not no_space(again):
                    raise
                # Not even its state could be written: its heartbeat goes stale, and a worker retries it.
                self.stopped += f"; trial {claim.trial.number} is retried once space is freed"

    def fail(self, claim: Claim, e: BaseException) -> None:
        trial = claim.trial
        trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
        trial.set_user_attr("traceback", "".join(traceback.format_exception(e))[-4000:])
        claim.study.tell(trial, state=TrialState.FAIL)
        free_device_memory()

    def metric_name(self, claim: Claim) -> str:
        return tune_metric(self.spec).name if claim.phase == TUNE else self.spec.metric.name

    def queue_again(self, trial: optuna.Trial) -> None:
        """RUNNING -> WAITING: the same trial is claimed again, keeping its number, folder and checkpoint."""
        self.storage.set_trial_state_values(compat.trial_id(trial), TrialState.WAITING)

    def objective(self, claims: list[Claim]) -> list[float | BaseException]:
        """Each claimed trial's objective value, or the exception its trial alone failed with (a fused seed
        that diverged); an exception of the whole run (pruned, preempted, a fault) is raised."""
        from ablate.harness.trial import run_trial

        jobs = [self.job(claim) for claim in claims]
        if claims[0].phase == TUNE and len(self.spec.tune_seeds) > 1:
            return [self.tune_on_seeds(jobs[0])]
        if not claims[0].fused:
            (job,) = jobs
            try:
                with self.wandb_logger(job) as logger:
                    result = run_trial(
                        job.cfg, out_dir=job.out_dir, loggers=[logger] if logger else None,
                        callbacks=job.callbacks, resume_from=job.resume_from, publish=job.stored.publish,
                    )  # fmt: skip
            except BaseException as failure:
                self.keep_what_failed(job, failure)
                raise
            return [self.record(job, result)]
        members = []
        for job in jobs:
            job.stored.kind = FUSED_STATE
            logger = functools.partial(self.wandb_logger, job)
            members.append(Member(job.cfg, job.out_dir, job.resume_from, job.stored.publish, self.reporter(job), logger))
        try:
            outcomes = run_fused(members)
        except BaseException as failure:
            for job in jobs:
                self.keep_what_failed(job, failure)
            raise
        values: list[float | BaseException] = []
        for job, outcome in zip(jobs, outcomes):
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                values.append(self.record(job, outcome))
            except Exception as failure:
                self.keep_what_failed(job, failure)
                values.append(failure)
        return values

    def tune_on_seeds(self, job: Job) -> float:
        """A tune candidate scored on the mean of its tune.seeds, trained as one model, each seed in a folder of
        its own: every validation reports the seeds' mean of the tune metric to the pruner, and the value is
        the mean of their final ones. A seed that fails fails the candidate."""
        trial, metric = job.claim.trial, self.metric_name(job.claim)

        def prune(step: int, rows: list[dict[str, float]]) -> None:
            values = [row[metric] for row in rows if metric in row]
            if values:
                report_step(trial, sum(values) / len(values), step, prune=True)

        seeds = self.spec.tune_seeds
        jobs = [dataclasses.replace(job, cfg=job.cfg.model_copy(update={"seed": seed}), out_dir=job.out_dir / f"seed-{seed}",
                                    name=f"{job.claim.variant}-seed{seed}-tune{trial.number}")
                for seed in seeds]  # fmt: skip
        members = [Member(j.cfg, j.out_dir, logger=functools.partial(self.wandb_logger, j)) for j in jobs]
        try:
            outcomes = run_fused(members, on_validation=prune)
            failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failure is not None:
                raise failure
        except BaseException as failure:
            self.keep_what_failed(job, failure)
            raise
        trial.set_user_attr("seed_values", {str(s): o.metrics.get(metric, math.nan) for s, o in zip(seeds, outcomes)})
        names = set.intersection(*(set(o.metrics) for o in outcomes))
        # The candidate's record is the group's (its wall time, sizes, signatures) with the seeds' mean metrics.
        mean = {name: sum(o.metrics[name] for o in outcomes) / len(outcomes) for name in sorted(names)}
        return self.record(job, dataclasses.replace(outcomes[0], metrics=mean))

    def reporter(self, job: Job):
        """A fused seed's validation rows, reported to its trial as ReportValidation reports a trial's."""
        monitor = validation_metric(self.spec.metric).name

        def report(row: dict[str, float]) -> None:
            if monitor in row:
                report_step(job.claim.trial, row[monitor], int(row["step"]))

        return report

    def wandb_logger(self, job: Job):
        return tracking.wandb_logger(
            self.wandb_mode, self.root, group=self.spec.name, name=job.name, job_type=job.claim.phase,
            tags=job.tags, config=job.cfg.flat(),
        )  # fmt: skip

    def job(self, claim: Claim) -> Job:
        """Sets a claimed trial up: its parameters (tuned, or the variant's best), user attrs and folder, and
        the checkpoint it resumes from."""
        spec, trial, variant = self.spec, claim.trial, claim.variant
        overrides = self.variants[variant]
        callbacks: list[L.Callback] = []
        if claim.phase == TUNE:
            assert spec.tune is not None
            seed = spec.tune_seeds[0]
            claim.study.sampler = tune_sampler(spec, variant, trial.number)
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
                extra, best_number = best_tuned_params(spec, self.storage, spec.tuned_from(variant))
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
        # Preempted, or the copy of a trial whose worker died (it inherits the user attrs): resume.
        resumed = trial.user_attrs.get(RESUME_ATTR)
        resume_from = fetch(self.store, resumed, out_dir / CHECKPOINTS) if resumed else None
        stored = StoredCheckpoints(self.store, trial)
        return Job(claim, cfg, out_dir, name, tracking.run_tags(overrides), resumed, resume_from, stored, callbacks)

    def keep_what_failed(self, job: Job, failure: BaseException) -> None:
        """A pruned trial is final, so its resume state is waste; a failed one keeps what it wrote, for a
        post-mortem or a retry. A trial retried elsewhere keeps nothing of this copy: its retry resumes from
        the stored checkpoints, which must stay. Either way its own error stays the reason."""
        trial = job.claim.trial
        try:
            if not self.finished_elsewhere(job.claim):
                if isinstance(failure, optuna.TrialPruned) and not job.cfg.train.keep_checkpoints:
                    (job.out_dir / CHECKPOINTS / RESUME_CHECKPOINT).unlink(missing_ok=True)
                    job.stored.discard(job.resumed, trial.user_attrs.get(RESUME_ATTR))
                self.store_artifacts(trial, job.out_dir)
        except Exception as e:
            failure.add_note(f"Its artifacts could not be stored either: {type(e).__name__}: {e}")

    def record(self, job: Job, result) -> float:
        """Stores a finished trial's artifacts and results (a harness.trial.TrialResult); its objective
        value."""
        trial, cfg = job.claim.trial, job.cfg
        self.store_artifacts(trial, job.out_dir)
        if not cfg.train.keep_checkpoints:
            job.stored.discard(job.resumed, trial.user_attrs.get(RESUME_ATTR))
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("params", result.params)
        trial.set_user_attr("wall_time", result.wall_time)
        trial.set_user_attr("resumed_from_step", result.resumed_from_step)
        trial.set_user_attr("split_sizes", result.split_sizes)
        if result.signatures:  # how BLEU / chrF were computed, for the report
            trial.set_user_attr("signatures", result.signatures)
        metric = self.metric_name(job.claim)
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

