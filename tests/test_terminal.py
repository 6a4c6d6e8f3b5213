"""What a user sees on a terminal: `ablate` run under a pseudo-terminal, as from a shell, so that Rich draws
its live progress and every library writes what it would write to a person."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

import pytest
from conftest import ablate_exe
from test_sweep import write_study

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CHATTER = [
    r"\[[IWE] \d{4}-\d\d-\d\d",  # Optuna's log lines ("[I 2026-...] A new study created ...")
    "GPU available", "TPU available", "HPU available", "Tip:", "srun",  # Lightning's notices
    "Warning", "warning", "Epoch", "wandb:",
]  # fmt: skip


def run_in_terminal(*args: str, cwd, timeout: float = 300) -> tuple[int, str]:
    """Runs `ablate` with a pseudo-terminal as stdin, stdout and stderr (200 columns); its exit code and
    everything it wrote, escape sequences removed."""
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "WANDB_MODE": "offline"}
    env.pop("WANDB_SILENT", None)  # W&B as a user meets it
    proc = subprocess.Popen([ablate_exe(), *args], stdin=terminal, stdout=terminal, stderr=terminal, cwd=cwd,
                            env=env, close_fds=True)  # fmt: skip
    os.close(terminal)
    written, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every process writing to the terminal has exited
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), ANSI.sub("", written.decode(errors="replace"))


@pytest.mark.parametrize("verbose", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_sweep_on_a_terminal_shows_its_progress_and_no_library_chatter(tmp_path, verbose):
    study = write_study(tmp_path / "tiny.yaml", variants={"lstm": {"preset": "lstm"}}, seeds=[0])
    code, seen = run_in_terminal(*(["--verbose"] if verbose else []), "sweep", str(study), "--out", "runs",
                                 "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert code == 0, seen[-3000:]
    assert "tiny: 1 variants x 1 seeds: 1 trials" in seen
    assert re.search(r"eval .* 1/1", seen) and "eval trial 0 lstm/seed=0: test/tok_acc = " in seen
    assert "report: runs/tiny/report/report.html" in seen
    shown = [pattern for pattern in CHATTER if re.search(pattern, seen)]
    if verbose:  # the workers inherit --verbose: Optuna's and Lightning's lines are all there
        assert "A new study created" in seen and "GPU available" in seen, seen[-3000:]
    else:
        assert not shown, f"{shown} in:\n{seen[-3000:]}"
