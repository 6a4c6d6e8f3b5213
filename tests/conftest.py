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


def fit(model, data, epochs: int, lr: float, batch_size: int) -> None:
    """Trains `model` on `data`'s training split for whole epochs with a trial's loss (models/steps.py
    training_loss) and AdamW: the small learning checks of a family."""
    import torch

    from ablate.harness.tasks.datamodule import Seq2SeqDataModule
    from ablate.models.steps import training_loss

    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    dm = Seq2SeqDataModule(data, batch_size=batch_size, seed=0)
    for _ in range(epochs):
        for batch in dm.train_dataloader():
            optimiser.zero_grad()
            training_loss(model, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0).backward()
            optimiser.step()


def study_trials(study: Path, url: str) -> list:
    """The eval trials of the study file `study` as the storage at `url` holds them. The storage is closed
    after the read: a poll that left each engine to the garbage collector would use up PostgreSQL's
    connections."""
    from ablate.harness.study.queue import load_phase_study
    from ablate.harness.study.storage import open_storage
    from ablate.harness.study.validate import load_study
    from ablate.schema.trials import EVAL

    with open_storage(url, create_dir=False) as storage:
        return load_phase_study(load_study(study), storage, EVAL).get_trials()


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


@pytest.fixture
def short_lock_wait(monkeypatch):
    """A storage's lock is waited for 1 s, asked for again every 0.1 s (tests/test_storage_faults.py and
    tests/test_postgres.py)."""
    from ablate.harness.study import storage

    monkeypatch.setattr(storage, "LOCK_WAIT_S", 1)
    monkeypatch.setattr(storage, "LOCK_POLL_S", 0.1)


# SLURM's sbatch as tests/test_launchers.py and tests/test_injection.py meet it.
@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch) -> Path:
    """An `sbatch` first on PATH that answers `--test-only` as sbatch does, and records a submission: its
    arguments (NUL-separated: an argument holding a newline stays one), its ABLATE_STORAGE and the script it
    was given, answering as `sbatch --parsable` does. FAKE_SBATCH_HANGS=test-only or =submit: that call
    never answers."""
    bin_dir, record = tmp_path / "bin", tmp_path / "sbatch-record"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"""#!/bin/sh
case " $* " in
  *" --test-only "*) [ "$FAKE_SBATCH_HANGS" = test-only ] && exec sleep 600
                     printf '%s\\0' "$@" > {record}.test-args
                     echo "sbatch: Job 4241 to start at 2030-01-01T00:00:00 using 1 processors" >&2; exit 0 ;;
esac
[ "$FAKE_SBATCH_HANGS" = submit ] && exec sleep 600
printf '%s\\0' "$@" > {record}.args
printf '%s' "$ABLATE_STORAGE" > {record}.storage
for last; do :; done
cp -- "$last" {record}.script
echo "4242;testcluster"
""")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_SBATCH_HANGS", raising=False)
    return record
