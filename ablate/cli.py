"""`ablate`: train one run, sweep a study, report on it, list what exists.

Bad input anywhere ends with one line on stderr naming what and where, and exit code 2.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated

import click
import typer
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from ablate.harness.launchers import LAUNCHERS
from ablate.schema.errors import ConfigError
from ablate.schema.text import shown, terminal
from ablate.sweep import (
    PART_LIMIT_S,
    ThreadOptions,
    check_artifacts,
    checked,
    stored_study,
    write_report,
)

console = Console(stderr=True)

RunsOption = Annotated[Path, typer.Option("--out", help="Root folder of study outputs.")]
# From the environment too, so that a password need not sit on a command line (shell history, `ps`).
StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage", envvar="ABLATE_STORAGE", help="SQLAlchemy URL (default: SQLite in runs/<study>/)."
    ),
]
ArtifactsOption = Annotated[
    str | None,
    typer.Option("--artifacts", help="s3://bucket/prefix for trial files (default: runs/<study>/artifacts)."),
]
SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a config key: key=value.")]
# As text: the range is ThreadOptions' (ablate/sweep.py), so that a bad count is one line like every other.
ThreadsOption = Annotated[str | None, typer.Option("--threads", help="CPU threads for torch in this process.")]
# What a launcher starts: the study is the one of that name in the storage, never a file that happens to be
# called so (a study named `x.yaml`, or a file `x` in the working folder).
StoredOption = Annotated[
    bool, typer.Option("--stored", help="STUDY is a study's name in the storage, even where a file is named so.")
]
HOST_NAME = re.compile(r"[\w.-]+")  # a name or an IPv4 address


def host_name(host: str) -> str:
    """--host as a server binds it: a name, an IPv4 or an IPv6 address (without brackets); whether it
    resolves is found when binding."""
    if HOST_NAME.fullmatch(host):
        return host
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"expected a host name or an IP address (got {host!r})") from None
    return host


class Commands(TyperGroup):
    """Every command's errors, in one place: one the user can act on (error_line) is its lines on stderr,
    "error:" each, and its exit code; with ABLATE_DEBUG=1 (--debug) its traceback first. Any other is a
    bug, and raised."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:
            known = error_line(e)
            if known is None:
                raise
            if os.environ.get("ABLATE_DEBUG") == "1":
                traceback.print_exc()
            code, message = known
            for line in message.splitlines():  # a study's problems, one a line
                typer.echo(f"error: {shown(line)}", err=True)
            raise typer.Exit(code) from None


app = typer.Typer(
    cls=Commands, add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False
)


@app.command()
def train(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="[CONFIG.yaml] [key=value ...]: an experiment YAML, then overrides as --set takes "
            "them (the way a W&B sweep agent passes them).",
            show_default=False,
        ),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Named model preset, e.g. transformer.")] = None,
    sets: SetOption = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for config, metrics, checkpoints.")
    ] = None,
    wandb: Annotated[
        str | None,
        typer.Option(
            "--wandb",
            help="online | offline | disabled (default: disabled, except under a W&B "
            "sweep agent: then online with credentials)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print final metrics as one JSON line.")] = False,
) -> None:
    """Train and evaluate one configuration, logged to W&B as one sweep trial is."""
    from ablate.schema.config import load_config, parse_override
    from ablate.training import train_config

    configs = [a for a in args or [] if "=" not in a]
    overrides = [*(sets or []), *(a for a in args or [] if "=" in a)]
    if len(configs) > 1:
        raise ConfigError(f"train: one config file at most (got {', '.join(configs)}); overrides are key=value")
    config_file = configs[0] if configs else None
    cfg = load_config(config_file, preset, overrides)
    result = train_config(
        cfg, config_file=config_file, preset=preset, overrides=dict(parse_override(s) for s in overrides),
        out=out, wandb=wandb, progress=not as_json,
    )  # fmt: skip
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


WandbOption = Annotated[
    str | None, typer.Option("--wandb", help="online | offline | disabled (default: online with credentials)")
]
# The local launcher's options (harness/launchers/local.py), as text: its Options model reads the counts.
WorkersOption = Annotated[str | None, typer.Option("--workers", metavar="N", help="Local CPU worker processes.")]
DevicesOption = Annotated[
    str | None, typer.Option("--devices", help="GPUs to use, e.g. 0,1: worker processes per GPU.")
]
PerDeviceOption = Annotated[str, typer.Option("--per-device", metavar="N", help="Worker processes per GPU.")]
ReportDirOption = Annotated[Path | None, typer.Option("--report-dir", help="Where to write the report.")]


@app.command()
def sweep(
    study: Annotated[str, typer.Argument(help="Study file (or the name of a bundled one).")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    workers: WorkersOption = None,
    devices: DevicesOption = None,
    per_device: PerDeviceOption = "1",
    wandb: WandbOption = None,
    sets: SetOption = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="Study-file profile, e.g. cpu or gpu (default: the first)."),
    ] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the report at the end.")] = False,
    artifacts: ArtifactsOption = None,
    allow_large: Annotated[
        bool, typer.Option("--allow-large", help="Run a study of more than 10,000 trials.")
    ] = False,
    launcher: Annotated[
        str | None,
        typer.Option("--launcher", help=f"Start the workers with {' or '.join(LAUNCHERS)} (default: local)."),
    ] = None,
    launch: Annotated[
        list[str] | None,
        typer.Option("--launch", help="A launcher setting, key=value (the study's launcher block's keys)."),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option("--time-limit", metavar="SECONDS", help="Checkpoint every trial and stop after this "
                     "long (exit 75); the same command continues. `ablate plan` counts such commands."),  # fmt: skip
    ] = None,
) -> None:
    """Tune (if the study says so) and run every variant x seed of a study, then write its report.

    Resumes what the storage holds: finished trials are kept, interrupted ones run again. With --launcher,
    a scheduler starts the workers (README: Run on a cluster)."""
    from ablate.harness import signals
    from ablate.schema.config import parse_override
    from ablate.sweep import SweepOptions
    from ablate.sweep import sweep as run_sweep

    # The numbers arrive as text, so that the options' one schema checks them, as it does the API's.
    options = checked(SweepOptions, {
        "storage": storage, "out": out, "workers": workers, "devices": devices, "per_device": per_device,
        "wandb": wandb, "artifacts": artifacts, "allow_large": allow_large, "report": not no_report,
        "launcher": launcher, "launch": tuple(launch or ()), "time_limit": time_limit,
    }, from_text=True)  # fmt: skip
    # --set changes the study's fixed keys for every trial (e.g. train.max_steps=50).
    overrides = dict(parse_override(s) for s in sets or [])
    run_sweep(study, profile, overrides, options, console, stop_on_signals=True)
    if signals.received():
        typer.echo(f"{signals.received().name}: workers checkpointed their trials and stopped; "
                   "the same command resumes them", err=True)  # fmt: skip
        raise typer.Exit(code=signals.exit_code(signals.received()))


@app.command()
def worker(
    study: Annotated[str, typer.Argument(help="Study file or name of a study in the storage.")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    wandb: WandbOption = None,
    threads: ThreadsOption = None,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="No report, even when this worker finishes the study.")
    ] = False,
    artifacts: ArtifactsOption = None,
    stored: StoredOption = False,
) -> None:
    """Join a study: run its queued trials until none is left (any machine that reaches the storage); the
    worker that finishes the study's last trial writes its report.

    SIGTERM, SIGUSR1 or Ctrl-C: the running trial checkpoints and waits again; the same command resumes it."""
    from ablate.worker import work

    threads = checked(ThreadOptions, {"threads": threads}, from_text=True).threads
    done = work(study, storage, out, wandb, artifacts, threads, stored, not no_report, console)
    if done.stopped:
        typer.echo(f"worker: {done.stopped}", err=True)
        raise typer.Exit(code=done.stop_code)


@app.command()
def status(
    study: Annotated[str, typer.Argument(help="Study name or study file.")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    stored: StoredOption = False,
) -> None:
    """Progress of a study, per variant: done, running, failed, pruned, time spent and left; with adaptive
    seeds, each claim's look and verdict."""
    from ablate.harness.study.looks import next_look
    from ablate.harness.study.queue import study_progress, time_left_s

    spec, store = stored_study("status", study, storage, out, stored=stored)
    rows = study_progress(spec, store)
    table = Table(title=terminal(spec.name))
    columns = ["variant", *(["tune"] if spec.tune else []), "done", "running", "failed", "pruned", "elapsed"]
    for column in columns:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in rows:
        tune = [f"{r.tune_done}/{r.tune_total}"] if spec.tune else []
        table.add_row(terminal(r.variant), *tune, f"{r.done}/{r.total}", str(r.running), str(r.failed), str(r.pruned),
                      _duration(r.elapsed_s))  # fmt: skip
    out_console = Console()
    out_console.print(table)
    if spec.adaptive:
        out_console.print(looks_table(spec, store))
    running = sum(r.running for r in rows)
    left = time_left_s(rows, running)
    if spec.adaptive and all(r.finished for r in rows) and next_look(spec, store) is not None:
        out_console.print("between looks: a worker queues the next look's seeds when it runs")
    elif all(r.finished for r in rows):
        out_console.print("finished")
    elif left is not None:
        out_console.print(f"about {_duration(left)} left with {max(1, running)} worker(s) running")


def looks_table(spec, store) -> Table:
    """Adaptive seeds: per claim, tests of published findings first and then checks of mechanisms, the look
    it stands at (seeds per variant) and its verdict so far; the caption counts each kind's verdicts."""
    from ablate.analysis.claims import tally, tests_first
    from ablate.harness.study.looks import judge

    results = judge(spec, store)
    looks = " ".join(map(str, spec.seed_looks))
    table = Table(title=f"looks at {looks} seeds per variant, claim CIs at {100 * results[0].level:.1f}%"
                  if results else f"looks at {looks} seeds per variant", caption=tally(results) or None)  # fmt: skip
    for column in ("kind", "claim", "look", "seeds", "verdict", "decided"):
        table.add_column(column, justify="right" if column in ("look", "seeds") else "left")
    for r in tests_first(results):
        table.add_row(r.kind, terminal(r.claim.text), f"{r.look + 1}/{r.looks}", str(r.seeds), r.verdict,
                      terminal(r.decision))  # fmt: skip
    return table


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class ServeOptions(BaseModel):
    """Where `ablate dashboard` serves, checked (`checked`) before anything opens, as SweepOptions are."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    host: Annotated[str, AfterValidator(host_name)]
    port: int = Field(ge=1, le=65535)


@app.command()
def dashboard(
    study: Annotated[str | None, typer.Argument(help="Study name or file (for its default storage).")] = None,
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    host: Annotated[str, typer.Option("--host", help="Address to serve on.")] = "127.0.0.1",
    port: Annotated[str, typer.Option("--port", metavar="PORT", help="Port to serve on.")] = "8080",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be served (password masked), serve nothing.")
    ] = False,
    artifacts: ArtifactsOption = None,
) -> None:
    """optuna-dashboard on the study storage, with the trials' artifacts."""
    from ablate.dashboard import find
    from ablate.harness.study.storage import masked_url

    serve = checked(ServeOptions, {"host": host, "port": port}, from_text=True)
    board = find(study, storage, out, artifacts)
    if dry_run:
        print(f"optuna-dashboard on http://{serve.host}:{serve.port}: storage {masked_url(board.storage)}, "
              f"artifacts {board.files()}")  # fmt: skip
        return
    board.serve(serve.host, serve.port, console)


@app.command()
def report(
    study: Annotated[str, typer.Argument(help="Study name or study file.")],
    storage: StorageOption = None,
    out: RunsOption = Path("runs"),
    report_dir: ReportDirOption = None,
    artifacts: ArtifactsOption = None,
) -> None:
    """Rebuild a study's report from its storage (and its trials' files in the artifact store)."""
    import time

    start = time.perf_counter()
    spec, store = stored_study("report", study, storage, out, read_only=False)  # it writes the notes
    check_artifacts(artifacts)
    html = write_report(spec, store, out, None, artifacts, None, report_dir)
    console.print(terminal(f"report built in {time.perf_counter() - start:.1f} s: {html}"))


@app.command()
def compare(
    first: Annotated[str, typer.Argument(help="A study's name or file: the first run.")],
    second: Annotated[str, typer.Argument(help="The second run: the same study elsewhere, or another.")],
    storage: Annotated[
        list[str] | None,
        typer.Option(
            "--storage",
            envvar="ABLATE_STORAGE",
            help="SQLAlchemy URL, once for both runs or twice: the first's, then the second's.",
        ),
    ] = None,
    out: Annotated[
        list[Path] | None,
        typer.Option("--out", help="Root folder of study outputs, once for both runs or twice, one each."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as one JSON object.")] = False,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", metavar="FILE", help="Also write the tables as Markdown.")
    ] = None,
) -> None:
    """Two runs side by side (a study and its re-run on fresh seeds, its CPU and GPU profiles): each claim's
    verdict, Δ with its CI, margin and seeds in each run and whether the verdict changed; each variant's
    mean of the study metric."""
    from ablate.comparison import compare_stored, per_run
    from ablate.reports import compare as written

    storages, outs = per_run("--storage", storage), per_run("--out", out, Path("runs"))
    result = compare_stored("compare", (first, second), storages, outs)
    if markdown is not None:  # before anything is printed: a file that cannot be written is one line
        written.write_markdown(result, markdown)
    if as_json:
        print(json.dumps(written.as_json(result)))
    else:
        written.show(result, Console())


@app.command()
def bench(
    device: Annotated[
        str | None, typer.Option("--device", help="cpu | cuda (default: cuda if present).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes, a few seconds per figure.")] = False,
    threads: ThreadsOption = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print each figure as a JSON line when it is measured, then the whole run."),
    ] = False,
    only: Annotated[
        str | None, typer.Option("--only", help="Comma-separated figure keys (a_transformer_step,j_compile,...)."),
    ] = None,
) -> None:
    """Throughput of the fast paths against their references (bench/__init__.py says what each figure is).
    Each figure is printed as soon as it is measured, so a run stopped early keeps what finished."""
    from ablate.bench import run as benchmarks

    resolved = benchmarks.resolve_device(device)
    keys = benchmarks.chosen(only)
    threads = checked(ThreadOptions, {"threads": threads}, from_text=True).threads
    if threads:
        import torch

        torch.set_num_threads(threads)

    def done(figure: dict) -> None:
        print(json.dumps({"figure": figure}) if as_json else benchmarks.figure_line(figure), flush=True)

    result = benchmarks.run_bench(
        resolved, quick, progress=lambda what: console.print(f"measuring {what}"), done=done, only=keys
    )
    if as_json:
        print(json.dumps(result))
    else:
        benchmarks.print_table(result)


@app.command()
def check(
    args: Annotated[
        list[str] | None,
        typer.Argument(help="key=value ...: the model to check, e.g. model.score=quarter (a plug-in's name).",
                       show_default=False),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Named model preset, e.g. transformer.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="cpu | cuda (default: cuda if present).")] = None,
) -> None:
    """Conformance checks of the model a config builds, its plug-ins included: shapes, padding, the causal
    mask, finite gradients, determinism, fused seeds equal to each alone, and each entry against the formula
    it gives, in float64 (harness/conformance.py). Exit 1 when one fails."""
    from ablate.bench.run import resolve_device
    from ablate.harness.conformance import check as conformance
    from ablate.schema.config import load_config, task_for_model

    args = list(args or [])
    if not any(a.startswith("task.name=") for a in args):  # the checks read the model alone
        args.append(f"task.name={task_for_model(preset, args)}")
    cfg = load_config(None, preset, args).model
    resolved = resolve_device(device)
    Console().print(f"on {resolved}")
    failed = 0
    for outcome in conformance(cfg, resolved):
        failed += not outcome.passed
        Console().print(terminal(str(outcome)))
    if failed:
        raise typer.Exit(code=1)


@app.command()
def plan(
    study: Annotated[str, typer.Argument(help="Study file (or the name of a bundled one).")],
    profile: Annotated[
        str | None, typer.Option("--profile", help="Study-file profile, e.g. gpu (default: the first).")
    ] = None,
    sets: SetOption = None,
    device: Annotated[str, typer.Option("--device", help="The device it would run on: h100.")] = "h100",
    time_limit: Annotated[
        float, typer.Option("--time-limit", metavar="SECONDS", help="A command's `ablate sweep --time-limit`.")
    ] = PART_LIMIT_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as one JSON object.")] = False,
) -> None:
    """What a study would cost on one GPU, before it runs: each variant's steps counted on this CPU at the
    study's own batches, in seconds from steps measured on that GPU (harness/study/cost.py), and how many
    `ablate sweep --time-limit` commands run it, each continuing the last."""
    from ablate.harness.study.cost import DEVICES, estimate, training_s
    from ablate.harness.study.validate import MAX_TRIALS, load_study
    from ablate.schema.config import parse_override

    if device not in DEVICES:
        raise ConfigError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    training_s(time_limit)  # a limit that leaves nothing to train, refused before the study is priced
    spec = load_study(study, profile, dict(parse_override(s) for s in sets or []), MAX_TRIALS)
    found = estimate(spec, device)
    # A line to paste into a shell: the study quoted, after `--` where it would read as an option.
    options = [*(["--profile", profile] if profile else []), "--time-limit", f"{time_limit:g}"]
    command = shlex.join(["ablate", "sweep", *options, *(["--"] if study.startswith("-") else []), study])
    if as_json:
        print(json.dumps({**found.summary(time_limit), "command": command}))
        return
    table = Table("variant", "runs x seeds", "steps", "a step", "evaluating", "in all")
    for g in found.groups:
        runs = f"{g.phase} {g.count} x {g.seeds}{' fused' if g.seeds > 1 else ''}"
        step = f"{g.step_s * 1e3:.1f} ms {'graph' if g.captured else 'eager'}"
        table.add_row(terminal(g.variant), runs, f"{g.steps:,}", step, _duration(g.validation_s + g.test_s),
                      _duration(g.total_s))  # fmt: skip
    Console().print(table)
    for line in found.lines(time_limit, command):
        Console().print(terminal(line))


@app.command("list")
def list_all() -> None:
    """Tasks, presets, bundled studies and config keys."""
    from ablate.models.config import PRESETS
    from ablate.schema.config import ExperimentConfig, accepted_values
    from ablate.schema.spec import bundled_studies_dir
    from ablate.schema.tasks import TASKS

    out = Console()
    tasks = Table(title="tasks (task.name)")
    tasks.add_column("name")
    tasks.add_column("options")
    for name, task in TASKS.items():
        tasks.add_row(name, task.doc)
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
    keys.add_column("accepts")
    accepts = accepted_values()
    for key, value in ExperimentConfig().flat().items():
        keys.add_row(key, repr(value), accepts[key])
    out.print(keys)
    from ablate.models import plugins

    if plugins.PACKAGES or plugins.FAULTS:
        found = Table(title="plug-ins (entry points of installed packages)")
        for column in ("key", "name", "package", "status"):
            found.add_column(column)
        for (key, name), package in sorted(plugins.PACKAGES.items()):
            found.add_row(plugins.config_key(key), terminal(name), terminal(package), "loaded")
        for (key, name), why in sorted(plugins.FAULTS.items()):
            found.add_row(plugins.config_key(key), terminal(name), "", terminal(f"not loaded: {why}"))
        out.print(found)


@app.callback()
def options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback behind an error (also: ABLATE_DEBUG=1).")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", help="Show what Optuna, Lightning and W&B log and warn (also: ABLATE_VERBOSE=1)."
        ),
    ] = False,
) -> None:
    from ablate.harness import chatter

    # The worker processes a sweep starts inherit both.
    if debug:
        os.environ["ABLATE_DEBUG"] = "1"
    if verbose:
        os.environ[chatter.VERBOSE_ENV] = "1"
    chatter.quiet_libraries()


# errno values that are a fault of the machine during the run, not of what the user gave: exit 1, not 2
RUN_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM}


def error_line(e: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for an error the user can act on; None for a bug (its traceback is shown)."""
    from ablate.schema.errors import RunFailed, TimeLimit

    if isinstance(e, ConfigError):
        return 2, str(e)
    if isinstance(e, RunFailed):
        return 1, str(e)
    if isinstance(e, TimeLimit):
        return TimeLimit.EXIT, str(e)
    smaller = "; a smaller train.batch_size or model needs less"
    torch = sys.modules.get("torch")  # without torch loaded, nothing ran out of device memory
    if torch is not None and isinstance(e, torch.cuda.OutOfMemoryError):
        # The allocator's first sentences (what it tried to allocate, what was free); the rest is advice on
        # its settings, over several lines.
        sentences = " ".join(str(e).split()).split(". ")
        return 1, ". ".join(sentences[:3]).rstrip(".") + smaller
    # torch's CPU allocator: "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't
    # allocate memory (or: not enough memory): you tried to allocate 8589934592 bytes. Error code 12 (...)"
    cpu = isinstance(e, RuntimeError) and re.search(r"DefaultCPUAllocator: .*?allocate (\d+) bytes", str(e))
    if cpu:
        size = int(cpu[1])
        amount = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"
        return 1, f"CPU out of memory. Tried to allocate {amount}{smaller}"
    if isinstance(e, MemoryError):  # Python's says nothing; numpy's names the array it could not allocate
        return 1, f"out of memory{f': {e}' if str(e) else ''}{smaller}"
    storage = sys.modules.get("ablate.harness.study.storage")  # no storage opened: no lock held
    if storage is not None and any(storage.lock_held(c) for c in storage.chain(e)):
        # A lock taken after the storage was opened (opening checks for one): its statement gave up.
        return 1, f"storage locked by another process; gave up after {storage.LOCK_WAIT_S} s"
    if isinstance(e, OSError):
        from ablate.harness.study.validate import os_reason

        # A path the system refuses (not a folder, no permission, name too long): the path and the reason.
        where = f"{e.filename}: " if e.filename else ""
        return (1 if e.errno in RUN_FAULTS else 2), f"{where}{os_reason(e)}"
    return None


def main() -> None:
    """The console script: `app`, ended at once after a stop signal."""
    from ablate.harness import signals

    try:
        app()
    except SystemExit as done:
        if signals.received() is None:
            raise
        # Stopped by a signal, everything written: end now. Tearing down torch, Lightning and the storage's
        # engine takes seconds on a starved machine, and the scheduler's SIGKILL does not wait for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code if isinstance(done.code, int) else 1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
