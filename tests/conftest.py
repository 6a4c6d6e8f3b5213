from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCAN_DIR = REPO.parent / "shared" / "data" / "scan"

# Tests never talk to W&B servers.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# A storage URL in the developer's environment would become every test's --storage.
os.environ.pop("ABLATE_STORAGE", None)


def ablate_exe() -> str:
    """The console script installed beside the Python running the tests, so that `.venv/bin/python -m pytest`
    tests its own install whether or not the virtualenv is activated; PATH's otherwise."""
    beside = Path(sys.executable).parent / "ablate"
    return str(beside) if beside.exists() else shutil.which("ablate") or "ablate"


def ablate(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs the installed console script as a user would; `env` adds to (or overrides) the environment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [ablate_exe(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


TINY_TASK = {
    "name": "reverse",
    "min_len": 2,
    "max_len": 5,
    "vocab_size": 6,
    "n_train": 64,
    "n_valid": 16,
    "n_test": 16,
}
TINY_MODEL = {"d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "dropout": 0.0}
TINY_TRAIN = {"batch_size": 16, "max_steps": 4, "val_every": 2}


@pytest.fixture
def tiny_tree() -> dict:
    """A nested config that trains in a second or two."""
    return {"task": dict(TINY_TASK), "model": dict(TINY_MODEL), "train": dict(TINY_TRAIN)}


@pytest.fixture(scope="module")
def single_thread():
    """Tiny models on a shared CPU: extra intra-op threads only add contention (opt in with
    `pytestmark = pytest.mark.usefixtures("single_thread")`)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
