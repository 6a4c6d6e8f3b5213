"""Launchers: where a study's `ablate worker` processes start: on this machine (`local`, the default) or,
with `--launcher NAME`, where a scheduler puts them. The study is checked, created and queued the same way
whichever starts them (Optuna's exactly-once claims, heartbeat retries, resume from checkpoints).

A launcher is a module here, listed in LAUNCHERS, with
  Options   a pydantic model: the keys of the study file's `launcher: {NAME: {...}}` block, which
            `--launch key=value` overrides
  problems(options, url, out) -> [(where, what)]: why it cannot run the study on that storage with outputs
            under `out`, found before anything is created, waiting a bounded time for the scheduler
  start(spec, url, out, wandb_mode, artifacts, options) -> Popen-like handles (poll, send_signal, wait,
            kill, returncode) the sweep watches, or None when a scheduler took the work (the last worker
            then writes the report)
Each starts its workers with the command line of `commands.py`, which imports no torch."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

# The command line reads the names on every start: the study code is imported only to launch.
LAUNCHERS = {"slurm": "ablate.harness.launchers.slurm", "ray": "ablate.harness.launchers.ray",
             "local": "ablate.harness.launchers.local"}  # fmt: skip

Problem = tuple[str, str]


@dataclass(frozen=True)
class Launch:
    """A launcher with its options, checked."""

    name: str
    options: BaseModel

    @property
    def module(self):
        return importlib.import_module(LAUNCHERS[self.name])

    def problems(self, url: str, out: Path) -> list[Problem]:
        return self.module.problems(self.options, url, out)

    def start(self, spec, url: str, out: Path, wandb_mode: str, artifacts: str | None):
        return self.module.start(spec, url, out, wandb_mode, artifacts, self.options)


def plan(
    name: str | None, study: str, sets: list[str], here: dict[str, Any] | None = None, launchers: Any = None
) -> tuple[Launch | None, list[Problem]]:
    """The launcher `name` with its options (`launchers`, the study file's `launcher` block as the sweep read
    it, then `sets`) and their problems; without a name, the local launcher with `here` (`ablate sweep`'s
    --workers, --devices and --per-device, already checked). `study` names the file in the problems."""
    from pydantic import ValidationError

    from ablate.schema.config import validation_problems

    if name is None:
        options = importlib.import_module(LAUNCHERS["local"]).Options.model_validate(here or {})
        return Launch("local", options), [("--launch", "give --launcher too")] if sets else []
    if name not in LAUNCHERS:
        return None, [("--launcher", f"unknown launcher {name!r} (known: {', '.join(LAUNCHERS)})")]
    options = importlib.import_module(LAUNCHERS[name]).Options
    lists = {
        key
        for key, field in options.model_fields.items()
        if getattr(field.annotation, "__origin__", None) is list
    }
    block, problems = study_block(launchers, study, name)
    given, where = dict(block), {key: f"{study}: launcher.{name}.{key}" for key in block}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(("--launch", f"{item!r}: expected key=value, e.g. tasks=4"))
            continue
        key = key.strip()
        # Strings from the command line: pydantic reads '4' as 4 and 'true' as True where the key wants them;
        # each `--launch key=value` of a list key adds an item.
        given[key] = [*given.get(key, []), value] if key in lists else value
        where[key] = f"--launch {key}"
    try:
        return Launch(name, options.model_validate(given)), problems
    except ValidationError as e:
        known = f"unknown setting (known: {', '.join(options.model_fields)})"
        found = [(where.get(loc.split(".")[0], loc), known if msg == "unknown config key" else msg)
                 for loc, msg in validation_problems(e)]  # fmt: skip
        return None, problems + found


def study_block(launchers: Any, study: str, name: str) -> tuple[dict[str, Any], list[Problem]]:
    """The `launcher.<name>` mapping of the study file's `launcher` block (None: the file has none, or could
    not be read, which load_study reports)."""
    launchers = launchers or {}
    if not isinstance(launchers, dict) or not isinstance(launchers.get(name) or {}, dict):
        return {}, [(f"{study}: launcher", f"expected a mapping like {{{name}: {{...}}}}")]
    unknown = [(f"{study}: launcher.{other}", f"unknown launcher (known: {', '.join(LAUNCHERS)})")
               for other in launchers if other not in LAUNCHERS]  # fmt: skip
    return launchers.get(name) or {}, unknown

