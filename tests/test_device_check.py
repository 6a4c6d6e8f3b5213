"""scripts/device_check.py, the GPU path's one command, in its CPU mode: it runs every step on a machine
without a GPU, records each as a JSON line as it completes, and its study ends in a report; asked for the
GPU mode without one, it says so and exits 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "device_check.py"


def check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.slow  # the whole check at its CPU size: about 3 minutes on 2 cores
def test_the_device_check_runs_every_step_on_a_cpu(tmp_path):
    done = check("--cpu", "--budget", "420", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "device-check.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps[0] == "machine" and steps[-1] == "done" and records[-1]["failed"] == []
    machine = records[0]
    assert machine["mode"] == "cpu" and machine["torch"] and machine["attention-ablate"]
    tests = next(r for r in records if r["step"] == "tests")
    assert tests["exit_code"] == 0 and "passed" in tests["summary"]
    figures = {r["key"]: r for r in records if r["step"] == "figure"}
    assert figures["j_compile_quickstart"]["value"] > 0 and figures["h_fused_seeds"]["value"] > 0
    assert figures["k_trial_vs_captured"]["status"] == "skipped"  # CUDA graphs need a GPU
    study = next(r for r in records if r["step"] == "study")
    assert study["finished"] and (tmp_path / "runs" / "quickstart" / "report" / "report.md").is_file()
    assert "device check: every step ran" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_gpu_mode_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    done = check("--out", str(tmp_path), "--budget", "60", timeout=120)
    assert done.returncode == 2
    assert done.stdout.strip() == "device check: torch sees no CUDA device; use --cpu to check the CPU path"


def test_a_budget_too_small_is_refused(tmp_path):
    done = check("--cpu", "--budget", "5", "--out", str(tmp_path), timeout=60)
    assert done.returncode == 2 and "--budget: at least 60 seconds" in done.stderr
    assert not (tmp_path / "device-check.jsonl").exists()
