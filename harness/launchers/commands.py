"""An `ablate worker` process as whatever starts it sees it (the local launcher, SLURM, Ray): its command
line, and what its exit codes mean. Torch-free, so that building a command line on a login node or in a Ray
actor imports no Lightning."""

from __future__ import annotations

import sys
from pathlib import Path

NO_SPACE_EXIT = 75  # a worker stopped by a full disk (EX_TEMPFAIL: run it again once space is freed)
STORAGE_FULL_EXIT = 74  # the same, the disk full being the storage's (SQLite's file, PostgreSQL's server)


def python_command(python: str = sys.executable) -> list[str]:
    """`ablate` run by `python`. -P keeps the working folder off sys.path: there a study's output folder
    (`bottleneck/` with --out .) or a stray file would shadow a module the worker imports; the installed
    `ablate` is found without it."""
    return [python, "-P", "-m", "ablate.cli"]


def worker_args(
    study_name: str, runs_root: str | Path, wandb_mode: str, threads: int, artifacts: str | None = None,
    report: bool = False,
) -> list[str]:  # fmt: skip
    """A launcher's `ablate worker` arguments (never the storage URL: that goes in ABLATE_STORAGE); `report`:
    the worker that finishes the study writes its report. Options come first as --opt=value, then `--` and
    the study's name, so a name or folder that reads as an option (`--help`, `-runs`) stays a value;
    `--stored` keeps a name that reads as a file (`x.yaml`) the stored study's."""
    return ["worker", "--stored", f"--out={runs_root}", f"--wandb={wandb_mode}", f"--threads={threads}",
            *([] if report else ["--no-report"]), *([f"--artifacts={artifacts}"] if artifacts else []),
            "--", study_name]  # fmt: skip
