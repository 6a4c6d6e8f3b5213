"""Workers: claim a queued trial, run it, store its result and artifacts, until none is left.

Tune trials run first (each tuned variant's own TPE study, pruned at its validations: callbacks.py
ReportValidation; every variant, or the baseline alone with `tune.arm: baseline`); an eval trial is claimed
only once the tuning that chooses its parameters is finished, and runs with its best parameters. Any number
of workers, here or on other machines (harness/launchers), may join one storage. Which trials a worker takes
and how each is set up and recorded: harness/jobs.py; how it holds them: harness/study/leases.py."""

from __future__ import annotations

import dataclasses
import errno
import functools
import math
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import torch
from optuna.trial import TrialState

from ablate.harness import signals, tracking
from ablate.harness.artifacts import artifact_store, check_run_folder, study_dir
from ablate.harness.callbacks import report_step
from ablate.harness.checkpoints import Preempted
from ablate.harness.fused import Member, run_fused
from ablate.harness.jobs import Claim, Job, Picker
from ablate.harness.launchers.commands import NO_SPACE_EXIT, STORAGE_FULL_EXIT
from ablate.harness.study.leases import Leases
from ablate.harness.study.looks import queue_next_look
from ablate.harness.study.storage import chain, masked_url, storage_full
from ablate.models import plugins
from ablate.schema.spec import StudySpec, tune_metric
from ablate.schema.trials import TUNE

POLL_S = 2.0  # how often a worker with nothing claimable looks again while tuning finishes elsewhere


class Worker:
    """One process's share of a study: claims, runs and records trials until none is left to claim."""

    def __init__(
        self, spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode="offline",
        artifacts: str | None = None,
    ):  # fmt: skip
        self.spec, self.storage, self.wandb_mode = spec, storage, wandb_mode
        check_run_folder(spec.slug, runs_root)
        self.root = study_dir(spec.slug, runs_root)
        self.store = artifact_store(spec.slug, runs_root, artifacts)
        self.leases = Leases(storage)
        self.picker = Picker(spec, storage, self.leases)
        self.finished_last = False
        self.stopped: str | None = None  # why the worker stopped before the study was done (one line)
        self.storage_full = False  # stopped because the storage could not write

    def run(self) -> None:
        """Runs trials until nothing is queued or running and no claim wants more seeds (study.looks); waits
        while eval trials wait for tuning elsewhere and while other workers' trials run (a dead worker's
        is queued again once its heartbeat is stale: somebody must be left to run it). `finished_last`: this
        worker's last trial left nothing pending, so it finished the study. Stops on a signal or full disk."""
        while self.stopped is None:
            if signals.received():
                self.stopped = f"{signals.received().name}: no trial was running; stopped"
                return
            claims: list[Claim] = []
            try:
                claims = self.picker.claim()
                if claims:
                    recorded = self.run_claimed(claims)
                    self.finished_last = recorded and not self.picker.anything_pending()
                elif self.picker.anything_pending():
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

    def run_claimed(self, claims: list[Claim]) -> bool:
        """Runs the claimed trials and records their outcomes; False when another worker finished them
        meanwhile: this one was paused past the heartbeat's grace (SIGSTOP, a frozen machine), the next to
        look failed its trials (queuing copies under new numbers and folders while retries are left) and
        every write of this result was refused. One line each says so; the copy (if any) has the result."""
        try:
            self.run_and_record(claims)
        except Exception:
            reasons = [self.leases.finished_elsewhere(claim.study, claim.trial) for claim in claims]
            if not all(reasons):
                raise
            for claim, reason in zip(claims, reasons):
                print(f"{claim.phase} trial {claim.trial.number} {reason}; its result here is discarded", flush=True)
            free_device_memory()
            return False
        return True

    def run_and_record(self, claims: list[Claim]) -> None:
        """Runs one trial, or a fused group of eval trials, and records each outcome in the storage."""
        start = time.monotonic()

        def say(claim: Claim, outcome: str) -> None:
            where = claim.trial.user_attrs.get("grid_point", claim.variant)
            print(f"{claim.phase} trial {claim.trial.number} {where}: {outcome} "
                  f"({time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip

        try:
            with self.leases.beating([claim.trial_id for claim in claims]):
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
                self.leases.release(claim.trial_id)
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
                metric = tune_metric(self.spec).name if claim.phase == TUNE else self.spec.metric.name
                say(claim, f"{metric} = {outcome:.4g}")

    def stop_for_space(self, e: BaseException, claims: list[Claim]) -> None:
        """Every later trial would fail the same way: the claimed ones wait, as they were, for free space."""
        self.storage_full = storage_full(e)
        where = (
            f"for the storage {masked_url(self.storage.url)}" if self.storage_full else f"under {self.root}"
        )
        self.stopped = f"no space left on device {where}"
        for claim in claims:
            try:
                self.leases.release(claim.trial_id)
                self.stopped += f"; trial {claim.trial.number} queued again"
            except Exception as again:
                if not no_space(again):
                    raise
                # Not even its state could be written: its heartbeat goes stale, and a worker retries it.
                self.stopped += f"; trial {claim.trial.number} is retried once space is freed"

    def fail(self, claim: Claim, e: BaseException) -> None:
        trial = claim.trial
        # A trial that uses plug-ins names them: the fault may be theirs (models/plugins.py).
        plugged = plugins.used(trial.user_attrs.get("config", {}))
        trial.set_user_attr("fail_reason", f"{f'{plugged}: ' if plugged else ''}{type(e).__name__}: {e}"[:2000])
        trial.set_user_attr("traceback", "".join(traceback.format_exception(e))[-4000:])
        claim.study.tell(trial, state=TrialState.FAIL)
        free_device_memory()

    def objective(self, claims: list[Claim]) -> list[float | BaseException]:
        """Each claimed trial's objective value, or the exception its trial alone failed with (a fused seed
        that diverged); an exception of the whole run (pruned, preempted, a fault) is raised. Runs a trial
        alone, fused eval seeds, or a tune candidate's fused tune.seeds scored on their mean."""
        from ablate.harness.trial import run_trial

        jobs = [Job.prepare(self.spec, self.picker.variants, self.storage, self.root, self.store, claim)
                for claim in claims]
        if claims[0].phase == TUNE and len(self.spec.tune_seeds) > 1:
            return [self.tune_on_seeds(jobs[0])]
        with self.keeping(jobs):
            if claims[0].fused:
                # Each eval trial as a fused seed: resumable, reporting its validations as a trial alone does.
                outcomes = run_fused([Member(job.cfg, job.out_dir, job.resume_from, job.stored.publish,
                                             job.reporter.report_row, functools.partial(self.wandb_logger, job))
                                      for job in jobs])  # fmt: skip
            else:
                (job,) = jobs
                with self.wandb_logger(job) as logger:
                    outcomes = [run_trial(job.cfg, out_dir=job.out_dir, loggers=[logger] if logger else None,
                                          callbacks=[job.reporter], resume_from=job.resume_from,
                                          publish=job.stored.publish)]  # fmt: skip
        values = [self.recorded(job, outcome) for job, outcome in zip(jobs, outcomes)]
        # Only once every result is stored: a full disk before then queues the whole group again, to resume.
        for job, value in zip(jobs, values):
            if not isinstance(value, BaseException):
                job.discard_resume_state()
        return values

    def wandb_logger(self, job: Job):
        return tracking.wandb_logger(
            self.wandb_mode, self.root, group=self.spec.name, name=job.name, job_type=job.claim.phase,
            tags=job.tags, config=job.cfg.flat(),
        )  # fmt: skip

    @contextmanager
    def keeping(self, jobs: list[Job]) -> Iterator[None]:
        """A run that fails as a whole keeps what each of its trials wrote before its error goes on."""
        try:
            yield
        except BaseException as failure:
            for job in jobs:
                job.keep(failure, self.leases)
            raise

    def recorded(self, job: Job, outcome) -> float | BaseException:
        """The trial's recorded objective value, or why it has none (its run failed, or its metric)."""
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            return job.record(outcome)
        except Exception as failure:
            if no_space(failure):  # every later write would fail too: the worker stops (run_and_record)
                raise
            job.keep(failure, self.leases)
            return failure

    def tune_on_seeds(self, job: Job) -> float:
        """A tune candidate scored on the mean of its tune.seeds, trained as one model, each seed in its own
        folder: every validation reports the seeds' mean tune metric to the pruner; the value is the mean of
        their final ones. A seed that fails fails the candidate."""
        trial, metric = job.claim.trial, job.metric

        def prune(step: int, rows: list[dict[str, float]]) -> None:
            values = [row[metric] for row in rows if metric in row]
            if values:
                report_step(trial, sum(values) / len(values), step, prune=True)

        seeds = self.spec.tune_seeds
        jobs = [dataclasses.replace(job, cfg=job.cfg.model_copy(update={"seed": seed}), out_dir=job.out_dir / f"seed-{seed}",
                                    name=f"{job.claim.variant}-seed{seed}-tune{trial.number}")
                for seed in seeds]  # fmt: skip
        members = [Member(j.cfg, j.out_dir, logger=functools.partial(self.wandb_logger, j)) for j in jobs]
        with self.keeping([job]):
            outcomes = run_fused(members, on_validation=prune)
            failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failure is not None:
                raise failure
        trial.set_user_attr("seed_values", {str(s): o.metrics.get(metric, math.nan) for s, o in zip(seeds, outcomes)})
        names = set.intersection(*(set(o.metrics) for o in outcomes))
        # The candidate's record is the group's (wall time, sizes, signatures) with the seeds' mean metrics.
        mean = {name: sum(o.metrics[name] for o in outcomes) / len(outcomes) for name in sorted(names)}
        value = job.record(dataclasses.replace(outcomes[0], metrics=mean))
        job.discard_resume_state()
        return value


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
    """Runs queued trials of a prepared study (study.queue.prepare_study) until none is left, or until a
    stop signal or a full disk (worker.stopped says which)."""
    signals.install()
    worker = Worker(spec, storage, runs_root, wandb_mode, artifacts)
    worker.run()
    return worker

