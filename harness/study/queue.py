"""A study in Optuna, one study per phase and variant: `<name>:eval` holds the grid (variant x seed),
`<name>:tune:<variant>` one variant's tuning trials; and its tuning and progress. Every trial is enqueued up
front as WAITING, once, by the process that created the eval study; workers claim WAITING trials (the
storage's WAITING -> RUNNING is atomic) and stop when none is left, so each grid point runs exactly once
however many join. With adaptive seeds only the first look's seeds are queued up front (then study.looks)."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from ablate.harness.chatter import quiet_experimental
from ablate.harness.study.storage import masked_url
from ablate.schema.config import format_validation_error
from ablate.schema.errors import ConfigError
from ablate.schema.spec import PRUNERS, TUNE_KINDS, StudySpec, Value, tune_metric
from ablate.schema.trials import EVAL, TUNE, grid_point, optuna_study_name, trial_variant


def suggest(trial, key: str, space: dict[str, list[Value]]) -> Value:
    """Samples one tuned key from its `tune.params` range through the trial's sampler."""
    ((kind, args),) = space.items()
    return TUNE_KINDS[kind].sample(trial, key, args)


def tune_sampler(spec: StudySpec, variant: str, number: int = 0):
    """TPE seeded per variant and tune trial (`number`): each worker has its own sampler, so a per-variant
    seed would draw the same random start point in workers claiming at once (the constant liar acts only once
    TPE models the history); seeded by trial number, a study run again draws the same points."""
    assert spec.tune is not None
    startup = max(2, min(10, spec.tune.trials // 3))
    return optuna.samplers.TPESampler(
        n_startup_trials=startup, multivariate=True, constant_liar=True,
        seed=zlib.crc32(f"{spec.name}:{variant}".encode()) + number,
    )  # fmt: skip


def tune_pruner(spec: StudySpec):
    """The pruner `tune.pruner` names (spec.PRUNERS), sized by the first variant's train settings."""
    assert spec.tune is not None
    train = spec.config_for(next(iter(spec.variant_overrides().values())), spec.tune_seeds[0]).train
    return PRUNERS[spec.tune.pruner](optuna.pruners, train)


def load_phase_study(spec: StudySpec, storage, phase: str, variant: str | None = None):
    if phase == EVAL:
        return optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    return optuna.load_study(
        study_name=optuna_study_name(spec, TUNE, variant), storage=storage,
        sampler=tune_sampler(spec, variant), pruner=tune_pruner(spec),
    )  # fmt: skip


def prepare_study(spec: StudySpec, storage, wait_s: float = 30.0) -> StudySpec:
    """Creates the study's Optuna studies and queues every trial once (create_or_wait); returns the spec to
    run. The spec stored with the study is the one every worker runs, so all of them run the same configs."""
    study, created = create_or_wait(storage, optuna_study_name(spec), wait_s, direction=spec.metric.direction)
    if created:
        name_objective(study, spec.metric.name)
        # The spec travels with the storage, so `ablate report` and joining workers need nothing else.
        study.set_user_attr("spec", spec.model_dump(mode="json"))
    if "queued" not in study.user_attrs:
        _queue_trials(spec, storage, study)  # marks it queued
    return spec if created else load_spec_from_storage(storage, spec.name)


def create_or_wait(storage, name: str, wait_s: float, **create: Any) -> tuple[optuna.Study, bool]:
    """The study `name` and whether this process created it. Unique study names make the name a lock: its
    creator does the guarded work, then sets the user attr 'queued'; others wait up to `wait_s` for that
    mark, and if it never comes (the creator died) do what is missing (the work skips what is done)."""
    try:
        return optuna.create_study(study_name=name, storage=storage, **create), True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
    deadline = time.monotonic() + wait_s
    while "queued" not in study.user_attrs and time.monotonic() < deadline:
        time.sleep(0.5)
    return study, False


def _queue_trials(spec: StudySpec, storage, eval_study) -> None:
    if "spec" not in eval_study.user_attrs:
        eval_study.set_user_attr("spec", spec.model_dump(mode="json"))
    variants = spec.variant_overrides()
    if spec.tune:
        direction = tune_metric(spec).direction
        for variant in spec.tuned_variants:
            tune = optuna.create_study(
                study_name=optuna_study_name(spec, TUNE, variant), storage=storage, direction=direction,
                load_if_exists=True,
            )  # fmt: skip
            name_objective(tune, tune_metric(spec).name)
            # Empty WAITING trials: each claimed one gets its parameters from TPE when it starts.
            for _ in range(spec.tune.trials - len(tune.get_trials(deepcopy=False))):
                tune.enqueue_trial({}, user_attrs={"variant": variant, "phase": TUNE})
    first = spec.seed_pool[: spec.seed_looks[0]]
    queue_grid_points(spec, eval_study, {variant: first for variant in variants})
    eval_study.set_user_attr("queued", len(variants) * len(first))


def queue_grid_points(spec: StudySpec, eval_study, seeds: dict[str, list[int]]) -> None:
    """Queues each (variant, seed) given as a WAITING eval trial, skipping the grid points the study holds."""
    queued = {t.user_attrs.get("grid_point") for t in eval_study.get_trials(deepcopy=False)}
    variants = spec.variant_overrides()
    for variant, variant_seeds in seeds.items():
        for seed in variant_seeds:
            point = grid_point(variant, seed)
            if point not in queued:
                # The seed is an attribute, not a parameter: the dashboard ranks parameters by importance.
                eval_study.enqueue_trial(
                    {"variant": variant},
                    user_attrs={"grid_point": point, "phase": EVAL, "factors": variants[variant], "seed": seed},
                )


def name_objective(study: optuna.Study, metric: str) -> None:
    """The objective's name in the dashboard and in Optuna's data frames (not 'Objective 0')."""
    with quiet_experimental():
        study.set_metric_names([metric])


def best_tuned_params(spec: StudySpec, storage, variant: str) -> tuple[dict[str, Value], int]:
    """The tuned keys and number of a variant's best complete tune trial; ConfigError when none completed."""
    study = load_phase_study(spec, storage, TUNE, variant)
    try:
        best = study.best_trial
    except ValueError:
        raise ConfigError(f"tune: no trial of variant {variant!r} completed") from None
    return dict(best.params), best.number


def load_spec_from_storage(storage, name: str) -> StudySpec:
    """The spec stored with study `name`, which its workers and reports run; ConfigError naming the storage
    when there is none, it does not validate (hand-written, another ablate version) or is another study's."""
    study = optuna.load_study(study_name=f"{name}:{EVAL}", storage=storage)
    where = f"storage {masked_url(storage.url)}: study {name!r}"
    if "spec" not in study.user_attrs:
        raise ConfigError(f"{where}: no spec is stored with it (a study ablate did not make?)")
    try:
        spec = StudySpec.model_validate(study.user_attrs["spec"])
    except ValidationError as e:
        raise ConfigError(f"{where}: its stored spec is invalid ({format_validation_error(e)})") from None
    if spec.name != name:
        raise ConfigError(f"{where}: its stored spec is for study {spec.name!r}")
    return spec


def stored_study_names(storage) -> list[str]:
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    return [n.removesuffix(f":{EVAL}") for n in names if n.endswith(f":{EVAL}")]


# Progress ---------------------------------------------------------------------------------------------------


@dataclass
class VariantProgress:
    """One variant's trials by state, counting each retried trial once (its latest copy)."""

    variant: str
    tune_total: int = 0
    tune_done: int = 0  # complete, pruned or failed for good
    total: int = 0  # eval grid points queued: seeds (adaptive seeds add some at each look)
    done: int = 0
    running: int = 0
    failed: int = 0
    pruned: int = 0
    elapsed_s: float = 0.0  # time spent in this variant's trials so far, all phases
    finished_s: list[float] = field(default_factory=list)  # durations of its finished trials

    @property
    def remaining(self) -> int:
        return self.tune_total - self.tune_done + self.total - self.done - self.failed - self.pruned

    @property
    def finished(self) -> bool:
        return self.remaining == 0


def study_progress(spec: StudySpec, storage) -> list[VariantProgress]:
    """Per variant: how far tuning and the eval grid are, from the storage alone."""
    rows = {v: VariantProgress(v) for v in spec.variant_overrides()}
    studies = [(EVAL, load_phase_study(spec, storage, EVAL))]
    if spec.tune:
        studies += [(TUNE, optuna.load_study(study_name=optuna_study_name(spec, TUNE, v), storage=storage))
                    for v in spec.tuned_variants]  # fmt: skip
    now = datetime.now()
    for phase, study in studies:
        trials = study.get_trials(deepcopy=False)
        retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
        for t in trials:
            row = rows.get(trial_variant(t) or "")
            if row is None or t.number in retried:
                continue
            if t.datetime_start is not None:
                seconds = ((t.datetime_complete or now) - t.datetime_start).total_seconds()
                row.elapsed_s += seconds
                if t.state.is_finished():
                    row.finished_s.append(seconds)
            if phase == TUNE:
                row.tune_total += 1
                row.tune_done += t.state.is_finished()
                continue
            row.total += 1
            row.done += t.state == TrialState.COMPLETE
            row.running += t.state == TrialState.RUNNING
            row.failed += t.state == TrialState.FAIL
            row.pruned += t.state == TrialState.PRUNED
    return list(rows.values())


def time_left_s(rows: list[VariantProgress], workers: int) -> float | None:
    """Remaining trials x the mean finished duration, shared by `workers`; None before any finished."""
    durations = [s for r in rows for s in r.finished_s]
    if not durations:
        return None
    return sum(r.remaining for r in rows) * (sum(durations) / len(durations)) / max(1, workers)
