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
No torch here: config checks read the registries."""

from __future__ import annotations

import functools
import re
from importlib.metadata import entry_points
from typing import Any

# The entry-point group of the registry `key`, a config key: pos_encoding, attention, ..., task (task.name:
# schema/config.py joins it, a schema/tasks.py Task whose builder is 'package.module:function').
GROUP = "ablate.{key}"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # no '+' (it joins positional kinds), no spaces

# (key, name) -> the package a plug-in came from; (key, name) -> why it joined nothing, one line
PACKAGES: dict[tuple[str, str], str] = {}
FAULTS: dict[tuple[str, str], str] = {}


def registries() -> dict[str, tuple[dict, type]]:
    """Each registry that takes plug-ins, by its config key: (the registry, its entry type)."""
    from ablate.models import kinds, positional, scores, transformer_scores

    return {
        "pos_encoding": (positional.POSITIONAL, positional.PositionalKind),
        "attention": (scores.SCORES, scores.ScoreKind),
        "attention_window": (scores.WINDOWS, scores.WindowKind),
        "score": (transformer_scores.TRANSFORMER_SCORES, transformer_scores.ScoreKind),
        "norm": (kinds.NORMS, kinds.Norm),
        "cell": (kinds.CELLS, kinds.Cell),
    }


@functools.cache
def load() -> None:
    """Joins every installed plug-in to its registry, once per process."""
    for key, (registry, entry) in registries().items():
        join(key, registry, entry)


def join(key: str, registry: dict[str, Any], entry: type) -> None:
    """Adds to the registry of `key` each plug-in of its group that loads, takes a free name and is an
    `entry`; the others' faults are kept."""
    for point in sorted(entry_points(group=GROUP.format(key=key)), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else "an unnamed distribution"
        where = f"plug-in {point.name!r} of {package} ({GROUP.format(key=key)} = {point.value})"
        if not NAME.fullmatch(point.name):
            FAULTS[(key, point.name)] = f"{where}: a name is letters, digits, '_', '.' and '-'"
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


def config_key(key: str) -> str:
    """The config key that takes the names of registry `key`: model.<key>, or task.name for tasks."""
    return "task.name" if key == "task" else f"model.{key}"


def used(config: dict[str, object]) -> str:
    """The plug-ins a flat config ({'model.score': 'quarter', ...}) names, with their packages
    ('plug-in model.score=quarter of my-attention'), or ''. A value may join names with '+' (positional
    kinds), which no name holds."""
    named = [f"{config_key(key)}={name} of {package}" for (key, name), package in PACKAGES.items()
             if name in str(config.get(config_key(key), "")).split("+")]  # fmt: skip
    return f"plug-in{'s' if len(named) > 1 else ''} {', '.join(named)}" if named else ""


def fault(key: str, name: object) -> str | None:
    """Why a plug-in named `name` is not in the registry of `key`, if one is installed under that name."""
    return FAULTS.get((key, name)) if isinstance(name, str) else None
