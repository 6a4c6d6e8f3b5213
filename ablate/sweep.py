"""Running a study, for `ablate sweep` and the Python API alike: every check before anything is created,
the storage, the workers its launcher starts (harness/launchers; local processes by default), their
progress and the report; and a study already in a storage. Errors: ConfigError for bad input (before
anything is created), RunFailed for a fault during the run, TimeLimit for a run stopped at its time limit."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from ablate.harness.launchers import local
from ablate.harness.signals import STOP_GRACE_S
from ablate.schema.config import one_line, validation_problems
from ablate.schema.errors import ConfigError, RunFailed, TimeLimit
from ablate.schema.text import shown, terminal

if TYPE_CHECKING:
    from ablate.harness.launchers import Launch
    from ablate.schema.spec import StudySpec

Options = TypeVar("Options", bound=BaseModel)
# The --time-limit of a part of a long study on a machine lent for 9-minute commands: its workers' checkpoint
# (STOP_GRACE_S) and the report still end it within 9 minutes. `ablate plan` counts such parts.
PART_LIMIT_S = 500.0


class SweepOptions(local.Options):
    """`ablate sweep`'s options (the command line's flags or the Python API's arguments), built by `checked`;
    --workers, --devices and --per-device, with their ranges, are the local launcher's (local.Options)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    storage: str | None = None  # SQLAlchemy URL; None: SQLite in <out>/<study>/
    out: Path = Path("runs")
    wandb: str | None = None  # online | offline | disabled; None: online with credentials
    artifacts: str | None = None  # s3://bucket/prefix; None: <out>/<study>/artifacts
    allow_large: bool = False
    report: bool = True
    launcher: str | None = None  # harness/launchers: slurm | ray | local; None: local, with the flags above
    launch: tuple[str, ...] = ()  # the launcher's settings, key=value, over the study file's launcher block
    # Seconds after which the workers checkpoint their trials and stop (TimeLimit); the same call continues.
    time_limit: Annotated[float, Field(gt=0)] | None = None


class ThreadOptions(BaseModel):
    """`--threads` of `ablate worker` and `ablate bench`: torch's CPU threads in that process."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    threads: local.Count | None = None


def checked(schema: type[Options], values: dict[str, Any], from_text: bool = False) -> Options:
    """`values` validated by `schema` (strictly for the API's Python values, from text for the command
    line's), or a ConfigError naming each option as its flag (`--per-device: ...`) before anything is made."""
    try:
        return schema.model_validate(values, strict=not from_text)
    except ValidationError as e:
        problems = [(f"--{loc.replace('_', '-')}", msg) for loc, msg in validation_problems(e)]
        raise ConfigError(one_line(problems), problems) from None


def check_artifacts(location: str | None, reach: bool = False) -> None:
    """--artifacts: an s3:// URL with a bucket, and boto3 to reach it; `reach`: the bucket answers (before a
    sweep or a worker trains anything whose files it could not keep)."""
    from ablate.harness.artifacts import parse_s3_url, s3_problem
    from ablate.harness.extras import require

    if location is None:
        return
    try:
        parse_s3_url(location)
    except ValueError as e:
        raise ConfigError(f"--artifacts: {e}") from None
    require("boto3", extra="s3", feature="--artifacts s3://")
    if reach and (reason := s3_problem(location)):
        raise ConfigError(f"--artifacts: {location}: {reason}")


def load_sweep(
    study: str | Path, profile: str | None, sets: dict[str, Any] | None, options: SweepOptions
) -> tuple[StudySpec, Launch]:
    """The study file (or bundled name) with its profile and `sets` added to its fixed keys, and the launcher
    to start its workers, checked with the options (local workers against this machine): every problem in
    one ConfigError, before anything is created. The file is read once, for its launcher block and study."""
    from ablate.harness.launchers import plan
    from ablate.harness.study.validate import MAX_TRIALS, load_study, raise_problems, read_study, run_problems

    path, tree, unread = study, {}, None
    try:
        path, tree = read_study(study)
    except ConfigError as e:
        unread = e  # raised after the command line's own checks, as the study's other problems are
    here = options.model_dump(include=set(local.Options.model_fields))
    launch, problems = plan(options.launcher, str(study), list(options.launch), here, tree.get("launcher"))
    check_artifacts(options.artifacts, reach=True)
    # The flags --workers, --devices and --per-device are the local launcher's options: it checks them.
    processes = local.problems(options, options.storage, options.out)
    problems = [*run_problems(options.out, options.storage, options.wandb), *processes, *problems]
    if options.launcher and (options.workers or options.devices):
        problems.append(("--workers", "local processes only; with --launcher, --launch workers=N"))
    if unread is not None:
        raise_problems("", [], processes)
        raise unread
    spec = load_study(path, profile, sets, None if options.allow_large else MAX_TRIALS, problems, tree=tree)
    return spec, launch


def size_line(spec: StudySpec):
    """'quickstart: 3 variants x 2 seeds: 6 trials', a Rich Text, the name in bold (never read as markup)."""
    from rich.text import Text

    from ablate.harness.study.validate import seed_count, trial_count, variant_count

    seeds = f"{spec.adaptive.min}-{spec.adaptive.max} adaptive" if spec.adaptive else seed_count(spec)
    tuned = "of the baseline" if spec.tune and spec.tune.arm == "baseline" else "per variant"
    tune = f", {spec.tune.trials} tune trials {tuned}" if spec.tune else ""
    trials = f"{trial_count(spec):,} trials{' at most' if spec.adaptive else ''}"
    return Text.assemble(
        (shown(spec.name), "bold"), f": {variant_count(spec)} variants x {seeds} seeds{tune}: {trials}"
    )


def sweep(
    study: str | Path,
    profile: str | None,
    sets: dict[str, Any] | None,
    options: SweepOptions,
    console: Console,
    stop_on_signals: bool,
) -> Path | None:
    """Tunes (if the study says so) and runs every variant x seed in the workers its launcher starts (local
    processes unless `options.launcher` names another), resuming what the storage holds, then writes the
    report; returns its HTML file (None without one, or at once when a scheduler took the workers: the
    worker that finishes the study writes the report). `stop_on_signals` (the command line): stop signals
    (harness/signals.py) are noted and forwarded to the workers, which checkpoint their trials; this then
    returns None and signals.received() says which. Otherwise Ctrl-C (KeyboardInterrupt, as in a notebook)
    stops the workers the same way and is raised again. Either way the same call resumes the study."""
    from ablate.harness import signals, tracking
    from ablate.harness.artifacts import check_run_folder, default_storage_url
    from ablate.harness.launchers.commands import NO_SPACE_EXIT, STORAGE_FULL_EXIT
    from ablate.harness.study.looks import next_look
    from ablate.harness.study.queue import study_progress
    from ablate.harness.study.storage import masked_url
    from ablate.harness.study.validate import raise_problems

    spec, launch = load_sweep(study, profile, sets, options)
    if options.time_limit is not None and (options.launcher or "local") != "local":
        raise ConfigError(f"--time-limit: stops the workers this command starts (the local launcher); "
                          f"{options.launcher}'s scheduler holds its own time limit")  # fmt: skip
    # The size before anything is created; on stdout, so stderr stays one line if opening fails next.
    Console().print(size_line(spec))
    mode = tracking.resolve_mode(options.wandb)  # type: ignore[arg-type]
    url = options.storage or default_storage_url(spec.slug, options.out)
    raise_problems("", [], launch.problems(url, options.out))
    check_run_folder(spec.slug, options.out)
    store = join_study(study, spec, url)
    procs = launch.start(spec, url, options.out, mode, options.artifacts)
    if procs is None:  # a scheduler runs them now
        return None
    if stop_on_signals:
        signals.install(then=lambda signum: forward_signal(procs, signum))
    deadline = None if options.time_limit is None else time.monotonic() + options.time_limit
    try:
        timed_out = watch_workers(spec, store, procs, console, deadline)
    except KeyboardInterrupt:
        console.print(
            "interrupted: workers checkpointed their trials and stopped; the same call resumes them"
        )
        raise
    if signals.received():
        return None
    if timed_out:
        # Trials left, or none but an adaptive look's seeds still to queue (the workers stopped between looks).
        left = sum(r.remaining for r in study_progress(spec, store))
        if left or next_look(spec, store) is not None:
            what = f"{left} trial(s)" if left else "a look's seeds"
            raise TimeLimit(f"--time-limit {options.time_limit:g} s reached with {what} left: the workers "
                            "checkpointed theirs; the same command continues")  # fmt: skip
    full = {NO_SPACE_EXIT: f"--out: no space left on device under {options.out}",
            STORAGE_FULL_EXIT: f"--storage: no space left on device for {masked_url(url)}"}  # fmt: skip
    for code, where in full.items():
        if code in [p.returncode for p in procs]:
            raise RunFailed(f"{where}; free some, then run the same command")
    # A worker the time limit stopped as the last trial finished exits as SLURM's warning makes it exit.
    stopped = signals.exit_code(signal.SIGUSR1) if timed_out else 0
    crashed = [p.returncode for p in procs if p.returncode not in (0, stopped)]
    report = write_report(spec, store, options.out, mode, options.artifacts, console) if options.report else None
    if crashed:
        raise RunFailed(f"{len(crashed)} worker(s) exited with an error (codes {crashed})")
    return report


def write_report(
    spec: StudySpec, store, out: Path, mode: str | None, artifacts: str | None, console: Console | None,
    folder: Path | None = None,
) -> Path:  # fmt: skip
    """Writes the study's report (reports/render.py) to `folder` (default: report/ under `out`), as a sweep,
    the worker that finishes a study, `ablate report` and the API do; its HTML file, named on `console`."""
    from ablate.harness.artifacts import REPORT_HTML
    from ablate.reports.render import build_report

    html = build_report(spec, store, out, folder, wandb_mode=mode, artifact_location=artifacts) / REPORT_HTML
    if console is not None:
        console.print(terminal(f"report: {html}"))
    return html


def watch_workers(spec: StudySpec, store, procs, console: Console, deadline: float | None = None) -> bool:
    """A progress bar per phase until every worker has exited, or for at most 25 s after a stop signal
    (Ctrl-C as KeyboardInterrupt is forwarded to the workers first) or the `deadline` (time.monotonic()),
    where the workers are sent SLURM's warning of a time limit (SIGUSR1) and checkpoint. True: the deadline
    stopped them."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ablate.harness import signals
    from ablate.harness.study.queue import study_progress, time_left_s

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[left]}")]  # fmt: skip
    # Rich's live display in Jupyter needs ipywidgets; one output updated in place needs nothing more.
    progress = Progress(*columns, console=console, disable=console.is_jupyter)
    notebook = _notebook_output(progress) if console.is_jupyter else None
    try:
        with progress:
            tasks = {}
            while True:
                rows = study_progress(spec, store)
                left = time_left_s(rows, len(procs))
                fields = {"left": f"~{left / 60:.1f} min left" if left is not None else ""}
                counts = {
                    "eval": (sum(r.done + r.failed + r.pruned for r in rows), sum(r.total for r in rows))
                }
                if spec.tune:
                    counts = {
                        "tune": (sum(r.tune_done for r in rows), sum(r.tune_total for r in rows)),
                        **counts,
                    }
                for phase, (done, total) in counts.items():
                    if phase not in tasks:
                        tasks[phase] = progress.add_task(phase, total=total, left="")
                    progress.update(tasks[phase], completed=done, total=total, **fields)
                if notebook is not None:
                    notebook.update(progress)
                if all(p.poll() is not None for p in procs):
                    return False
                if signals.received():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    forward_signal(procs, signal.SIGUSR1)
                    return True
                time.sleep(2)
    except KeyboardInterrupt:
        forward_signal(procs, signal.SIGINT)
        raise
    finally:
        stop_workers(procs)


def forward_signal(procs, signum: signal.Signals) -> None:
    """A stop signal for the sweep (SIGTERM from a scheduler) reaches its workers, which checkpoint."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signum)


def stop_workers(procs, grace_s: float = STOP_GRACE_S) -> None:
    """After a stop signal (forwarded to them) the workers are checkpointing their trials; wait, then kill
    what is left (its trial resumes from its last periodic checkpoint through the heartbeat)."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _notebook_output(progress):
    """A notebook output showing `progress` (a rich renderable), to update in place."""
    from IPython.display import display

    return display(progress, display_id=True)


def join_study(study: str, spec: StudySpec, url: str):
    """The storage at `url`, opened (created where it is new) with the study `spec` queued in it: the one
    way `ablate sweep`, `ablate worker STUDY_FILE` and Study.run join a study from its file. A study of that
    name stored with another spec is refused (ConfigError), since every worker runs the stored one."""
    from ablate.harness.study.queue import prepare_study
    from ablate.harness.study.storage import check_readable, masked_url, open_storage

    store = open_storage(url, heartbeat=spec.heartbeat)
    check_readable(store, url, spec.name)
    stored = prepare_study(spec, store)
    if stored != spec:
        changed = ", ".join(k for k in type(spec).model_fields if getattr(stored, k) != getattr(spec, k))
        raise ConfigError(
            f"{study}: {masked_url(url)} already holds study {spec.name!r} with a different {changed}; "
            "rename the study or give another --out / --storage"
        )
    return store


def stored_study(
    command: str, study: str, storage: str | None, out: Path, read_only: bool = True, stored: bool = False
):
    """The stored spec and storage of a study that exists there, by name or file (`stored`: by name, whatever
    files there are), its data read once (check_readable); `read_only` unless the command writes (notes)."""
    from ablate.harness.artifacts import default_storage_url
    from ablate.harness.study.queue import load_spec_from_storage, stored_study_names
    from ablate.harness.study.storage import check_readable, masked_url, open_storage
    from ablate.schema.names import slugify

    name = study if stored else study_name(study)
    url = storage or default_storage_url(slugify(name), out)
    store = open_storage(url, create_dir=False, read_only=read_only)
    check_readable(store, url, name)
    known = stored_study_names(store)
    if name not in known:
        raise ConfigError(
            f"{command}: no study {name!r} in {masked_url(url)} (studies there: {', '.join(known) or 'none'})"
        )
    return load_spec_from_storage(store, name), store


def is_study_file(study: str) -> bool:
    return study.endswith((".yaml", ".yml")) or Path(study).is_file()


def study_name(study: str) -> str:
    """A study given by name, or by its file (whose `name` is read: the file alone, not its data, which a
    study's report or status does not need)."""
    if is_study_file(study):
        from ablate.harness.study.validate import load_study

        return load_study(study, read_data=False).name
    return study
