"""SLURM: the study's workers as a job array submitted with sbatch.

Each array task runs `workers` `ablate worker` processes (one `srun` step, `--ntasks`) until the queue is
empty; the one that finishes the study writes its report. The storage URL reaches the tasks only as
ABLATE_STORAGE in the job's environment (`sbatch --export=ALL`). SLURM's time-limit warning
(`--signal=USR1@<warning>`) or a SIGTERM (preemption, `scancel --signal=TERM`) makes each worker checkpoint
its trial and queue it again (harness.signals); the task then asks for its own requeue (`scontrol requeue`)
and ends cleanly, so the trial resumes in whichever task claims it first. Trials run in Lightning's plain
environment (harness/trial.py), so Lightning's own SLURM requeue never competes with this one.

Every sbatch option goes on sbatch's command line, none in an `#SBATCH` line: sbatch parses such a line
itself, ending it at a '#' and taking quotes and blanks as its own, so a path or a name there would not
arrive intact. The script is shell only, every value in it quoted."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from ablate.harness.launchers import Problem
from ablate.harness.launchers.commands import python_command, worker_args
from ablate.schema.errors import RunFailed

STOPPED = (128 + 10, 128 + 15)  # a worker's exit after SIGUSR1 or SIGTERM (harness.signals.exit_code)

SCRIPT = """\
#!/bin/bash
# Written by `ablate sweep --launcher slurm` for study {name}: each array task runs its workers until the
# study's queue is empty. Its sbatch options were given on sbatch's command line (scontrol show job lists
# them). The storage URL is ABLATE_STORAGE in the job's environment, never in this file.
{gpus}
srun --kill-on-bad-exit=0 {run}
code=$?
# SIGUSR1 (the time limit is near) or SIGTERM stopped the workers, whose trials are checkpointed and queued
# again: the task asks to come back for what is left (another task may claim it first) and ends cleanly.
case $code in
  {stopped}) scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"; exit 0 ;;
esac
exit $code
"""
# Several GPUs in a task: each worker sees one, `per` workers to a GPU, by its rank on the node.
ONE_GPU_EACH = (
    "bash -c 'gpus=(${{CUDA_VISIBLE_DEVICES//,/ }}); "
    'export CUDA_VISIBLE_DEVICES=${{gpus[SLURM_LOCALID / {per}]}}; exec "$@"\' worker '
)
# sbatch options an `sbatch` item cannot give (the launcher's own, with the key that sets each, and those
# that would submit something else or nothing); sbatch takes any unambiguous prefix, so prefixes are refused
# too. `--gres` stays open: an item after the launcher's options retypes its GPU, e.g. --gres=gpu:a100:1.
RESERVED = {
    "array": "tasks", "ntasks": "workers", "cpus-per-task": "cpus", "partition": "partition", "time": "time",
    "signal": "warning", "nodes": None, "requeue": None, "job-name": None, "output": None, "open-mode": None,
    "chdir": None, "export": None, "parsable": None, "wrap": None, "test-only": None, "help": None,
    "usage": None, "version": None, "no-requeue": None, "wait": None, "export-file": None,
    "get-user-env": None,
}  # fmt: skip
# sbatch's options that take no value (or only an optional `=value`): any other item must carry its
# `=value`, or sbatch would take the next argument, the batch script's path, as its value.
FLAGS = {"contiguous", "exclusive", "hold", "ignore-pbs", "no-kill", "overcommit", "oversubscribe", "quiet",
         "reboot", "spread-job", "use-min-nodes", "verbose", "nice", "propagate"}  # fmt: skip
OPTION = re.compile(r"--([a-z][a-z0-9-]*)(=.*)?", re.DOTALL)
MAX_ARRAY = 4_000_000  # the most tasks: SLURM's MaxArraySize is at most 4000001
# sbatch gets no stdin (it would read a batch script from ours); its answers are text whatever the encoding.
SBATCH_IO = {"stdin": subprocess.DEVNULL, "capture_output": True, "text": True, "errors": "replace"}


class Options(BaseModel):
    """The study file's `launcher: {slurm: {...}}` keys, and `--launch key=value`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    tasks: int = Field(1, ge=1, le=MAX_ARRAY)  # array tasks (--array=0-<tasks - 1>)
    workers: PositiveInt = 1  # worker processes per task (--ntasks): with gpus, spread evenly over them
    gpus: NonNegativeInt = 0  # GPUs per task (--gres=gpu:<gpus>); workers / gpus share each one
    cpus: PositiveInt = 1  # CPUs per worker (--cpus-per-task), also its torch threads
    partition: str | None = None
    time: str | None = None  # --time, e.g. "4:00:00" (quoted in YAML, which reads 4:00:00 as a number)
    warning: int = Field(90, ge=1, le=65535)  # seconds before the time limit that SIGUSR1 comes (sbatch's)
    timeout: float = Field(10.0, gt=0, le=600)  # seconds sbatch has to answer, checked and submitting
    sbatch: list[str] = Field(default_factory=list)  # more options, e.g. ["--mem=16G", "--account=lab"]
    single_node: bool = False  # every task runs on the machine that holds the SQLite file (SQLite storage)

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v):
        if isinstance(v, int | float) and not isinstance(v, bool):
            raise ValueError(f'quote it, e.g. "4:00:00" (got the number {v}; YAML reads 4:00:00 as 14400)')
        return v

    @field_validator("partition", "time")
    @classmethod
    def _one_word(cls, v: str | None) -> str | None:
        if v is not None and (not v or " " in v or not v.isprintable()):
            raise ValueError(f"expected one word (got {v!r})")
        return v

    @field_validator("sbatch")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for item in v:
            option = OPTION.fullmatch(item)
            if option is None or not item.isprintable():
                raise ValueError(f"each item is one sbatch option, --name or --name=value, e.g. --mem=16G "
                                 f"(got {item!r})")  # fmt: skip
            reserved = [name for name in RESERVED if name.startswith(option[1])]
            if reserved:
                key = RESERVED[reserved[0]]
                decides = f"the key {key} sets" if key else "the launcher decides"
                raise ValueError(f"{item!r}: {decides} --{reserved[0]}")
            if option[2] is None and option[1] not in FLAGS:
                raise ValueError(f"{item!r}: give its value as {item}=VALUE (flags without one: "
                                 f"{', '.join(sorted(FLAGS))})")  # fmt: skip
        return v

    @model_validator(mode="after")
    def _spread(self) -> Options:
        if self.gpus and self.workers % self.gpus:
            raise ValueError(f"workers: {self.workers} workers do not spread evenly over {self.gpus} GPUs")
        return self


def problems(options: Options, url: str, out: Path) -> list[Problem]:
    """Why sbatch cannot take the study's job, found before the study is created: an --out its log pattern
    cannot carry, a SQLite file that tasks on other nodes cannot share, and scheduler_problems."""
    from ablate.harness.study.storage import sqlite_path

    found = []
    if "\\" in str(out.resolve()):
        # A backslash anywhere in --output turns off its %A_%a: no task's log would be written.
        found.append(("--out", f"{out}: slurm cannot carry a backslash in the log folder's path; choose a "
                               "folder without one"))  # fmt: skip
    db = sqlite_path(url)
    if db is not None and not options.single_node:
        found.append(("--storage", f"{db} is a SQLite file, which tasks on other nodes cannot share: give a "
                                   "PostgreSQL URL (--storage or ABLATE_STORAGE), or single_node=true when "
                                   "every task runs on this machine"))  # fmt: skip
    return found + scheduler_problems(options)


def scheduler_problems(options: Options) -> list[Problem]:
    """sbatch missing, the controller's refusal of the job's resources (partition, time, `sbatch` items)
    under `sbatch --test-only` (which submits nothing), or no answer within options.timeout."""
    if shutil.which("sbatch") is None:
        return [("--launcher", "slurm: sbatch is not on PATH (submit from a SLURM login node)")]
    try:
        tried = subprocess.run(["sbatch", "--test-only", *job_options(options), "--wrap=true"], **SBATCH_IO,
                               timeout=options.timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return [("--launcher", f"slurm: {no_answer(options.timeout)}")]
    if tried.returncode != 0:
        return [("--launcher", f"slurm: sbatch --test-only refuses the job: {sbatch_error(tried)}")]
    return []


def job_options(options: Options) -> list[str]:
    """sbatch's options for what each array task is given: the launcher's keys, then its `sbatch` items."""
    o = options
    return [
        f"--array=0-{o.tasks - 1}", "--nodes=1", f"--ntasks={o.workers}", f"--cpus-per-task={o.cpus}",
        *([f"--gres=gpu:{o.gpus}"] if o.gpus else []),
        *([f"--partition={o.partition}"] if o.partition else []), *([f"--time={o.time}"] if o.time else []),
        f"--signal=USR1@{o.warning}", "--requeue", *o.sbatch,
    ]  # fmt: skip


def sbatch_command(script: Path, slug: str, options: Options, logs: Path, workdir: Path) -> list[str]:
    """The submission, every option an argument of its own. --output is a filename pattern, where '%' is
    written '%%' (problems() refuses the backslash that would turn the pattern off)."""
    output = str(logs).replace("%", "%%")
    return ["sbatch", "--parsable", "--export=ALL", f"--job-name=ablate-{slug}", "--open-mode=append",
            f"--output={output}/%A_%a.log", f"--chdir={workdir}", *job_options(options),
            str(script)]  # fmt: skip


def batch_script(name: str, command: list[str], options: Options) -> str:
    """The sbatch script: an srun step of `options.workers` `command` processes, then the requeue of a
    task whose workers a signal stopped. Nothing secret goes in it (the storage URL comes from the job's
    environment), and every value in it is quoted: the name in a comment as Python writes it, on one line."""
    run = shlex.join(command)
    if not options.gpus:
        gpus = "export CUDA_VISIBLE_DEVICES=  # CPU workers: no GPU that the job was not given"
    elif options.gpus == 1:
        gpus = f"# The task's {options.workers} worker(s) share its GPU."
    else:
        per = options.workers // options.gpus
        gpus, run = f"# {per} worker(s) per GPU.", ONE_GPU_EACH.format(per=per) + run
    return SCRIPT.format(name=repr(name), gpus=gpus, run=run, stopped="|".join(map(str, STOPPED)))


def no_answer(timeout: float) -> str:
    return (f"sbatch did not answer within {timeout:g} s: is the SLURM controller up (sinfo)? "
            "--launch timeout=SECONDS waits longer")  # fmt: skip


def sbatch_error(done: subprocess.CompletedProcess) -> str:
    """sbatch's last line of complaint, without its prefix."""
    reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return reason.removeprefix("sbatch: error: ")


def start(spec, url: str, out: Path, wandb_mode: str, artifacts: str | None, options: Options) -> None:
    """Writes the batch script beside the study's outputs, submits it, and says where to look."""
    from ablate.harness.artifacts import default_storage_url, study_dir
    from ablate.harness.study.storage import masked_url

    out = out.resolve()
    logs = study_dir(spec.slug, out) / "slurm"
    logs.mkdir(parents=True, exist_ok=True)
    args = worker_args(spec.name, out, wandb_mode, options.cpus, artifacts, report=True)
    script = logs / "job.sh"
    # surrogateescape: a folder's name that is no UTF-8 goes back to the file as the bytes it was read from.
    script.write_text(batch_script(spec.name, [*python_command(sys.executable), *args], options),
                      encoding="utf-8", errors="surrogateescape")  # fmt: skip
    job = submit(sbatch_command(script, spec.slug, options, logs, Path.cwd()), url, options.timeout)
    status = f"ablate status --stored --out {shlex.quote(str(out))} -- {shlex.quote(spec.name)}"
    if url != default_storage_url(spec.slug, out):
        status += " (with --storage or ABLATE_STORAGE as for this sweep)"
    print(f"SLURM job {job}: {options.tasks} array task(s) x {options.workers} worker(s), storage "
          f"{masked_url(url)}\nlogs: {logs}/{job}_<task>.log (batch script {script})\nprogress: {status}",
          flush=True)  # fmt: skip


def submit(command: list[str], url: str, timeout: float) -> str:
    """Runs the sbatch `command` with the storage URL in its environment, which --export=ALL hands to the
    job; the job's id. The study exists by now: a refusal or no answer is a fault of the run."""
    try:
        done = subprocess.run(command, **SBATCH_IO, timeout=timeout,
                              env={**os.environ, "ABLATE_STORAGE": url})  # fmt: skip
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{no_answer(timeout)}; squeue says whether the job was queued, and the same "
                        "command submits it again if not") from None  # fmt: skip
    if done.returncode != 0:
        raise RunFailed(f"sbatch: {sbatch_error(done)} (batch script {command[-1]})")
    job = done.stdout.strip().split(";")[0]  # "<job id>[;<cluster>]"
    if not job.isdigit():
        raise RunFailed(f"sbatch answered {done.stdout.strip()[:200]!r}, not a job id "
                        f"(batch script {command[-1]})")  # fmt: skip
    return job
