"""Where a run happened: hardware, package versions and the code's commit, recorded with every trial."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ["torch", "lightning", "optuna", "wandb", "numpy", "pandas", "scipy", "seaborn", "matplotlib"]


def hardware() -> str:
    """'x86_64, 2 CPUs, 1 torch thread', with a visible GPU's name as well. The thread count belongs to it:
    threads change the order of floating-point sums, so a seed repeats its numbers only at the same count."""
    desc = f"{platform.machine()}, {os.cpu_count()} CPUs"
    try:
        import torch

        threads = torch.get_num_threads()
        desc += f", {threads} torch thread{'s' if threads > 1 else ''}"
        if torch.cuda.is_available():
            desc += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return desc


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            found[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return found


@cache
def git_commit() -> str | None:
    """The checkout's commit (with '+dirty' when it has local changes), or None outside a checkout."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10
        )
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment() -> dict[str, Any]:
    """{'hardware', 'platform', 'versions', 'git_commit'}: what a trial or a report records."""
    return {"hardware": hardware(), "platform": platform.platform(), "versions": versions(),
            "git_commit": git_commit()}  # fmt: skip
