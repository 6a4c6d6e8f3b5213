"""Study files: YAML -> validated StudySpec -> named variants x seeds -> an Optuna grid.

A study either crosses `factors` (a full grid: every combination is a variant) or lists named `variants`
(each a set of dotted overrides, e.g. comparing families that share no factor). Every variant's config is
built and validated before anything runs.
"""

from __future__ import annotations

import itertools
import re
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
        for key, values in self.factors.items():
            if not values:
                raise ValueError(f"factors.{key}: empty list of values")
        if self.factors and self.variants:
            raise ValueError("factors: give either factors (a grid) or variants (named), not both")
        return self

    @property
    def slug(self) -> str:
        """The study's folder name under runs/: safe on every filesystem, whatever the name holds."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name).strip("._") or "study"

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


def variant_name(overrides: dict[str, Value]) -> str:
    """'model.pos_encoding=none,model.norm=pre' -> 'pos_encoding=none,norm=pre'."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()) or "base"


def load_study(path: str | Path) -> StudySpec:
    """Reads and validates a study file, including every variant's config; ConfigError otherwise."""
    path = resolve_study_path(path)
    tree = read_yaml(path)
    try:
        spec = StudySpec.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
    validate_spec(spec, str(path))
    return spec


def validate_spec(spec: StudySpec, where: str) -> None:
    """Builds every variant's config once so a bad factor value fails before any trial starts."""
    variants = spec.variant_overrides()
    for name, overrides in variants.items():
        try:
            spec.config_for(overrides, spec.seeds[0])
        except ConfigError as e:
            raise ConfigError(f"{where}: variant {name!r}: {e}") from None
    if spec.tune:
        known = ExperimentConfig().flat()
        for key in spec.tune.params:
            if key not in known:
                raise ConfigError(f"{where}: tune.params.{key}: unknown config key")
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


# Optuna side --------------------------------------------------------------------------------------------

EVAL = "eval"


def study_dir(spec_or_slug: StudySpec | str, runs_root: str | Path = "runs") -> Path:
    slug = spec_or_slug.slug if isinstance(spec_or_slug, StudySpec) else spec_or_slug
    return Path(runs_root) / slug


def default_storage_url(spec: StudySpec, runs_root: str | Path = "runs") -> str:
    return f"sqlite:///{(study_dir(spec, runs_root) / 'study.db').resolve()}"


def open_storage(url: str, create_dir: bool = True):
    """An RDBStorage with a heartbeat (a killed worker's trial is failed and retried) and, for SQLite,
    WAL and a busy timeout so several local workers share the file."""
    import optuna
    from sqlalchemy.exc import ArgumentError, OperationalError

    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        if create_dir:
            db.parent.mkdir(parents=True, exist_ok=True)
        elif not db.is_file():
            raise ConfigError(f"storage {url}: no such database")
        engine_kwargs = {"connect_args": {"timeout": 60}}
    try:
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=15, grace_period=60,
            failed_trial_callback=optuna.storages.RetryFailedTrialCallback(max_retry=2),
        )  # fmt: skip
    except (OperationalError, ArgumentError, ModuleNotFoundError) as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise ConfigError(f"storage {url}: cannot open ({reason})") from None
    if url.startswith("sqlite"):
        with storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    return storage


def optuna_study_name(spec: StudySpec, phase: str = EVAL) -> str:
    return f"{spec.name}:{phase}"


def create_eval_study(spec: StudySpec, storage):
    """The eval phase: a grid of variant x seed, claimed point by point by however many workers join."""
    import optuna

    variants = list(spec.variant_overrides())
    sampler = optuna.samplers.GridSampler({"variant": variants, "seed": spec.seeds}, seed=0)
    study = optuna.create_study(
        study_name=optuna_study_name(spec), storage=storage, sampler=sampler,
        direction=spec.metric.direction, load_if_exists=True,
    )  # fmt: skip
    # The spec travels with the storage, so `ablate report` needs nothing else.
    study.set_user_attr("spec", spec.model_dump(mode="json"))
    return study


def load_spec_from_storage(storage, name: str) -> StudySpec:
    import optuna

    study = optuna.load_study(study_name=f"{name}:{EVAL}", storage=storage)
    return StudySpec.model_validate(study.user_attrs["spec"])


def stored_study_names(storage) -> list[str]:
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    return [n.removesuffix(f":{EVAL}") for n in names if n.endswith(f":{EVAL}")]
