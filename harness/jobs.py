"""The trials a worker takes (harness/workers.py): which waiting trials it claims next (`Picker`: tune trials
first, an eval trial once its tuning is done, with the waiting seeds that train fused with it), and each one
made ready to run, then recorded (`Job`: parameters, user attrs, folder, resume checkpoint, W&B run; the
result's attrs and files, or what a failed run leaves for a post-mortem)."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from pathlib import Path

import optuna
import torch
from optuna.trial import TrialState

from ablate.harness import compat, provenance, tracking
from ablate.harness.artifacts import CHECKPOINTS, RESUME_CHECKPOINT, trial_dir, upload_trial_files
from ablate.harness.callbacks import ReportValidation
from ablate.harness.checkpoints import (
    FUSED_STATE,
    RESUME_ATTR,
    StoredCheckpoints,
    fetch,
    resume_point,
)
from ablate.harness.grouping import FUSE_AT_MOST, why_alone
from ablate.harness.rules import TrialFailed
from ablate.harness.study.leases import Leases
from ablate.harness.study.queue import best_tuned_params, load_phase_study, suggest, tune_sampler
from ablate.schema.config import ExperimentConfig
from ablate.schema.names import slugify
from ablate.schema.spec import StudySpec, tune_metric, validation_metric
from ablate.schema.trials import EVAL, TUNE, grid_point, trial_seed, trial_variant

PENDING = (TrialState.WAITING, TrialState.RUNNING)


@dataclasses.dataclass
class Claim:
    study: optuna.Study
    trial: optuna.Trial
    phase: str
    variant: str
    seed: int | None = None  # eval trials: the queued grid point's
    fused: bool = False  # trains in a fused group (Picker.claim decides, once)
    alone: str = ""  # an eval trial not fused: why

    @property
    def trial_id(self) -> int:
        return compat.trial_id(self.trial)


class Picker:
    """Which waiting trials of a study a worker claims next, through its Leases."""

    def __init__(self, spec: StudySpec, storage, leases: Leases):
        self.spec, self.leases = spec, leases
        self.variants = spec.variant_overrides()
        self.eval = load_phase_study(spec, storage, EVAL)
        self.tune = {v: load_phase_study(spec, storage, TUNE, v) for v in spec.tuned_variants}

    def studies(self) -> list[optuna.Study]:
        return [*self.tune.values(), self.eval]

    def anything_pending(self) -> bool:
        return any(s.get_trials(deepcopy=False, states=PENDING) for s in self.studies())

    def tuning_finished(self, variant: str) -> bool:
        """Whether the tune trials that choose `variant`'s parameters are all done (none when not tuned)."""
        tuning = self.tune.get(self.spec.tuned_from(variant)) if self.tune else None
        return tuning is None or not tuning.get_trials(deepcopy=False, states=PENDING)

    def claim(self) -> list[Claim]:
        """Atomically takes the next WAITING trial that can run now: tune trials first, then eval trials of
        tuned variants; with it, the variant's other waiting seeds that train fused with it (`alone`)."""
        self.leases.fail_stale(self.studies())  # a worker that died mid-trial left it RUNNING
        for study in self.tune.values():
            claim = self.claim_from(study, TUNE)
            if claim:
                return [claim]
        claim = self.claim_from(self.eval, EVAL)
        if claim is None:
            return []
        claim.alone = self.alone(claim) or ""
        claim.fused = not claim.alone
        group = [claim]
        while claim.fused and len(group) < FUSE_AT_MOST:
            more = self.claim_from(self.eval, EVAL, joining=claim)
            if more is None:
                break
            more.fused = True
            group.append(more)
        return group

    def alone(self, claim: Claim) -> str | None:
        """Why an eval trial trains alone, or None where it trains fused: its resume checkpoint is a fused
        seed's, or it starts afresh and its variant's train.fuse_seeds asks for fusion here and allows it."""
        kind, _ = resume_point(claim.trial.user_attrs)
        if kind is not None:
            return None if kind == FUSED_STATE else "it resumes a checkpoint made alone"
        cfg = self.spec.config_for(self.variants[claim.variant], claim.seed)
        return why_alone(cfg, torch.cuda.is_available())

    def claim_from(self, study: optuna.Study, phase: str, joining: Claim | None = None) -> Claim | None:
        """The first claimable WAITING trial of `study`; with `joining`, one that trains fused with that claim
        (its variant's, resuming from a fused seed's checkpoint of the same step, or afresh as it does)."""
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            variant = trial_variant(frozen)
            if phase == EVAL and not self.tuning_finished(variant):
                continue
            if joining is not None and (variant, resume_point(frozen.user_attrs)) != (
                joining.variant, resume_point(joining.trial.user_attrs)
            ):  # fmt: skip
                continue
            if self.leases.claim(frozen):
                trial = optuna.Trial(study, compat.trial_id(frozen))
                return Claim(study, trial, phase, variant, trial_seed(frozen))
        return None


@dataclasses.dataclass
class Job:
    """A claimed trial made ready to run: its config, folder, W&B run, the checkpoint it resumes from, and
    where its files go (`store`) and which metric is its objective value."""

    claim: Claim
    cfg: ExperimentConfig
    out_dir: Path
    name: str
    tags: list[str]
    resumed: dict | None
    resume_from: Path | None
    stored: StoredCheckpoints
    reporter: ReportValidation  # its validations to its trial (pruned on while tuning)
    metric: str

    @classmethod
    def prepare(cls, spec: StudySpec, variants: dict, storage, root: Path, store, claim: Claim) -> Job:
        """Sets a claimed trial up: its parameters (tuned, or the variant's best), user attrs and folder, and
        the checkpoint it resumes from. `variants`: the spec's variant overrides, read once by the Picker."""
        trial, variant = claim.trial, claim.variant
        if claim.phase == TUNE:
            assert spec.tune is not None
            metric, seed = tune_metric(spec).name, spec.tune_seeds[0]
            claim.study.sampler = tune_sampler(spec, variant, trial.number)
            extra = {key: suggest(trial, key, space) for key, space in spec.tune.params.items()}
            reporter = ReportValidation(trial, metric, prune=True)
            name = f"{variant}-seed{seed}-tune{trial.number}"
        else:
            # The stored fixed param makes this return the queued variant, recorded as a trial param.
            variant = trial.suggest_categorical("variant", list(variants))
            metric, seed, extra = spec.metric.name, claim.seed, {}
            reporter = ReportValidation(trial, validation_metric(spec.metric).name)
            if spec.tune:
                extra, best_number = best_tuned_params(spec, storage, spec.tuned_from(variant))
                trial.set_user_attr("tuned", extra)
                trial.set_user_attr("tune_trial", best_number)
            name = f"{variant}-seed{seed}"
        cfg = spec.config_for(variants[variant], seed, extra)
        trial.set_user_attr("factors", variants[variant])
        trial.set_user_attr("config", cfg.flat())
        trial.set_user_attr("grid_point", grid_point(variant, seed))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")  # who ran it, for post-mortems
        trial.set_user_attr("hardware", provenance.hardware())
        trial.set_user_attr("versions", provenance.versions())
        trial.set_user_attr("git_commit", provenance.git_commit())
        out_dir = trial_dir(root, claim.phase, trial.number, slugify(variant) if claim.phase == TUNE else None)
        # Preempted, or the copy of a trial whose worker died (it inherits the user attrs): resume.
        resumed = trial.user_attrs.get(RESUME_ATTR)
        resume_from = fetch(store, resumed, out_dir / CHECKPOINTS) if resumed else None
        if claim.phase == EVAL and "fusion" not in trial.user_attrs:  # a retry keeps the first run's reason
            trial.set_user_attr("fusion", "fused" if claim.fused else f"alone: {claim.alone}")
        stored = StoredCheckpoints(store, trial, FUSED_STATE if claim.fused else None)
        return cls(claim, cfg, out_dir, name, tracking.run_tags(variants[variant]), resumed, resume_from, stored,
                   reporter, metric)  # fmt: skip

    def record(self, result) -> float:
        """Stores a finished trial's artifacts and results (a TrialResult); its objective value."""
        trial = self.claim.trial
        self.store_artifacts()
        # Each attribute named where it is set: tests/test_storage_faults.py reads them here for their shapes.
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("params", result.params)
        trial.set_user_attr("wall_time", result.wall_time)
        trial.set_user_attr("resumed_from_step", result.resumed_from_step)
        trial.set_user_attr("split_sizes", result.split_sizes)
        if result.signatures:  # how BLEU / chrF were computed, for the report
            trial.set_user_attr("signatures", result.signatures)
        value = result.metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            raise TrialFailed(f"metric {self.metric} is {value!r}")
        return value

    def keep(self, failure: BaseException, leases: Leases) -> None:
        """A pruned trial is final, so its resume state is waste; a failed one keeps what it wrote, for a
        post-mortem or a retry. A trial retried elsewhere keeps nothing of this copy: its retry resumes from
        the stored checkpoints, which must stay. Either way its own error stays the reason."""
        try:
            if leases.finished_elsewhere(self.claim.study, self.claim.trial):
                return
            if isinstance(failure, optuna.TrialPruned) and not self.cfg.train.keep_checkpoints:
                (self.out_dir / CHECKPOINTS / RESUME_CHECKPOINT).unlink(missing_ok=True)
                self.discard_resume_state()
            self.store_artifacts()
        except Exception as e:
            failure.add_note(f"Its artifacts could not be stored either: {type(e).__name__}: {e}")

    def discard_resume_state(self) -> None:
        """A finished trial's resume checkpoints are waste, unless train.keep_checkpoints asks for them."""
        if not self.cfg.train.keep_checkpoints:
            self.stored.discard(self.resumed, self.claim.trial.user_attrs.get(RESUME_ATTR))

    def store_artifacts(self) -> None:
        if self.out_dir.is_dir():
            trial = self.claim.trial
            trial.set_user_attr("artifacts", upload_trial_files(trial, self.out_dir, self.stored.store))
