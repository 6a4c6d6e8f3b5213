"""`ablate`: train one run, sweep a study, report on it, list what exists.

Bad input anywhere ends with one line on stderr naming what and where, and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from harness.config import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
console = Console(stderr=True)

RunsOption = Annotated[Path, typer.Option("--out", help="Root folder of study outputs.")]
StorageOption = Annotated[
    str | None, typer.Option("--storage", help="SQLAlchemy URL (default: SQLite in runs/<study>/).")
]
SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: key=value.")]


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@app.command()
def train(
    config: Annotated[Path | None, typer.Argument(help="Experiment YAML (task, model, train, seed).")] = None,
    preset: Annotated[str | None, typer.Option(help="Named model preset, e.g. transformer.")] = None,
    sets: SetOption = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for config, metrics, checkpoints.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print final metrics as one JSON line.")] = False,
) -> None:
    """Train and evaluate one configuration."""
    from harness.config import load_config

    try:
        cfg = load_config(config, preset, sets)
        from harness.trial import run_trial

        result = run_trial(cfg, out_dir=out, progress=not as_json)
    except ConfigError as e:
        raise fail(str(e)) from None
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        table = Table(title="final metrics")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
        Console().print(table)


@app.command()
def sweep(
    study: Annotated[str, typer.Argument(help="Study file (or the name of a bundled one).")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    wandb: Annotated[str | None, typer.Option("--wandb", help="online | offline | disabled")] = None,
    sets: SetOption = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the report at the end.")] = False,
) -> None:
    """Run every variant x seed of a study, then write its report."""
    from harness import tracking
    from harness.config import parse_override
    from harness.study import default_storage_url, load_study, open_storage
    from harness.workers import run_worker

    try:
        spec = load_study(study)
        if sets:
            # --set changes the study's fixed keys for every trial (e.g. train.max_steps=50).
            fixed = {**spec.fixed, **dict(parse_override(s) for s in sets)}
            spec = spec.model_copy(update={"fixed": fixed})
            from harness.study import validate_spec

            validate_spec(spec, "--set")
        if wandb not in (None, "online", "offline", "disabled"):
            raise ConfigError(f"--wandb: expected online, offline or disabled (got {wandb!r})")
        mode = tracking.resolve_mode(wandb)
        url = storage or default_storage_url(spec, out)
        store = open_storage(url)
    except ConfigError as e:
        raise fail(str(e)) from None
    console.print(f"[bold]{spec.name}[/]: {len(spec.variant_overrides())} variants x {len(spec.seeds)} seeds, "
                  f"storage {url}, W&B {mode}")  # fmt: skip
    run_worker(spec, store, out, mode)
    if not no_report:
        from reports.render import build_report

        out_dir = build_report(spec, store, out)
        console.print(f"report: {out_dir / 'report.html'}")


@app.command()
def report(
    study: Annotated[str, typer.Argument(help="Study name or study file.")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    report_dir: Annotated[
        Path | None, typer.Option("--report-dir", help="Where to write the report.")
    ] = None,
) -> None:
    """Rebuild a study's report from its storage."""
    from harness.study import (
        StudySpec,
        default_storage_url,
        load_spec_from_storage,
        open_storage,
        stored_study_names,
    )

    try:
        name = _study_name(study)
        url = storage or default_storage_url(StudySpec(name=name), out)
        store = open_storage(url, create_dir=False)
        if name not in stored_study_names(store):
            known = ", ".join(stored_study_names(store)) or "none"
            raise ConfigError(f"report: no study {name!r} in {url} (studies there: {known})")
        spec = load_spec_from_storage(store, name)
    except ConfigError as e:
        raise fail(str(e)) from None
    from reports.render import build_report

    out_dir = build_report(spec, store, out, report_dir)
    console.print(f"report: {out_dir / 'report.html'}")


def _study_name(study: str) -> str:
    """A study given by name, or by its file (whose `name` is read)."""
    if study.endswith((".yaml", ".yml")) or Path(study).is_file():
        from harness.study import load_study

        return load_study(study).name
    return study


@app.command("list")
def list_all() -> None:
    """Tasks, presets, bundled studies and config keys."""
    from harness.config import ExperimentConfig
    from harness.study import bundled_studies_dir
    from harness.tasks import TASKS
    from models.config import PRESETS

    out = Console()
    tasks = Table(title="tasks (task.name)")
    tasks.add_column("name")
    tasks.add_column("options")
    for name, (_, doc) in TASKS.items():
        tasks.add_row(name, doc)
    out.print(tasks)
    presets = Table(title="presets (--preset)")
    presets.add_column("name")
    presets.add_column("model keys")
    for name, keys in PRESETS.items():
        presets.add_row(name, ", ".join(f"{k}={v}" for k, v in keys.items()))
    out.print(presets)
    studies = Table(title="bundled studies (ablate sweep NAME)")
    studies.add_column("name")
    studies.add_column("file")
    for path in sorted(bundled_studies_dir().glob("*.yaml")):
        studies.add_row(path.stem, str(path))
    out.print(studies)
    keys = Table(title="config keys (--set key=value)")
    keys.add_column("key")
    keys.add_column("default")
    for key, value in ExperimentConfig().flat().items():
        keys.add_row(key, repr(value))
    out.print(keys)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
