"""Registry entries from installed packages (plug-ins). Each registry, the names one config key accepts,
also takes the entry points of its group, `ablate.<key>`: a package declares, for example,

    [project.entry-points."ablate.pos_encoding"]
    my-relative = "my_package.positions:KIND"

KIND being an entry of that registry (here a models.positional.PositionalKind), and `model.pos_encoding:
my-relative` then builds it. Only installed packages are read, once, when models/config.py is imported
(`load`, before ModelConfig takes the registries' names): a study file or a config names entries, never code
(docs/SECURITY.md). A plug-in imports the registry modules its entry type lives in (models.positional,
models.scores, models.transformer_scores, models.kinds), which are whole by then, not models.config.

A plug-in that fails to import, takes a name already taken (built in, or by another plug-in) or is not an
entry of its registry joins nothing; its fault is kept (FAULTS, `fault`) and said, with its package, by the config
check that meets its name and by `ablate list`, so a broken plug-in stops no study that does not use it.
A plug-in that needs settings of its own declares a `Settings` subclass under the group `ablate.settings`, by
its own name; the config then takes them at model.plugin.<name>.<key> (task.plugin.<name>.<key> for a task),
checked with the rest of the config, and the plug-in reads them with `settings(cfg, name)`. A settings entry
that does not load, is no Settings, or names no plug-in of its package is a fault of that plug-in, which then
joins nothing.

No torch here: config checks read the registries."""

from __future__ import annotations

import functools
import re
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ablate.models.bounds import unbounded

# The entry-point group of the registry `key`, a config key: arch, pos_encoding, attention, ..., task
# (task.name: schema/task_config.py joins it, a schema/tasks.py Task whose builder is
# 'package.module:function').
GROUP = "ablate.{key}"
SETTINGS_GROUP = "ablate.settings"
# No '+' (it joins positional kinds), no '.' (a settings key model.plugin.<name>.<key> splits on it), no spaces.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

# (key, name) -> the package a plug-in came from; (key, name) -> why it joined nothing, one line
PACKAGES: dict[tuple[str, str], str] = {}
FAULTS: dict[tuple[str, str], str] = {}
SETTINGS: dict[str, type[Settings]] = {}  # plug-in name -> its settings


class Settings(BaseModel):
    """A plug-in's own settings: a subclass declares each with its default (and each number with both ends,
    as every key of the config has), read from model.plugin.<name> or task.plugin.<name>."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)


def registries() -> dict[str, tuple[dict, type]]:
    """Each registry that takes plug-ins, by its config key: (the registry, its entry type)."""
    from ablate.models import kinds, positional, scores, transformer_scores

    return {
        "arch": (kinds.FAMILIES, kinds.Family),
        "pos_encoding": (positional.POSITIONAL, positional.PositionalKind),
        "attention": (scores.SCORES, scores.ScoreKind),
        "attention_window": (scores.WINDOWS, scores.WindowKind),
        "score": (transformer_scores.TRANSFORMER_SCORES, transformer_scores.ScoreKind),
        "norm": (kinds.NORMS, kinds.Norm),
        "cell": (kinds.CELLS, kinds.Cell),
    }


@functools.cache
def load() -> None:
    """Joins every installed plug-in of the model's registries, with its settings, once per process."""
    for key, (registry, entry) in registries().items():
        join(key, registry, entry)
    join_settings({key: registry for key, (registry, _) in registries().items()})


def join(key: str, registry: dict[str, Any], entry: type) -> None:
    """Adds to the registry of `key` each plug-in of its group that loads, takes a free name and is an
    `entry`; the others' faults are kept."""
    for point in sorted(entry_points(group=GROUP.format(key=key)), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else "an unnamed distribution"
        where = f"plug-in {point.name!r} of {package} ({GROUP.format(key=key)} = {point.value})"
        if not NAME.fullmatch(point.name):
            FAULTS[(key, point.name)] = f"{where}: a name is letters, digits, '_' and '-', not first '_' or '-'"
            continue
        if point.name in registry:
            owner = PACKAGES.get((key, point.name), "built in")
            FAULTS[(key, point.name)] = f"{where}: the name is taken ({owner}); it is not loaded"
            continue
        try:
            found = point.load()
        except Exception as e:  # the plug-in's own fault, whatever it raised while importing
            FAULTS[(key, point.name)] = f"{where}: failed to import: {type(e).__name__}: {e}"
            continue
        if not isinstance(found, entry):
            FAULTS[(key, point.name)] = f"{where}: is a {type(found).__name__}, not a {entry.__name__}"
            continue
        registry[point.name] = found
        PACKAGES[(key, point.name)] = package


def join_settings(section: dict[str, dict[str, Any]]) -> None:
    """Adds to SETTINGS the settings entry of each plug-in that joined a registry of `section` (key ->
    registry: the model's, or the task's, which is joined last); one that fails takes its plug-in out of its
    registry, and one that names no plug-in of its package is a fault of its own."""
    for point in sorted(entry_points(group=SETTINGS_GROUP), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else "an unnamed distribution"
        key = next((k for k in section if PACKAGES.get((k, point.name)) == package), None)
        if key is None:
            named = {n for _, n in (*PACKAGES, *FAULTS)}  # a plug-in of that name, loaded or faulty
            if "task" in section and point.name not in named:
                FAULTS[("settings", point.name)] = (f"settings {point.name!r} of {package} ({SETTINGS_GROUP} = "
                                                    f"{point.value}): names no plug-in of {package}")  # fmt: skip
            continue
        try:
            found = point.load()
        except Exception as e:  # the plug-in's own fault, whatever it raised while importing
            problem = f"failed to import its settings: {type(e).__name__}: {e}"
        else:
            problem = settings_problem(point.name, found)
        if problem is None:
            SETTINGS[point.name] = found
        else:
            del section[key][point.name], PACKAGES[(key, point.name)]
            where = f"plug-in {point.name!r} of {package} ({SETTINGS_GROUP} = {point.value})"
            FAULTS[(key, point.name)] = f"{where}: {problem}"


def settings_problem(name: str, found: object) -> str | None:
    """Why `found` cannot be the settings of plug-in `name`, or None. The settings join every config (used or
    not), so one that could not be hashed, or whose defaults fail its own checks, would break them all."""
    if name.startswith("model_") or hasattr(BaseModel, name):
        return f"a plug-in with settings cannot be named {name!r}, a name pydantic models keep for their own"
    if not (isinstance(found, type) and issubclass(found, Settings)):
        return f"its settings are a {type(found).__name__}, not a Settings"
    try:
        hash(found())  # validate_default: a default outside its own range fails here
    except ValidationError as e:
        missing = [str(err["loc"][0]) for err in e.errors() if err["type"] == "missing"]
        if missing:
            return f"settings without a default: {', '.join(missing)}"
        return f"a default its own schema refuses: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}"
    except TypeError:
        return "a setting that cannot be hashed (a list, dict or set); use a tuple"
    if loose := unbounded(found, "settings"):  # as every number of the config has both ends
        return f"a number without both ends in its schema: {', '.join(w.partition('.')[2] for w in loose)}"
    return None


def settings_model(section: Literal["model", "task"]) -> type[BaseModel]:
    """The `plugin` block of the model's or the task's config: one field a plug-in of `section` with
    settings, named as the plug-in, at its settings' defaults."""
    names = [name for key, name in PACKAGES if (key == "task") == (section == "task") and name in SETTINGS]
    fields: dict[str, Any] = {name: (SETTINGS[name], SETTINGS[name]()) for name in names}
    return create_model(f"{section.title()}PluginSettings", __base__=Settings, **fields)


def settings(cfg: BaseModel, name: str) -> Settings:
    """The settings of plug-in `name` in a ModelConfig or TaskConfig `cfg`: what its builder reads."""
    return getattr(cfg.plugin, name)  # type: ignore[attr-defined]


def in_use(config: dict[str, object]) -> set[tuple[str, str]]:
    """The (key, name) of each plug-in a flat config ({'model.score': 'quarter', ...}) names. A value may
    join names with '+' (positional kinds), which no name holds."""
    return {(key, name) for key, name in PACKAGES if name in str(config.get(config_key(key), "")).split("+")}


def config_key(key: str) -> str:
    """The config key that takes the names of registry `key`: model.<key>, or task.name for tasks (for
    settings that name no plug-in: the blocks they would join)."""
    return {"task": "task.name", "settings": "model.plugin | task.plugin"}.get(key, f"model.{key}")


def used(config: dict[str, object]) -> str:
    """The plug-ins a flat config names, with their packages ('plug-in model.score=quarter of my-attention'),
    or ''."""
    named = [f"{config_key(key)}={name} of {PACKAGES[(key, name)]}" for key, name in sorted(in_use(config))]
    return f"plug-in{'s' if len(named) > 1 else ''} {', '.join(named)}" if named else ""


def fault(key: str, name: object) -> str | None:
    """Why a plug-in named `name` is not in the registry of `key`, if one is installed under that name."""
    return FAULTS.get((key, name)) if isinstance(name, str) else None
