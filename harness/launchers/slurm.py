"""SLURM: the study's workers as a job array submitted with sbatch.

Each array task runs `workers` `ablate worker` processes (one `srun` step, `--ntasks`), until the queue is
empty; the one that finishes the study writes its report. The storage URL reaches the tasks as
ABLATE_STORAGE in the job's environment (`sbatch --export=ALL`), never in the batch script or on a command
line. SLURM's warning before a time limit (`--signal=USR1@<warning>`) or a SIGTERM (preemption, `scancel
--signal=TERM`) makes each worker checkpoint its trial and queue it again (harness.signals); the task then
asks SLURM to requeue it (`scontrol requeue`) and ends cleanly, so the trial resumes in whichever task
claims it first. Trials run with Lightning's plain environment (harness/trial.py), so Lightning's own SLURM
requeue never competes with this one.
"""

from __future__ import annotations

import os
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

from ablate.harness.errors import ConfigError
from ablate.harness.launchers import Problem, sqlite_file

STOPPED = (128 + 10, 128 + 15)  # a worker's exit after SIGUSR1 or SIGTERM (harness.signals.exit_code)

SCRIPT = """\
#!/bin/bash
{directives}
# Written by `ablate sweep --launcher slurm` for study {name}: each array task runs its workers until the
# study's queue is empty. The storage URL is ABLATE_STORAGE in the job's environment, never in this file.
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


class Options(BaseModel):
    """The study file's `launcher: {slurm: {...}}` keys, and `--launch key=value`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tasks: PositiveInt = 1  # array tasks (--array=0-<tasks - 1>)
    workers: PositiveInt = 1  # worker processes per task (--ntasks): with gpus, spread evenly over them
    gpus: NonNegativeInt = 0  # GPUs per task (--gres=gpu:<gpus>); workers / gpus share each one
    cpus: PositiveInt = 1  # CPUs per worker (--cpus-per-task), also its torch threads
    partition: str | None = None
    time: str | None = None  # --time, e.g. "4:00:00" (quoted in YAML, which reads 4:00:00 as a number)
    warning: PositiveInt = 90  # seconds before the time limit that SIGUSR1 comes
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
        if v is not None and (not v or any(c.isspace() for c in v)):
            raise ValueError(f"expected one word (got {v!r})")
        return v

    @field_validator("sbatch")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        for line in v:
            if not line.startswith("-") or "\n" in line:
                raise ValueError(f"each item is one sbatch option, e.g. --mem=16G (got {line!r})")
        return v

    @model_validator(mode="after")
    def _spread(self) -> Options:
        if self.gpus and self.workers % self.gpus:
            raise ValueError(f"workers: {self.workers} workers do not spread evenly over {self.gpus} GPUs")
        return self


def problems(options: Options, url: str) -> list[Problem]:
    found = []
    if shutil.which("sbatch") is None:
        found.append(("--launcher", "slurm: sbatch is not on PATH (submit from a SLURM login node)"))
    db = sqlite_file(url)
    if db is not None and not options.single_node:
        found.append(("--storage", f"{db} is a SQLite file, which tasks on other nodes cannot share: give a "
                                   "PostgreSQL URL (--storage or ABLATE_STORAGE), or single_node=true when "
                                   "every task runs on this machine"))  # fmt: skip
    return found


def batch_script(
    name: str, slug: str, command: list[str], options: Options, logs: Path, workdir: Path
) -> str:
    """The sbatch script: `options.tasks` array tasks, each an srun step of `options.workers` `command`
    processes. Nothing secret goes in it: the storage URL comes from the job's environment."""
    o = options
    directives = [
        f"--job-name=ablate-{slug}", f"--array=0-{o.tasks - 1}", "--nodes=1", f"--ntasks={o.workers}",
        f"--cpus-per-task={o.cpus}", *([f"--gres=gpu:{o.gpus}"] if o.gpus else []),
        *([f"--partition={o.partition}"] if o.partition else []), *([f"--time={o.time}"] if o.time else []),
        f"--signal=USR1@{o.warning}", "--requeue", "--open-mode=append", f"--output={logs}/%A_%a.log",
        f"--chdir={workdir}", *o.sbatch,
    ]  # fmt: skip
    run = shlex.join(command)
    if not o.gpus:
        gpus = "export CUDA_VISIBLE_DEVICES=  # CPU workers: no GPU that the job was not given"
    elif o.gpus == 1:
        gpus = f"# The task's {o.workers} worker(s) share its GPU."
    else:
        per = o.workers // o.gpus
        gpus, run = f"# {per} worker(s) per GPU.", ONE_GPU_EACH.format(per=per) + run
    return SCRIPT.format(
        directives="\n".join(f"#SBATCH {d}" for d in directives), name=repr(name), gpus=gpus, run=run,
        stopped="|".join(map(str, STOPPED)),
    )  # fmt: skip


def start(spec, url: str, out: Path, wandb_mode: str, artifacts: str | None, options: Options) -> None:
    """Writes the batch script beside the study's outputs, submits it, and says where to look."""
    from ablate.harness.artifacts import default_storage_url, study_dir
    from ablate.harness.study.storage import masked_url
    from ablate.harness.workers import python_command, worker_args

    out = out.resolve()
    logs = study_dir(spec.slug, out) / "slurm"
    logs.mkdir(parents=True, exist_ok=True)
    args = worker_args(spec.name, out, wandb_mode, options.cpus, artifacts, report=True)
    script = logs / "job.sh"
    command = [*python_command(sys.executable), *args]
    script.write_text(batch_script(spec.name, spec.slug, command, options, logs, Path.cwd()))
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--export=ALL", str(script)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "ABLATE_STORAGE": url},
    )  # fmt: skip
    if submitted.returncode != 0:
        reason = (submitted.stderr.strip().splitlines() or [f"exit code {submitted.returncode}"])[-1]
        raise ConfigError(f"sbatch: {reason.removeprefix('sbatch: error: ')} (batch script {script})")
    job = submitted.stdout.strip().split(";")[0]  # "<job id>[;<cluster>]"
    status = f"ablate status {shlex.quote(spec.name)} --out {shlex.quote(str(out))}"
    if url != default_storage_url(spec.slug, out):
        status += " (with --storage or ABLATE_STORAGE as for this sweep)"
    print(f"SLURM job {job}: {options.tasks} array task(s) x {options.workers} worker(s), storage "
          f"{masked_url(url)}\nlogs: {logs}/{job}_<task>.log (batch script {script})\nprogress: {status}",
          flush=True)  # fmt: skip
