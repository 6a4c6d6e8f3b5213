"""Everything a study can get wrong, found in one pass before anything is created.

Each check adds (YAML location, what is wrong) to one list: every variant's config, the references the study
makes (its metric, each claim's metric and compare / to, the baseline, tuned keys) against what the variants
build and report, the seeds, the grid's size, and what the command line adds (storage URL, --out, --devices,
--workers against the machine, W&B mode). A failing study raises one StudyError listing them all. No Optuna,
no storage, no folder: nothing here writes. `load_study` reads a study file and checks it here.

What this machine must hold to run a study, each local corpus of a `parallel` task and the bible task's SWORD
modules, is read too, as a run needs it before anything is created; `read_data=False` leaves it out, for
checks of the study file alone (its structure, its claims), which then hold where its corpus is not installed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ablate.harness.grouping import why_not_fused
from ablate.harness.tracking import MODES, OLD_MODES
from ablate.schema.config import (
    ExperimentConfig,
    build_config,
    flatten,
    ignored_settings,
    read_yaml,
    validation_problems,
)
from ablate.schema.errors import ConfigError
from ablate.schema.metric_registry import metric_info
from ablate.schema.spec import (
    AGREEMENT,
    TUNE_KINDS,
    AdaptiveSeeds,
    ClaimSpec,
    StudySpec,
    TuneSpec,
    Value,
    apply_profile,
    resolve_study_path,
    variant_settings,
)
from ablate.schema.task_config import TaskConfig
from ablate.schema.tasks import TASKS

if TYPE_CHECKING:
    from ablate.harness.tasks.base import TaskData

Problem = tuple[str, str]  # (where in the study file or command line, what is wrong)
MAX_SHOWN = 20
MAX_TRIALS = 10_000  # a bigger grid needs --allow-large: a typo in a factor list should not queue a million


class StudyError(ConfigError):
    """A study that cannot run: one line per problem (at most MAX_SHOWN)."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        more = [f"... and {len(lines) - MAX_SHOWN} more problems"] if len(lines) > MAX_SHOWN else []
        super().__init__("\n".join(lines[:MAX_SHOWN] + more))


def raise_problems(where: str, problems: list[Problem], also: list[Problem] = ()) -> None:
    """StudyError when there is any problem: those of the file at `where` are prefixed by it, the command
    line's own (`also`) are not."""
    lines = [f"{where}: {loc}: {msg}" if where else f"{loc}: {msg}" for loc, msg in problems]
    lines += [f"{loc}: {msg}" for loc, msg in also]
    if lines:
        raise StudyError(list(dict.fromkeys(lines)))  # a bad fixed key fails every variant the same way


def variant_count(spec: StudySpec) -> int:
    """From the factor list lengths: no grid is enumerated."""
    return len(spec.variants) if spec.variants else math.prod(len(v) for v in spec.factors.values())


def seed_count(spec: StudySpec) -> int:
    """The most seeds a variant runs (adaptive seeds: their max), without listing them."""
    return spec.seeds.max if isinstance(spec.seeds, AdaptiveSeeds) else len(spec.seeds)


def trial_count(spec: StudySpec) -> int:
    """Variants x seeds (at most), plus the tune trials."""
    tune_trials = len(spec.tuned_variants) * spec.tune.trials if spec.tune else 0
    return variant_count(spec) * seed_count(spec) + tune_trials


def study_problems(
    spec: StudySpec, set_keys: Iterable[str] = (), max_trials: int | None = None, read_data: bool = True
) -> list[Problem]:
    """Every problem of a parsed study; `set_keys` are the fixed keys that came from --set; `read_data`: its
    local corpora are read too (data_problems)."""
    problems = key_problems(spec)
    count = trial_count(spec)
    if max_trials is not None and count > max_trials:
        where = "factors" if spec.factors else "variants"
        return [*problems, (where, f"{count:,} trials (variants x seeds) exceed {max_trials:,}; "
                                   "pass --allow-large to run them")]  # fmt: skip
    if count == 0:
        return problems
    problems += factor_duplicates(spec)
    problems += seed_problems(spec)
    configs, config_errors = variant_configs(spec, set_keys)
    problems += config_errors
    if config_errors:
        return problems  # references and data need every variant's config
    problems += ignored_key_problems(spec, configs, set(set_keys))
    problems += shared_key_problems(spec, configs, set(set_keys))
    problems += variant_duplicates(spec, configs)
    problems += reference_problems(spec, configs)
    problems += fusion_problems(configs)
    if read_data:
        problems += data_problems(spec, configs, set(set_keys))
    if spec.tune:
        problems += tune_problems(spec, spec.tune)
    return problems


def variant_configs(
    spec: StudySpec, set_keys: Iterable[str] = ()
) -> tuple[dict[str, ExperimentConfig], list[Problem]]:
    """Each variant's config at seed 0 (the seeds are checked on their own), and the problems of those
    that cannot be built, each where its value came from."""
    configs: dict[str, ExperimentConfig] = {}
    problems = []
    for name, overrides in spec.variant_overrides().items():
        try:
            configs[name] = spec.config_for(overrides, 0)
        except ConfigError as e:
            for key, msg in e.problems or [tuple(str(e).partition(": ")[::2])]:
                problems.append((origin(spec, name, key, set(set_keys)), msg))
    return configs, problems


CONFIG_PARTS = ("base", "factors", "variants", "fixed", "budget")  # what builds the variants' configs


def part_problems(
    tree: dict[str, Any], failed: set[str], set_keys: Iterable[str] = (), max_trials: int | None = None
) -> list[Problem]:
    """For a study file whose `failed` top-level fields did not parse: the problems of the configs that its
    other parts build, so a bad `seeds` or `claims` block does not hide an unknown model key until the next
    run. Nothing when a part that builds the configs failed itself."""
    if failed & set(CONFIG_PARTS):
        return []
    try:
        spec = StudySpec.model_validate({"name": "study", **{k: tree[k] for k in CONFIG_PARTS if k in tree}})
    except ValidationError:
        return []
    problems = key_problems(spec)
    if max_trials is None or variant_count(spec) <= max_trials:
        problems += variant_configs(spec, set_keys)[1]
    return problems


def key_problems(spec: StudySpec) -> list[Problem]:
    """Keys that name no config key, and factors without values."""
    known = {*ExperimentConfig().flat(), "preset"}
    sections = [("factors", spec.factors), *((f"variants.{n}", o) for n, o in spec.variants.items()),
                ("fixed", spec.fixed), ("budget", spec.budget)]  # fmt: skip
    problems = [(f"{section}.{key}", "unknown config key") for section, keys in sections for key in keys
                if key not in known]  # fmt: skip
    problems += [(f"factors.{key}", "empty list of values (the grid would be empty)")
                 for key, values in spec.factors.items() if not values]  # fmt: skip
    return problems


def origin(spec: StudySpec, variant: str, key: str, set_keys: set[str]) -> str:
    """Where a config key of a variant got its value: variants.<name>.<key>, factors.<key>, --set <key>,
    fixed.<key>, budget.<key>, else base (or the variant as a whole for a check across keys)."""
    if spec.variants and key in spec.variants[variant]:
        return f"variants.{variant}.{key}"
    if key in spec.factors:
        return f"factors.{key}"
    for section, keys in (("--set", set_keys), ("fixed", spec.fixed), ("budget", spec.budget)):
        if key in keys:
            return f"{section} {key}" if section == "--set" else f"{section}.{key}"
    if key in ExperimentConfig().flat() or key == "preset" or key in flatten(spec.base):
        return f"base.{key}"
    return f"variants.{variant}" if spec.variants else f"variant {variant!r}: {key}"


def factor_duplicates(spec: StudySpec) -> list[Problem]:
    """Two values of one factor that build the same config (8 and 8.0, 'none' twice) would be one variant."""
    problems = []
    for key, values in spec.factors.items():
        built: dict[Any, Value] = {}
        for value in values:
            try:
                cfg = build_config(spec.base, {**spec.budget, **spec.fixed, key: value})
            except ConfigError:
                continue  # reported with the variant
            same = cfg.flat().get(key, cfg) if key != "preset" else cfg
            if same in built:
                problems.append((f"factors.{key}", f"{built[same]!r} and {value!r} build the same config"))
            built.setdefault(same, value)
    return problems


def ignored_key_problems(
    spec: StudySpec, configs: dict[str, ExperimentConfig], set_keys: set[str]
) -> list[Problem]:
    """A model or task key a variant sets (its own override, or a factor) that its model or task ignores: the
    variant would look different from another and run the same."""
    variants: dict[Problem, list[str]] = {}
    for name, overrides in spec.variant_overrides().items():
        for key, why in ignored_settings(configs[name], overrides):
            variants.setdefault((origin(spec, name, key, set_keys), why), []).append(name)
    if spec.variants:
        return [(where, f"has no effect ({why})") for where, why in variants]
    advice = "list the variants by name to leave it out where it does nothing"
    return [(where, f"has no effect in {', '.join(map(repr, names))} ({why}); {advice}")
            for (where, why), names in variants.items()]  # fmt: skip


def shared_key_problems(
    spec: StudySpec, configs: dict[str, ExperimentConfig], set_keys: set[str]
) -> list[Problem]:
    """A task key of base, fixed, budget or --set, which every variant gets, that every variant's task
    ignores. Shared model keys are not refused: a study comparing both families shares each family's keys."""
    varied = {key for overrides in spec.variant_overrides().values() for key in overrides}
    shared = {*flatten(spec.base), *spec.fixed, *spec.budget, *set_keys} - varied
    any_variant = next(iter(configs))  # none overrides a shared key: each gives its origin
    problems = []
    for key in sorted(key for key in shared if key.startswith("task.")):
        ignored = [why for cfg in configs.values() for _, why in ignored_settings(cfg, [key])]
        if len(ignored) == len(configs):
            problems.append((origin(spec, any_variant, key, set_keys), f"has no effect ({ignored[0]})"))
    return problems


def variant_duplicates(spec: StudySpec, configs: dict[str, ExperimentConfig]) -> list[Problem]:
    """Two variants that build the same model (keys the model ignores left out) with the same task and
    training would count one result twice. Where they differ only in keys a variant sets and its model
    ignores, ignored_key_problems has said so at those keys."""
    label = "variants.{}".format if spec.variants else "variant {!r}".format
    overrides = spec.variant_overrides()
    seen: dict[ExperimentConfig, str] = {}
    problems = []
    for name, cfg in configs.items():
        effective = cfg.model_copy(update={"model": cfg.model.effective()})
        if effective in seen:
            first = seen[effective]
            ignored = sorted(k for k, v in cfg.flat().items() if configs[first].flat()[k] != v)
            said = {key for v in (name, first) for key, _ in ignored_settings(configs[v], overrides[v])}
            if ignored and set(ignored) <= said:
                continue
            why = f" ({', '.join(ignored)}: ignored by this model)" if ignored else ""
            problems.append(
                (label(name), f"builds the same {'model' if why else 'config'} as {label(first)}{why}")
            )
        seen.setdefault(effective, name)
    return problems


def seed_problems(spec: StudySpec) -> list[Problem]:
    """Each listed seed, or the largest of a seed range, is one the generators accept."""
    if isinstance(spec.seeds, AdaptiveSeeds):
        largest = spec.seeds.start + spec.seeds.max - 1  # not from seed_pool: max may be 2**32
        seeds = [("seeds.start" if spec.seeds.start else "seeds.max", largest)]
    else:
        seeds = [(f"seeds[{i}]", seed) for i, seed in enumerate(spec.seeds)]
    problems = []
    for where, seed in seeds:
        try:
            build_config({}, {"seed": seed})
        except ConfigError as e:
            problems.append((where, str(e).partition(": ")[2]))
    return problems


def reference_problems(spec: StudySpec, configs: dict[str, ExperimentConfig]) -> list[Problem]:
    """The study metric, the baseline and every claim against the variants as built."""
    from ablate.harness.metrics import (
        produced_metrics,  # the task registry: seconds of imports, after the basics
    )

    produced = {name: produced_metrics(cfg) for name, cfg in configs.items()}
    problems = metric_problems("metric.name", spec.metric.name, produced)
    if spec.tune and spec.tune.metric is not None:
        problems += metric_problems("tune.metric.name", spec.tune.metric.name, produced)
    if isinstance(spec.baseline, dict) and spec.baseline_variant() is None:
        problems.append(("baseline", f"no variant matches {spec.baseline}"))
    if isinstance(spec.baseline, str) and spec.baseline not in configs:
        problems.append(("baseline", f"unknown variant {spec.baseline!r}"))
    if spec.judge_from is not None:
        problems += metric_problems("judge_from.metric", spec.judge_from.metric, produced)
        problems += in_range("judge_from.value", spec.judge_from.value, spec.judge_from.metric)
    for i, claim in enumerate(spec.claims):
        problems += claim_problems(f"claims[{i}]", claim, spec, produced, configs)
        if claim.chance is not None:
            problems += in_range(f"claims[{i}].chance", claim.chance, claim.metric or spec.metric.name)
    return problems


def in_range(where: str, value: float, metric: str) -> list[Problem]:
    """A level on a metric (judge_from's, a claim's chance) that its metric can take: one outside the range
    would judge every claim below it, or every seed failed."""
    bounds = metric_info(metric).range
    if bounds.low <= value <= bounds.high:
        return []
    return [(where, f"{value:g} is outside {metric}'s range [{bounds.low:g}, {bounds.high:g}]")]


def metric_problems(where: str, metric: str, produced: dict[str, set[str]]) -> list[Problem]:
    missing = [name for name, metrics in produced.items() if metric not in metrics]
    if not missing:
        return []
    some = produced[missing[0]]
    return [(where, f"{metric!r} is not reported by variant {missing[0]!r}"
                    f"{f' (nor {len(missing) - 1} others)' if len(missing) > 1 else ''}; "
                    f"it reports {', '.join(sorted(some))}")]  # fmt: skip


def claim_problems(
    where: str, claim: ClaimSpec, spec: StudySpec, produced: dict[str, set[str]],
    configs: dict[str, ExperimentConfig],
) -> list[Problem]:
    """Each side of each difference a claim makes (its own, `versus` for an interaction, and its positive
    `control`) selects a variant, matched as the report matches them (analysis.claims: overrides plus the
    keys their preset sets), and reports the claim's metric; the control runs on the claim's own task."""
    from ablate.analysis.claims import claim_sides, control_claim
    from ablate.harness.lengths import untrained_positions

    known = {*ExperimentConfig().flat(), "preset"}
    control = claim.control.model_dump() if claim.control else {}
    selectors = {"compare": claim.compare, "to": claim.to, "within": claim.within,
                 "versus.within": (claim.versus.within if claim.versus else None) or {},
                 **{f"control.{side}": selector for side, selector in control.items()}}  # fmt: skip
    problems = [(f"{where}.{side}.{key}", "unknown config key")
                for side, selector in selectors.items() for key in selector if key not in known]  # fmt: skip
    if problems:
        return problems
    settings = variant_settings(spec)
    # (where, the sides, metric, sub-grid) of each difference: the claim's, versus's, the control's.
    differences = [(f"{where}.versus" if arm else where, claim, metric, within)
                   for arm, (metric, within) in enumerate(claim.arms(spec.metric.name))]  # fmt: skip
    if claim.control is not None:
        differences.append(
            (f"{where}.control", control_claim(claim, differences[0][2]), differences[0][2], {})
        )
    tasks: list = []  # the claim's own tasks, then whether its control runs on them
    for label, sides, metric, within in differences:
        compared, others = claim_sides(settings, sides, within)
        if label == f"{where}.control":
            problems += control_task_problems(label, tasks, [configs[v].task for v in (*compared, *others)])
        else:
            tasks += [configs[v].task for v in (*compared, *others)]
        compare, to = {**sides.compare, **within}, {**sides.to, **within}
        if not compared:
            problems.append((f"{label}.compare", f"no variant matches {compare}"))
        if not others:
            problems.append((f"{label}.to", f"no variant other than the compared ones matches {to}"))
        if metric != spec.metric.name:  # the study metric is checked against every variant already
            involved = {name: produced[name] for name in (*compared, *others)}
            problems += metric_problems(f"{label}.metric", metric, involved)
        untrained = [name for name in (*compared, *others) if untrained_positions(configs[name], metric)]
        if untrained:
            problems.append((f"{label}.metric", f"{metric} reads positions no training example reached, where "
                             f"the position tables of {', '.join(map(repr, untrained))} are as initialised"))
    return problems + judging_problems(where, claim, spec)


def control_task_problems(where: str, claim_tasks: list, control_tasks: list) -> list[Problem]:
    """A positive control shows that the claim's own setting could have seen a difference (assay
    sensitivity): one that moves the metric on another task says nothing of the claim's."""
    other = next((task for task in control_tasks if task not in claim_tasks), None)
    if other is None or not claim_tasks:
        return []
    own = claim_tasks[0]
    differs = sorted(k for k, v in other.model_dump().items() if own.model_dump().get(k) != v)
    settings = ", ".join(f"task.{k}={getattr(other, k)!r} (the claim's: {getattr(own, k)!r})" for k in differs)
    return [(where, f"runs on another task than the claim: {settings}; a positive control runs on the claim's "
                    "own task and metric")]  # fmt: skip


def judging_problems(where: str, claim: ClaimSpec, spec: StudySpec) -> list[Problem]:
    """What would keep a claim from ever being judged as it reads (analysis.claims): a margin its metric's
    range cannot reach (or, for `similar` and `not_worse`, cannot miss), and an interaction that subtracts a
    ratio from a difference."""
    metrics = [metric for metric, _ in claim.arms(spec.metric.name)]
    info = {m: metric_info(m) for m in metrics}
    problems = []
    if len({info[m].scale for m in metrics}) > 1:
        scales = " and ".join(f"{m} as a {info[m].scale}" for m in metrics)
        problems.append(
            (f"{where}.versus.metric", f"judges {scales}; an interaction needs one scale for both")
        )
    # Δ on a metric in [low, high] lies within ±(high - low); an interaction's within the sum of its two
    # metrics' reaches (analysis.claims bounds its CI the same way).
    reach = sum(info[m].range.difference().high for m in metrics)
    if info[metrics[0]].scale == "difference" and abs(claim.margin) >= reach:
        outcome = "can never fail" if claim.expect in AGREEMENT else "cannot be met"
        first_of = {}  # each distinct range, named by the first metric that has it
        for m in metrics:
            first_of.setdefault((info[m].range.low, info[m].range.high), m)
        ranges = " and ".join(f"{m} lies in [{low:g}, {high:g}]" for (low, high), m in first_of.items())
        problems.append(
            (f"{where}.margin", f"{claim.margin:g} {outcome}: {ranges}, so Δ lies within ±{reach:g}")
        )
    return problems


def data_problems(spec: StudySpec, configs: dict[str, ExperimentConfig], set_keys: set[str]) -> list[Problem]:
    """What each task reads from this machine (its registry entry's `reads_machine`: a local corpus, the
    Bibles' SWORD modules, SCAN's files), read once by the task's own reader: it exists, parses and fills
    every split; and, where a variant's model bounds the lengths it can place or has trained on (learned
    positions, the T5 bias), its task's lengths against it (harness/lengths.py), generated tasks included.
    Corpora named on the Hugging Face hub are fetched, and checked, by the trial itself."""
    # The task registry: seconds of imports, when needed.
    from ablate.harness.lengths import position_problem, reads_lengths
    from ablate.harness.tasks.corpora import looks_local

    problems, read = [], {}
    for name, cfg in configs.items():
        task, bounded = cfg.task, reads_lengths(cfg.model)
        reads = TASKS[task.name].reads_machine
        local = reads == "always" or (reads == "path" and task.path is not None and looks_local(task.path))
        if not (local or (bounded and reads == "nothing")):
            continue
        if task not in read:
            read[task] = corpus_problem(task, cfg.seed)
        problem, data = read[task]
        if problem:
            key = "task.path" if task.path else "task.name"
            problems.append((origin(spec, name, key, set_keys), problem))
        elif bounded and (found := position_problem(cfg, data)):
            problems.append((origin(spec, name, found[0], set_keys), found[1]))
    return problems


def corpus_problem(task: TaskConfig, seed: int) -> tuple[str | None, TaskData | None]:
    """(why the task cannot be read, None), or (None, its data)."""
    from ablate.harness.tasks import build_task

    try:
        data = build_task(task, seed)
    except ConfigError as e:
        return str(e), None
    except OSError as e:
        return f"{e.filename or task.path}: {os_reason(e)}", None
    empty = [split for split in ("train", "valid", "test") if not data.splits[split]]
    if empty:
        sizes = ", ".join(f"{split} {len(data.splits[split])}" for split in ("train", "valid", "test"))
        return f"{task.path or 'task ' + task.name}: too few pairs for every split ({sizes})", None
    return None, data


def fusion_problems(configs: dict[str, ExperimentConfig]) -> list[Problem]:
    """train.fuse_seeds: true where a variant's seeds cannot train as one model: said, rather than run
    unfused as `auto` would."""
    for variant, cfg in configs.items():
        why = why_not_fused([cfg]) if cfg.train.fuse_seeds is True else None
        if why:
            return [("train.fuse_seeds", f"true, but {why} (variant {variant!r}); set it to auto or false")]
    return []


def tune_problems(spec: StudySpec, tune: TuneSpec) -> list[Problem]:
    """Each tuned key is a config key outside the factors, with one well-formed range whose ends (or
    choices) make valid configs."""
    first = next(iter(spec.variant_overrides().values()))
    varied = {k for overrides in spec.variant_overrides().values() for k in overrides}
    problems = []
    if not tune.params:
        problems.append(("tune.params", "name at least one config key to tune"))
    if tune.arm == "baseline" and spec.baseline_variant() not in spec.variant_overrides():
        problems.append(("tune.arm", "baseline: the study names no baseline variant to tune on"))
    if tune.arm == "baseline" and spec.claims and not tune.why.strip():
        problems.append(("tune.why", "tune.arm: baseline chooses every arm's parameters on one of them, which "
                                     "favours it in each claim against it; say why the claims need it"))  # fmt: skip
    for key, space in tune.params.items():
        problem = tuned_key_problem(spec, first, varied, key, space)
        if problem:
            problems.append((f"tune.params.{key}", problem))
    if isinstance(tune.seeds, list):
        # Tuning on an eval seed would choose the parameters on the very runs that then judge them.
        shared = sorted(set(tune.seeds) & set(spec.seed_pool))
        if shared:
            listed = ", ".join(map(str, shared))
            problems.append(("tune.seeds", f"{listed} {'is an eval seed' if len(shared) == 1 else 'are eval seeds'} too; tune on others"))
        elif len(set(tune.seeds)) < len(tune.seeds):
            problems.append(("tune.seeds", "a seed is listed twice"))
        elif not tune.seeds:
            problems.append(("tune.seeds", "list at least one seed, or leave it unset"))
    if len(spec.tune_seeds) > 1:  # a candidate's seeds train as one model
        for variant, overrides in spec.variant_overrides().items():
            why = why_not_fused([spec.config_for(overrides, seed) for seed in spec.tune_seeds])
            if why:
                problems.append(("tune.seeds", f"a candidate's seeds train fused, but {why} in variant {variant!r}"))
                break
    return problems


def tuned_key_problem(spec: StudySpec, first: dict, varied: set, key: str, space: dict) -> str | None:
    if key not in ExperimentConfig().flat():
        return "unknown config key"
    if key in varied:
        return "is a factor of the study; a variant cannot both fix and tune it"
    if len(space) != 1:
        return f"give exactly one of {', '.join(TUNE_KINDS)}"
    ((name, args),) = space.items()
    kind = TUNE_KINDS[name]
    if not kind.bounds and not args:
        return f"{name}: empty list of values"
    if kind.bounds:
        numeric = all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
        if len(args) != 2 or not numeric or not args[0] < args[1]:
            return f"{name}: expected [low, high] with low < high (got {args})"
        if kind.integer and not all(isinstance(a, int) for a in args):
            return f"{name}: bounds must be integers (got {args})"
        default = ExperimentConfig().flat()[key]
        if not kind.integer and isinstance(default, int) and not isinstance(default, bool):
            return f"{name}: the key takes integers (strictly); use int: [low, high]"
        if kind.positive and args[0] <= 0:
            return f"{name}: bounds must be positive (got {args})"
    for value in args:
        try:
            spec.config_for(first, 0, {key: value})
        except ConfigError as e:
            return f"{value!r} makes an invalid config ({e})"
    return None


# What the command line adds -------------------------------------------------------------------------------


def run_problems(out: Path | None = None, storage: str | None = None, wandb: str | None = None) -> list[Problem]:
    """--out, --storage and the W&B mode (the flag, else WANDB_MODE), before anything opens."""
    from ablate.harness.study.storage import masked_url, sqlite_path, url_problem

    problems = []
    if out is not None:
        problems += folder_problems("--out", out)
    if storage is not None and (reason := url_problem(storage)):
        problems.append(("--storage", f"{masked_url(storage)}: {reason}"))
    elif storage is not None and (db := sqlite_path(storage)) and not db.parent.is_dir():
        # Folders are made under --out only: one named elsewhere is the user's to make.
        problems.append(("--storage", f"{masked_url(storage)}: no folder {db.parent}; make it first"))
    expected = f"expected {', '.join(MODES[:-1])} or {MODES[-1]}"
    if wandb is not None and wandb not in MODES:
        problems.append(("--wandb", f"{expected} (got {wandb!r})"))
    env = os.environ.get("WANDB_MODE")
    if wandb is None and env and env not in (*MODES, *OLD_MODES):
        problems.append(("WANDB_MODE", f"{expected} (got {env!r} from the environment)"))
    return problems


def folder_problems(option: str, folder: Path) -> list[Problem]:
    """A folder this run will create files under: it is a folder (or can be made) and writable. A path the
    system will not even look at (a symbolic link loop, a name too long) is a problem with its reason."""
    try:
        existing = nearest_existing(folder)
    except OSError as e:
        return [(option, f"{e.filename or folder}: {os_reason(e)}")]
    if not existing.is_dir():
        return [(option, f"{existing}: not a folder")]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [(option, f"{existing}: permission denied (not writable)")]
    return []


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (symbolic links followed). A missing path, one under a
    file or one in a folder this process cannot search goes on to its parent, which says why; any other
    OSError (ELOOP, ENAMETOOLONG, EIO, ...) is raised."""
    while True:
        try:
            path.stat()
            return path
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            if path == path.parent:
                raise
            path = path.parent


def os_reason(e: OSError) -> str:
    """'permission denied', 'not a folder', 'file name too long', 'no space left on device', ..."""
    return (e.strerror or str(e)).lower().replace("not a directory", "not a folder")


def read_study(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A study file (or a bundled study's name) and its YAML, read once."""
    path = resolve_study_path(path)
    return path, read_yaml(path)


def load_study(
    path: str | Path, profile: str | None = None, sets: dict[str, Any] | None = None,
    max_trials: int | None = None, also: list[tuple[str, str]] = (), *, read_data: bool = True,
    tree: dict[str, Any] | None = None,
) -> StudySpec:  # fmt: skip
    """Reads a study file (with one of its profiles, and --set keys added to `fixed`) and checks all of it
    (below), together with the command line's own problems `also`; StudyError (a
    ConfigError) lists every problem. `max_trials` refuses a bigger grid before any variant is built.
    `read_data=False` leaves out what only running the study needs, its data on this machine (each local
    corpus, the bible task's SWORD modules): checks of the file itself, its claims and its structure.
    `tree`: the file at `path` as read_study read it (a sweep reads it once, for its launcher too)."""
    if tree is None:
        path, tree = read_study(path)
    tree = apply_profile(tree, profile, str(path))
    tree.pop("launcher", None)  # where its workers run (harness/launchers), not what the study is
    if sets:
        tree = {**tree, "fixed": {**(tree.get("fixed") or {}), **sets}}
    try:
        spec = StudySpec.model_validate(tree)
    except ValidationError as e:
        failed = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
        parts = part_problems(tree, failed, sets or {}, max_trials)
        raise_problems(str(path), validation_problems(e) + parts, also)
    raise_problems(str(path), study_problems(spec, sets or {}, max_trials, read_data), also)
    return spec
