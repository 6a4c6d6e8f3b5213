"""Study files: YAML -> validated StudySpec -> named variants x seeds -> an Optuna grid.

A study either crosses `factors` (a full grid: every combination is a variant) or lists named `variants`
(each a set of dotted overrides, e.g. comparing families that share no factor). Every variant's config is
built and validated before anything runs.
"""

from __future__ import annotations

import itertools
import re
import time
import warnings
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.config import ConfigError, ExperimentConfig, build_config, format_validation_error, read_yaml

Value = str | int | float | bool


class MetricSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "test/seq_acc"
    direction: Literal["maximize", "minimize"] = "maximize"


class ClaimSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str
    compare: dict[str, Value]
    to: dict[str, Value]
    metric: str | None = None
    expect: Literal["lower", "higher", "similar"]
    margin: float = 0.0


class TuneSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # {train.lr: {log_uniform: [1e-4, 3e-3]}}, {train.warmup_steps: {int: [0, 500]}}, {x: {choice: [...]}}
    params: dict[str, dict[Literal["log_uniform", "uniform", "int", "choice"], list[Value]]]
    trials: int = 8
    pruner: Literal["hyperband", "median", "none"] = "hyperband"
    metric: MetricSpec | None = None  # default: the study metric measured on the validation split


class HeartbeatSpec(BaseModel):
    """How a dead worker is noticed: a running trial records a heartbeat every `interval` seconds; one whose
    last heartbeat is older than `grace` seconds is failed and queued again. Stored with the study, so every
    worker, wherever it runs, uses the same periods."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    interval: int = Field(15, ge=1)
    grace: int = Field(60, ge=1)

    @model_validator(mode="after")
    def _grace(self) -> HeartbeatSpec:
        if self.grace <= self.interval:
            raise ValueError(f"grace: must exceed interval={self.interval} (got {self.grace})")
        return self


class StudySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    factors: dict[str, list[Value]] = Field(default_factory=dict)
    variants: dict[str, dict[str, Value]] = Field(default_factory=dict)
    fixed: dict[str, Value] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0])
    tune: TuneSpec | None = None
    metric: MetricSpec = MetricSpec()
    baseline: dict[str, Value] | str | None = None
    claims: list[ClaimSpec] = Field(default_factory=list)
    budget: dict[str, Value] = Field(default_factory=dict)  # train.* limits applied to every trial
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    profile: str | None = None  # the profile of the study file this spec was built with

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must list at least one seed")
        if len(set(v)) != len(v):
            raise ValueError(f"must not repeat a seed (got {v})")
        return v

    @model_validator(mode="after")
    def _grid(self) -> StudySpec:
        if self.factors and self.variants:
            raise ValueError("factors: give either factors (a grid) or variants (named), not both")
        return self

    @property
    def slug(self) -> str:
        """The study's folder name under runs/: safe on every filesystem, whatever the name holds."""
        return slugify(self.name)

    def variant_overrides(self) -> dict[str, dict[str, Value]]:
        """Variant name -> its dotted overrides, in grid order."""
        if self.variants:
            return {name: dict(o) for name, o in self.variants.items()}
        if not self.factors:
            return {"base": {}}
        keys = list(self.factors)
        out = {}
        for values in itertools.product(*self.factors.values()):
            overrides = dict(zip(keys, values))
            out[variant_name(overrides)] = overrides
        return out

    def config_for(
        self, overrides: dict[str, Value], seed: int, extra: dict[str, Any] | None = None
    ) -> ExperimentConfig:
        """The full config of one trial: base, then budget and fixed keys, the variant, tuned params, seed."""
        return build_config(
            self.base, {**self.budget, **self.fixed, **overrides, **(extra or {}), "seed": seed}
        )

    def baseline_variant(self) -> str | None:
        """The name of the variant the report compares against."""
        variants = self.variant_overrides()
        if self.baseline is None:
            return next(iter(variants))
        if isinstance(self.baseline, str):
            return self.baseline
        for name, overrides in variants.items():
            if all(overrides.get(k) == v for k, v in self.baseline.items()):
                return name
        return None


def slugify(name: str) -> str:
    """A folder name safe on every filesystem, whatever the name holds."""
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", name).strip("._") or "study"


def variant_name(overrides: dict[str, Value]) -> str:
    """'model.pos_encoding=none,model.norm=pre' -> 'pos_encoding=none,norm=pre'."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()) or "base"


def apply_profile(tree: dict[str, Any], profile: str | None, where: str) -> dict[str, Any]:
    """Study files size their runs per machine in `profiles` (e.g. `cpu` and `gpu`); the first listed is the
    default. A profile's keys are config keys (added to `fixed`) or study keys: `seeds`, `factors.<key>`.
    Any other profile than the default runs as its own study, `<name>-<profile>`."""
    profiles = tree.pop("profiles", None) or {}
    if not isinstance(profiles, dict):
        raise ConfigError(f"{where}: profiles: expected a mapping of profile names to overrides")
    if profile is None:
        if not profiles:
            return tree
        profile = next(iter(profiles))
    if profile not in profiles:
        raise ConfigError(
            f"{where}: profiles: no profile {profile!r} (the file has: {', '.join(profiles) or 'none'})"
        )
    tree = {**tree, "fixed": dict(tree.get("fixed") or {}), "profile": profile}
    factors = dict(tree.get("factors") or {})
    for key, value in (profiles[profile] or {}).items():
        if key == "seeds":
            tree["seeds"] = value
        elif key.startswith("factors."):
            factors[key.removeprefix("factors.")] = value
        else:
            tree["fixed"][key] = value
    if factors:
        tree["factors"] = factors
    if profile != next(iter(profiles)):
        tree["name"] = f"{tree.get('name')}-{profile}"
    return tree


def load_study(path: str | Path, profile: str | None = None) -> StudySpec:
    """Reads and validates a study file (with one of its profiles), including every variant's config;
    ConfigError otherwise."""
    path = resolve_study_path(path)
    tree = apply_profile(read_yaml(path), profile, str(path))
    try:
        spec = StudySpec.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
    validate_spec(spec, str(path))
    return spec


def validate_spec(spec: StudySpec, where: str) -> None:
    """Checks every key and builds every variant's config once, so a bad study fails before anything runs."""
    known = {*ExperimentConfig().flat(), "preset"}

    def check_keys(section: str, keys) -> None:
        for key in keys:
            if key not in known:
                raise ConfigError(f"{where}: {section}.{key}: unknown config key")

    for key, values in spec.factors.items():
        check_keys("factors", [key])
        if not values:
            raise ConfigError(f"{where}: factors.{key}: empty list of values (the grid would be empty)")
    for name, overrides in spec.variants.items():
        check_keys(f"variants.{name}", overrides)
    check_keys("fixed", spec.fixed)
    check_keys("budget", spec.budget)
    variants = spec.variant_overrides()
    for name, overrides in variants.items():
        try:
            spec.config_for(overrides, spec.seeds[0])
        except ConfigError as e:
            raise ConfigError(f"{where}: variant {name!r}: {e}") from None
    if spec.tune:
        validate_tune(spec, spec.tune, where)
    if isinstance(spec.baseline, dict) and spec.baseline_variant() is None:
        raise ConfigError(f"{where}: baseline: no variant matches {spec.baseline}")
    if isinstance(spec.baseline, str) and spec.baseline not in variants:
        raise ConfigError(f"{where}: baseline: unknown variant {spec.baseline!r}")


def bundled_studies_dir() -> Path:
    """The ablations/ folder shipped with the package (also the checkout's own)."""
    import ablations

    return Path(next(iter(ablations.__path__)))


def resolve_study_path(path: str | Path) -> Path:
    """A path as given, or the name of a bundled study ('quickstart' -> ablations/quickstart.yaml)."""
    p = Path(path)
    if p.is_file():
        return p
    bundled = bundled_studies_dir() / f"{p.stem}.yaml"
    if p.parent == Path(".") and bundled.is_file():
        return bundled
    raise ConfigError(f"{path}: no such study file")


def validate_tune(spec: StudySpec, tune: TuneSpec, where: str) -> None:
    """Each tuned key is a config key outside the factors, with one well-formed range whose ends (or
    choices) make valid configs."""
    first = next(iter(spec.variant_overrides().values()))
    varied = {k for overrides in spec.variant_overrides().values() for k in overrides}
    if not tune.params:
        raise ConfigError(f"{where}: tune.params: name at least one config key to tune")
    if tune.trials < 1:
        raise ConfigError(f"{where}: tune.trials: must be a positive integer (got {tune.trials})")
    for key, space in tune.params.items():
        at = f"{where}: tune.params.{key}"
        if key not in ExperimentConfig().flat():
            raise ConfigError(f"{at}: unknown config key")
        if key in varied:
            raise ConfigError(f"{at}: is a factor of the study; a variant cannot both fix and tune it")
        if len(space) != 1:
            raise ConfigError(f"{at}: give exactly one of log_uniform, uniform, int, choice")
        ((kind, args),) = space.items()
        if kind == "choice" and not args:
            raise ConfigError(f"{at}: choice: empty list of values")
        if kind != "choice":
            numeric = all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
            if len(args) != 2 or not numeric or not args[0] < args[1]:
                raise ConfigError(f"{at}: {kind}: expected [low, high] with low < high (got {args})")
            if kind == "int" and not all(isinstance(a, int) for a in args):
                raise ConfigError(f"{at}: int: bounds must be integers (got {args})")
            if kind == "log_uniform" and args[0] <= 0:
                raise ConfigError(f"{at}: log_uniform: bounds must be positive (got {args})")
        for value in args:
            try:
                spec.config_for(first, spec.seeds[0], {key: value})
            except ConfigError as e:
                raise ConfigError(f"{at}: {value!r} makes an invalid config ({e})") from None


def suggest(trial, key: str, space: dict[str, list[Value]]) -> Value:
    """Samples one tuned key from its `tune.params` range through the trial's sampler."""
    ((kind, args),) = space.items()
    if kind == "choice":
        return trial.suggest_categorical(key, args)
    if kind == "int":
        return trial.suggest_int(key, *args)
    return trial.suggest_float(key, *args, log=kind == "log_uniform")


def tune_metric(spec: StudySpec) -> MetricSpec:
    """What tuning optimizes: `tune.metric`, else the study metric on the validation split (tuning must not
    see the test sets); for metrics only computed on test splits (BLEU), the validation loss."""
    assert spec.tune is not None
    if spec.tune.metric is not None:
        return spec.tune.metric
    name = spec.metric.name.rsplit("/", 1)[-1]
    if name in VALIDATION_METRICS:
        return MetricSpec(name=f"val/{name}", direction=spec.metric.direction)
    return MetricSpec(name="val/loss", direction="minimize")


VALIDATION_METRICS = ("loss", "ppl", "seq_acc", "tok_acc")  # what Seq2SeqModule logs at each validation


# Optuna side --------------------------------------------------------------------------------------------
#
# One Optuna study per phase and variant: `<name>:eval` holds the grid (variant x seed), `<name>:tune:<variant>`
# the tuning trials of one variant. Every trial that must run is enqueued up front as a WAITING trial, once, by
# the process that created the eval study; workers claim WAITING trials (the storage's WAITING -> RUNNING
# transition is atomic) and stop when none is left, so each grid point runs exactly once however many join.

EVAL, TUNE = "eval", "tune"
CONNECT_TIMEOUT_S = 10  # an unreachable database server is reported, not waited on
SCHEMA_ATTEMPTS = 10
MAX_RETRIES = 3  # a grid point whose worker keeps dying (killed, out of host memory) is given up after this


def study_dir(spec_or_slug: StudySpec | str, runs_root: str | Path = "runs") -> Path:
    slug = spec_or_slug.slug if isinstance(spec_or_slug, StudySpec) else spec_or_slug
    return Path(runs_root) / slug


def default_storage_url(spec: StudySpec, runs_root: str | Path = "runs") -> str:
    return f"sqlite:///{(study_dir(spec, runs_root) / 'study.db').resolve()}"


def open_storage(url: str, create_dir: bool = True, heartbeat: HeartbeatSpec = HeartbeatSpec()):
    """An RDBStorage with a heartbeat: the RUNNING trial of a killed worker is failed once its heartbeat is
    `heartbeat.grace` seconds old, and re-queued as a WAITING copy (RetryHeartbeatStaleTrialCallback)."""
    import optuna
    from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError

    sqlite = url.startswith("sqlite:///")
    if sqlite:
        db = Path(url.removeprefix("sqlite:///"))
        if create_dir:
            db.parent.mkdir(parents=True, exist_ok=True)
        elif not db.is_file():
            raise ConfigError(f"storage {url}: no such database")
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():  # the heartbeat is flagged experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": connect_args(url)},
                    heartbeat_interval=heartbeat.interval, grace_period=heartbeat.grace,
                    heartbeat_stale_trial_callback=retry_callback(MAX_RETRIES),
                )  # fmt: skip
            break
        except (OperationalError, IntegrityError, ProgrammingError, ArgumentError, ModuleNotFoundError) as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            # Workers that open a new database at the same moment all create Optuna's tables; the losers
            # hit a table, type or version row another just made. Opening again finds the schema there.
            lost_race = isinstance(e, IntegrityError | ProgrammingError) or "already exists" in reason
            if not lost_race or attempt == SCHEMA_ATTEMPTS - 1:
                raise ConfigError(f"storage {url}: cannot open ({reason})") from None
            time.sleep(0.2 * (attempt + 1))
    if sqlite:
        serialize_sqlite_transactions(storage.engine)
    return storage


def connect_args(url: str) -> dict[str, Any]:
    """Driver options: SQLite waits for the write lock (several local workers share the file); network
    databases give up connecting after CONNECT_TIMEOUT_S."""
    if url.startswith("sqlite"):
        return {"timeout": 60}
    if url.startswith(("postgresql", "mysql")):
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def retry_callback(max_retry: int | None):
    """Queues a WAITING copy of a failed trial (same params and attrs); the copy's system attr
    'retry_history' lists the trials it replaces."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def serialize_sqlite_transactions(engine) -> None:
    """Makes Optuna's read-then-write transactions atomic across processes on SQLite.

    Claiming a WAITING trial reads its state and writes RUNNING in one transaction. PostgreSQL and MySQL lock
    the row (SELECT ... FOR UPDATE); SQLite ignores FOR UPDATE and pysqlite only begins the transaction at
    the first write, so two workers could both read WAITING and both claim the trial. BEGIN IMMEDIATE takes
    the database's write lock when the transaction starts (others wait up to the busy timeout). WAL lets
    readers that hold no transaction proceed meanwhile."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not issue its own deferred BEGIN
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA busy_timeout=60000")

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while Optuna created its tables predate the listeners


def optuna_study_name(spec: StudySpec, phase: str = EVAL, variant: str | None = None) -> str:
    return f"{spec.name}:{phase}" if variant is None else f"{spec.name}:{phase}:{variant}"


def grid_point(variant: str, seed: int) -> str:
    """The identity of one eval trial: retries of a grid point share it (user attr 'grid_point')."""
    return f"{variant}/seed={seed}"


def tune_sampler(spec: StudySpec, variant: str):
    """TPE, seeded per variant; the constant liar keeps concurrent workers from sampling the same point."""
    import optuna

    assert spec.tune is not None
    startup = max(2, min(10, spec.tune.trials // 3))
    return optuna.samplers.TPESampler(
        n_startup_trials=startup, multivariate=True, constant_liar=True,
        seed=zlib.crc32(f"{spec.name}:{variant}".encode()),
    )  # fmt: skip


def tune_pruner(spec: StudySpec):
    """Hyperband over training steps (validations report at global steps), the median rule, or none."""
    import optuna

    assert spec.tune is not None
    train = spec.config_for(next(iter(spec.variant_overrides().values())), spec.seeds[0]).train
    if spec.tune.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=train.val_every, max_resource=max(train.max_steps, train.val_every)
        )
    if spec.tune.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=train.val_every)
    return optuna.pruners.NopPruner()


def load_phase_study(spec: StudySpec, storage, phase: str, variant: str | None = None):
    import optuna

    if phase == EVAL:
        return optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    return optuna.load_study(
        study_name=optuna_study_name(spec, TUNE, variant), storage=storage,
        sampler=tune_sampler(spec, variant), pruner=tune_pruner(spec),
    )  # fmt: skip


def prepare_study(spec: StudySpec, storage, wait_s: float = 30.0) -> StudySpec:
    """Creates the study's Optuna studies and queues every trial once; returns the spec to run.

    The process whose create_study succeeds (study names are unique in the storage) queues the trials and
    then marks the eval study 'queued'; any other process waits for that mark. The spec stored with the
    study is the one every worker runs, so all of them run the same configs."""
    import optuna

    name = optuna_study_name(spec)
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction=spec.metric.direction)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
        deadline = time.monotonic() + wait_s
        while "queued" not in study.user_attrs and time.monotonic() < deadline:
            time.sleep(0.5)
        if "queued" not in study.user_attrs:
            # Its creator died while queuing: queue what is missing (those it queued are kept).
            _queue_trials(spec, storage, study)
        return StudySpec.model_validate(study.user_attrs["spec"])
    # The spec travels with the storage, so `ablate report` and joining workers need nothing else.
    study.set_user_attr("spec", spec.model_dump(mode="json"))
    _queue_trials(spec, storage, study)
    return spec


def _queue_trials(spec: StudySpec, storage, eval_study) -> None:
    import optuna

    if "spec" not in eval_study.user_attrs:
        eval_study.set_user_attr("spec", spec.model_dump(mode="json"))
    variants = spec.variant_overrides()
    if spec.tune:
        direction = tune_metric(spec).direction
        for variant in variants:
            tune = optuna.create_study(
                study_name=optuna_study_name(spec, TUNE, variant), storage=storage, direction=direction,
                load_if_exists=True,
            )  # fmt: skip
            # Empty WAITING trials: each claimed one gets its parameters from TPE when it starts.
            for _ in range(spec.tune.trials - len(tune.get_trials(deepcopy=False))):
                tune.enqueue_trial({}, user_attrs={"variant": variant, "phase": TUNE})
    queued = {t.user_attrs.get("grid_point") for t in eval_study.get_trials(deepcopy=False)}
    for variant, overrides in variants.items():
        for seed in spec.seeds:
            point = grid_point(variant, seed)
            if point not in queued:
                eval_study.enqueue_trial(
                    {"variant": variant, "seed": seed},
                    user_attrs={"grid_point": point, "phase": EVAL, "factors": overrides},
                )
    eval_study.set_user_attr("queued", len(variants) * len(spec.seeds))


def trial_variant(trial) -> str | None:
    """A trial's variant, whether it has started (params) or still waits (its fixed params, its attrs)."""
    return (
        trial.params.get("variant")
        or trial.system_attrs.get("fixed_params", {}).get("variant")
        or trial.user_attrs.get("variant")
    )


def best_tuned_params(spec: StudySpec, storage, variant: str) -> tuple[dict[str, Value], int]:
    """The tuned keys of a variant's best complete tune trial and that trial's number; ConfigError when none
    of its tune trials completed."""
    study = load_phase_study(spec, storage, TUNE, variant)
    try:
        best = study.best_trial
    except ValueError:
        raise ConfigError(f"tune: no trial of variant {variant!r} completed") from None
    return dict(best.params), best.number


def load_spec_from_storage(storage, name: str) -> StudySpec:
    import optuna

    study = optuna.load_study(study_name=f"{name}:{EVAL}", storage=storage)
    return StudySpec.model_validate(study.user_attrs["spec"])


def stored_study_names(storage) -> list[str]:
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    return [n.removesuffix(f":{EVAL}") for n in names if n.endswith(f":{EVAL}")]


# Artifacts ------------------------------------------------------------------------------------------------


def artifact_store(spec_or_slug: StudySpec | str, runs_root: str | Path = "runs"):
    """Per-trial files (metrics and history, per-length results, attention samples, checkpoints) live in
    an Optuna FileSystemArtifactStore next to the study; trials record them in the storage."""
    from optuna.artifacts import FileSystemArtifactStore

    path = study_dir(spec_or_slug, runs_root) / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)


def upload_trial_files(trial, folder: Path, store) -> dict[str, str]:
    """Uploads every file under `folder`; returns {path relative to folder: artifact id}, which the trial
    keeps as its 'artifacts' user attr (Optuna's own record keeps only the file's base name)."""
    from optuna.artifacts import upload_artifact

    ids = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        ids[path.relative_to(folder).as_posix()] = upload_artifact(
            artifact_store=store, file_path=str(path), study_or_trial=trial
        )
    return ids


def download_trial_files(trial, store, dest: str | Path) -> Path:
    """Restores a finished trial's files (as they were in its folder) under `dest`."""
    from optuna.artifacts import download_artifact

    dest = Path(dest)
    for rel, artifact_id in trial.user_attrs.get("artifacts", {}).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        download_artifact(artifact_store=store, file_path=str(target), artifact_id=artifact_id)
    return dest


# Progress ---------------------------------------------------------------------------------------------------


@dataclass
class VariantProgress:
    """One variant's trials by state, counting each retried trial once (its latest copy)."""

    variant: str
    tune_total: int = 0
    tune_done: int = 0  # complete, pruned or failed for good
    total: int = 0  # eval grid points: seeds
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
    import optuna
    from optuna.trial import TrialState

    rows = {v: VariantProgress(v, total=len(spec.seeds)) for v in spec.variant_overrides()}
    studies = [(EVAL, load_phase_study(spec, storage, EVAL))]
    if spec.tune:
        studies += [(TUNE, optuna.load_study(study_name=optuna_study_name(spec, TUNE, v), storage=storage))
                    for v in rows]  # fmt: skip
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
            row.done += t.state == TrialState.COMPLETE
            row.running += t.state == TrialState.RUNNING
            row.failed += t.state == TrialState.FAIL
            row.pruned += t.state == TrialState.PRUNED
    return list(rows.values())


def time_left_s(rows: list[VariantProgress], workers: int) -> float | None:
    """Remaining trials x the mean duration of finished ones, shared by `workers`; None before any finished."""
    durations = [s for r in rows for s in r.finished_s]
    if not durations:
        return None
    return sum(r.remaining for r in rows) * (sum(durations) / len(durations)) / max(1, workers)
