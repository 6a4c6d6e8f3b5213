"""Study files: YAML -> validated StudySpec -> named variants x seeds.

A study either crosses `factors` (a full grid: every combination is a variant) or lists named `variants`
(each a set of dotted overrides, e.g. comparing families that share no factor). Every variant's config is
built and validated before anything runs. Pydantic only: reading a study needs no Optuna.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from ablate.models.config import PRESETS
from ablate.schema.config import ExperimentConfig, TrainConfig, build_config
from ablate.schema.errors import ConfigError
from ablate.schema.metric_registry import metric_info
from ablate.schema.names import checked_name, slugify

Value = str | int | float | bool  # a config key's value: its range is the config's
# Seeds: what numpy's and torch's seeding accept; at most MAX_SEEDS of them, a grid a machine can queue.
Seed = Annotated[int, Field(ge=0, lt=2**32, strict=True)]
MAX_SEEDS = 10**5
MAX_TUNE_SEEDS = 1000  # seeds a tune candidate trains


class MetricSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "test/seq_acc"
    direction: Literal["maximize", "minimize"] = "maximize"


class ClaimSource(BaseModel):
    """Where the literature states a claim: the paper, where in it (table, figure or section) and what it
    reports there, with its numbers where it gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    paper: str
    where: str
    reports: str


class ClaimVersus(BaseModel):
    """The second difference of an interaction claim: the claim's compare - to again, measured on another
    metric or within another sub-grid; either defaults to the claim's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    metric: str | None = None
    within: dict[str, Value] | None = None


class ClaimControl(BaseModel):
    """A `similar` or `not_worse` claim's positive control: two sides designed to differ by more than its
    margin; where they do not, the metric could not tell the claim's sides apart either (analysis.claims)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    compare: dict[str, Value]
    to: dict[str, Value]


# The expects that hold where the metric cannot move, so they need a positive control and can never fail
# where the margin spans the metric's whole range (analysis.claims, harness.study.validate).
AGREEMENT = ("similar", "not_worse")


class ClaimSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str
    # A test of a paper's finding, or a check of a mechanism that holds by construction (kept as a guard on
    # the code); the report counts and shows them apart.
    kind: Literal["test", "check"] = "test"
    compare: dict[str, Value]
    to: dict[str, Value]
    metric: str | None = None
    within: dict[str, Value] = Field(default_factory=dict)  # both sides within this sub-grid
    versus: ClaimVersus | None = None  # an interaction: (compare - to) minus (compare - to) on versus
    # not_worse: non-inferiority, compare at most the margin worse than to in the metric's direction.
    expect: Literal["lower", "higher", "similar", "not_worse"]
    margin: float = Field(0.0, allow_inf_nan=False)  # its reach on the metric: validate.py
    # the metric's value for a model that learned nothing of the task, within the metric's range (validate.py)
    chance: float | None = Field(None, allow_inf_nan=False)
    control: ClaimControl | None = None  # a `similar` or `not_worse` claim's positive control
    source: ClaimSource | None = None
    confounds: str = ""  # what the study cannot separate from the claimed factor
    # What of the claim (its expect, margin, sides, control or chance) was set or changed after a run of this
    # study had been seen, when and why; the report marks such a claim and counts its verdict apart.
    revised: str = ""

    @model_validator(mode="after")
    def _versus(self) -> ClaimSpec:
        v = self.versus
        if v is not None and v.metric in (None, self.metric) and v.within in (None, self.within):
            raise ValueError("versus: give another metric or another within (both differences are the same)")
        return self

    @model_validator(mode="after")
    def _control(self) -> ClaimSpec:
        # Only agreement can hold because the metric does not move; a reproduced difference shows it moves.
        if self.control is not None and self.expect not in AGREEMENT:
            raise ValueError(f"control: only a similar or not_worse claim takes one (expect is {self.expect})")
        if self.control is not None and self.versus is not None:
            raise ValueError("control: a positive control is one difference; an interaction takes none")
        return self

    def arms(self, study_metric: str) -> list[tuple[str, dict[str, Value]]]:
        """(metric, sub-grid) of the claim's difference, then of its `versus` difference for an interaction."""
        first = (self.metric or study_metric, self.within)
        if self.versus is None:
            return [first]
        return [first, (self.versus.metric or first[0], self.versus.within or self.within)]


@dataclass(frozen=True)
class TuneKind:
    """One way to tune a key: how queue.suggest samples it through an Optuna trial, and what its list holds
    (validate.tuned_key_problem checks it)."""

    sample: Callable[[Any, str, list[Value]], Value]  # (trial, key, the list) -> the value
    bounds: bool = True  # [low, high]; False: the values to choose from
    integer: bool = False  # integer bounds, for keys that take integers
    positive: bool = False  # bounds above 0 (a log scale)


# The names tune.params accepts: {train.lr: {log_uniform: [1e-4, 3e-3]}}, {train.warmup_steps: {int: [0, 500]}},
# {x: {choice: [...]}}.
TUNE_KINDS = {
    "log_uniform": TuneKind(
        lambda trial, key, args: trial.suggest_float(key, *args, log=True), positive=True
    ),
    "uniform": TuneKind(lambda trial, key, args: trial.suggest_float(key, *args)),
    "int": TuneKind(lambda trial, key, args: trial.suggest_int(key, *args), integer=True),
    "choice": TuneKind(lambda trial, key, args: trial.suggest_categorical(key, args), bounds=False),
}
# The names tune.pruner accepts: each builds its pruner (queue.tune_pruner) from optuna.pruners and the
# trials' train settings, over training steps (validations report at global steps).
PRUNERS: dict[str, Callable[[ModuleType, TrainConfig], Any]] = {
    "hyperband": lambda pruners, train: pruners.HyperbandPruner(
        min_resource=train.val_every, max_resource=max(train.max_steps, train.val_every)
    ),
    "median": lambda pruners, train: pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=train.val_every),
    "none": lambda pruners, train: pruners.NopPruner(),
}


class TuneSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Literals of the registries' keys, so that pydantic's error names every accepted one.
    params: dict[str, dict[Literal[tuple(TUNE_KINDS)], list[Value]]]  # type: ignore[valid-type]
    trials: int = Field(8, ge=1, le=10**6, strict=True)
    pruner: Literal[tuple(PRUNERS)] = "hyperband"  # type: ignore[valid-type]
    metric: MetricSpec | None = None  # default: the study metric measured on the validation split
    # Seeds each candidate trains, scored on their mean: a count (the seeds after the eval seed pool) or the
    # seeds themselves, none an eval seed. Unset: the first eval seed alone.
    seeds: (
        Annotated[int, Field(ge=1, le=MAX_TUNE_SEEDS, strict=True)]
        | Annotated[list[Seed], Field(max_length=MAX_TUNE_SEEDS)]
        | None
    ) = None
    # Which variants tune: each its own parameters, or the baseline alone, whose best parameters every
    # variant then trains with (chosen blind to how the other arms do).
    arm: Literal["each", "baseline"] = "each"
    # Why one arm's parameters serve every arm (arm: baseline, which a study must say): a rate chosen on the
    # baseline favours it in every claim against it; the report prints this beside the runs.
    why: str = ""


class HeartbeatSpec(BaseModel):
    """How a dead worker is noticed: a running trial beats every `interval` seconds; one silent for `grace`
    seconds is failed and queued again. Stored with the study, so every worker uses the same periods."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    interval: int = Field(15, ge=1, le=86400)
    grace: int = Field(60, ge=1, le=86400)

    @model_validator(mode="after")
    def _grace(self) -> HeartbeatSpec:
        if self.grace <= self.interval:
            raise ValueError(f"grace: must exceed interval={self.interval} (got {self.grace})")
        return self


class AdaptiveSeeds(BaseModel):
    """`seeds: {min: 3, max: 10}`: every variant runs seeds 0 .. min - 1; after each look the variants of
    claims still open get `step` more, up to max (seeds 0 .. max - 1). `start: 100` shifts the seeds to
    100 .. 100 + max - 1: a replication on fresh seeds. See analysis.claims for the looks."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min: int = Field(ge=2, le=MAX_SEEDS, strict=True)  # a claim needs two seeds a side
    max: int = Field(ge=2, le=MAX_SEEDS, strict=True)
    step: int = Field(1, ge=1, le=MAX_SEEDS, strict=True)
    start: int = Field(0, ge=0, lt=2**32, strict=True)  # the last seed, start + max - 1, is checked below it too

    @model_validator(mode="after")
    def _max(self) -> AdaptiveSeeds:
        if self.max < self.min:
            raise ValueError(f"max: must be at least min={self.min} (got {self.max})")
        return self


# A mapping is a seed range, anything else a list: errors then speak of the form the user wrote. The tags
# are not identifiers, so error locations leave them out ('seeds.min: ...').
SeedsField = Annotated[
    Annotated[list[Seed], Field(max_length=MAX_SEEDS), Tag("seed-list")]
    | Annotated[AdaptiveSeeds, Tag("seed-range")],
    Discriminator(lambda v: "seed-range" if isinstance(v, dict | AdaptiveSeeds) else "seed-list"),
]


class JudgeFrom(BaseModel):
    """The level the baseline and every variant a claim compares must reach before the claim is judged: below
    it a model has not learned the task enough for a verdict on the claimed factor (a translation model at a
    few BLEU). Fixed before the run, as margins are; a profile may set its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    metric: str  # e.g. test/bleu
    # the baseline's mean must reach it (at least, or at most where lower is better); within the metric's
    # range (validate.py)
    value: float = Field(allow_inf_nan=False)
    why: str = ""  # one line for the report: what a model below it cannot do
    revised: str = ""  # set or changed after a run of this study had been seen: when and why


class StudySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    factors: dict[str, list[Value]] = Field(default_factory=dict)
    variants: dict[str, dict[str, Value]] = Field(default_factory=dict)
    fixed: dict[str, Value] = Field(default_factory=dict)
    seeds: SeedsField = Field(default_factory=lambda: [0])
    tune: TuneSpec | None = None
    metric: MetricSpec = MetricSpec()
    baseline: dict[str, Value] | str | None = None
    claims: list[ClaimSpec] = Field(default_factory=list)
    judge_from: JudgeFrom | None = None  # a claim is judged only once its variants and the baseline reach this
    budget: dict[str, Value] = Field(default_factory=dict)  # train.* limits applied to every trial
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    profile: str | None = None  # the profile of the study file this spec was built with

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return checked_name(v)

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, v: dict[str, dict[str, Value]]) -> dict[str, dict[str, Value]]:
        for name in v:
            try:
                checked_name(name)
            except ValueError as e:
                raise ValueError(f"variant {name[:40]!r}: {e}") from None
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int] | AdaptiveSeeds) -> list[int] | AdaptiveSeeds:
        if isinstance(v, AdaptiveSeeds):
            return v
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
        """The study's folder name under runs/ (names.slugify): distinct names get distinct folders."""
        return slugify(self.name)

    @property
    def adaptive(self) -> AdaptiveSeeds | None:
        return self.seeds if isinstance(self.seeds, AdaptiveSeeds) else None

    @property
    def seed_pool(self) -> list[int]:
        """Every seed a variant may run, in the order they run: the listed seeds, or a range's max seeds
        from its start."""
        if isinstance(self.seeds, AdaptiveSeeds):
            return list(range(self.seeds.start, self.seeds.start + self.seeds.max))
        return list(self.seeds)

    @property
    def tune_seeds(self) -> list[int]:
        """The seeds each tune trial trains: `tune.seeds` (a count: the seeds after the eval seed pool), else
        the first eval seed."""
        assert self.tune is not None
        seeds = self.tune.seeds
        if seeds is None:
            return self.seed_pool[:1]
        if isinstance(seeds, int):
            after = max(self.seed_pool) + 1
            return list(range(after, after + seeds))
        return list(seeds)

    def tuned_from(self, variant: str) -> str:
        """The variant whose tune trials choose `variant`'s tuned parameters (`tune.arm`)."""
        assert self.tune is not None
        if self.tune.arm == "baseline":
            baseline = self.baseline_variant()
            assert baseline is not None  # validate.tune_problems refuses tune.arm: baseline without one
            return baseline
        return variant

    @property
    def tuned_variants(self) -> list[str]:
        """The variants that have tune trials, in grid order."""
        if self.tune is None:
            return []
        return list(dict.fromkeys(self.tuned_from(v) for v in self.variant_overrides()))

    @property
    def seed_looks(self) -> list[int]:
        """Seeds each variant has at each look: one look at all listed seeds, or min, min + step, ..., max."""
        if isinstance(self.seeds, AdaptiveSeeds):
            return [*range(self.seeds.min, self.seeds.max, self.seeds.step), self.seeds.max]
        return [len(self.seeds)]

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


def short_name(key: str) -> str:
    """'model.pos_encoding' -> 'pos_encoding': a config key without its section, for names and labels."""
    return key.rsplit(".", 1)[-1]


def variant_name(overrides: dict[str, Value]) -> str:
    """'model.pos_encoding=none,model.norm=pre' -> 'pos_encoding=none,norm=pre'."""
    return ",".join(f"{short_name(k)}={v}" for k, v in overrides.items()) or "base"


def variant_settings(spec: StudySpec) -> dict[str, dict[str, Value]]:
    """Variant -> its overrides plus the `model.*` keys its preset (or the base's) sets, overrides winning:
    what a claim's selector matches, so `model.arch: lstm` selects the variants of `preset: lstm-bahdanau`."""
    base_preset = spec.base.get("preset")
    settings = {}
    for name, overrides in spec.variant_overrides().items():
        preset = overrides.get("preset", base_preset)
        implied = {f"model.{k}": v for k, v in PRESETS.get(str(preset), {}).items()}
        settings[name] = {**implied, **overrides}
    return settings


def apply_profile(tree: dict[str, Any], profile: str | None, where: str) -> dict[str, Any]:
    """Study files size their runs per machine in `profiles` (e.g. `cpu`, `gpu`; the first is the default). A
    profile's keys are config keys (added to `fixed`) or study keys: `seeds`, `factors.<key>`, `variants` and
    `judge_from` (replacing the file's; null: none), and `claims` (added: findings only its scale can test).
    A profile other than the default runs as its own study, `<name>-<profile>`."""
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
        if key in ("seeds", "variants", "judge_from"):
            tree[key] = value
        elif key == "claims":
            tree["claims"] = [*(tree.get("claims") or []), *(value or [])]
        elif key.startswith("factors."):
            factors[key.removeprefix("factors.")] = value
        else:
            tree["fixed"][key] = value
    if factors:
        tree["factors"] = factors
    if profile != next(iter(profiles)):
        tree["name"] = f"{tree.get('name')}-{profile}"
    return tree


def bundled_studies_dir() -> Path:
    """The ablations/ folder shipped with the package (also the checkout's own)."""
    from ablate import ablations

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


def tune_metric(spec: StudySpec) -> MetricSpec:
    """What tuning optimizes: `tune.metric`, else the study metric on the validation split (tuning must not
    see the test sets)."""
    assert spec.tune is not None
    return spec.tune.metric if spec.tune.metric is not None else validation_metric(spec.metric)


def validation_metric(metric: MetricSpec) -> MetricSpec:
    """The metric on the validation split, where every trial reports it as it trains; for metrics only
    computed on test splits (BLEU), the validation loss."""
    info = metric_info(metric.name)
    if info.every_split:
        return MetricSpec(name=f"val/{info.name}", direction=metric.direction)
    return MetricSpec(name="val/loss", direction="minimize")
