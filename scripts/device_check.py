#!/usr/bin/env python3
"""The GPU path proved in one command, within a time budget: the machine and versions; the tests that need
CUDA; the figures that matter on a GPU (`ablate bench`: fused seeds, whole fused trials, trials per hour with
K per GPU, MFU, compiled against eager, a trial's step against a CUDA graph); then one bundled study's GPU
profile, fused and K workers per device, as far as the budget allows, and its report when it finishes.

    python scripts/device_check.py                    # on a GPU machine: the GPU sizes, 480 s in all
    python scripts/device_check.py --cpu              # anywhere: small sizes on the CPU (CI runs this)

Every step prints its lines as they come and appends one JSON object to OUT/device-check.jsonl (each bench
figure its own line as it completes), so a run killed at its time limit keeps what finished. The study
stops at its share of the budget (`ablate sweep --time-limit`): its workers checkpoint and queue their trials
again, and the same command later resumes it from its storage (OUT/runs). Exit code: 0 when every step ran
(a figure that misses its target is reported, not an error), 1 when a step failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ("torch", "lightning", "optuna", "wandb", "pydantic", "sqlalchemy", "pandas",
            "attention-ablate")  # fmt: skip
# In the order they run: the quickest and most telling first, the sweep figure (minutes of worker start-ups) last.
GPU_FIGURES = "k_trial_vs_captured,h_fused_seeds,j_compile,g_mfu,i_fused_trials,f_sweep_scaling"
CPU_FIGURES = "h_fused_seeds,j_compile,k_trial_vs_captured"
# The tests that need CUDA (marked `cuda`), and the compiled steps' whole trials, which run on the GPU there.
TESTS = ["tests/test_compile.py", "tests/test_module.py", "tests/test_conformance.py", "-m", "cuda or not slow",
         "-k", "cuda or compiled_trial or fused_group_compiles or many_lengths"]
# Not imported: the check runs the installed `ablate` and must start (and print) even where importing it fails.
TIME_LIMIT_EXIT = 75  # `ablate sweep --time-limit` stopped with trials left (schema/errors.py TimeLimit.EXIT)
STUDY_END_S = 70  # after the study's time limit: its workers' checkpoint (STOP_GRACE_S), `ablate status`, the rest
# The CPU mode's study: the quickstart, a few steps a trial.
CPU_STUDY = ["quickstart", "--set", "train.max_steps=20", "--set", "train.val_every=10",
             "--set", "task.n_train=300", "--set", "task.n_test=50"]  # fmt: skip


class Log:
    """Prints each line and appends each record to the JSON lines file."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, step: str, **fields) -> None:
        line = json.dumps({"step": step, "time": datetime.now(UTC).isoformat(timespec="seconds"), **fields})
        with self.path.open("a") as f:
            f.write(line + "\n")

    def say(self, text: str) -> None:
        print(text, flush=True)


def ablate_exe() -> str:
    beside = Path(sys.executable).parent / "ablate"
    return str(beside) if beside.exists() else "ablate"


def machine(cpu: bool) -> dict:
    import torch

    info = {"python": platform.python_version(), "host": platform.node(), "cpu_cores": os.cpu_count(),
            "cuda_available": torch.cuda.is_available(), "mode": "cpu" if cpu else "gpu"}  # fmt: skip
    for name in VERSIONS:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = None
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                    gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))  # fmt: skip
    return info


def streamed(command: list[str], timeout: float, log: Log, env: dict | None = None) -> tuple[int, list[str]]:
    """Runs command, printing its output as it comes; past `timeout` s it gets SIGTERM (then SIGKILL 40 s
    later). Returns (exit code, output lines); 124 when it was stopped for time."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip
    deadline, lines, stopped = time.monotonic() + timeout, [], False
    os.set_blocking(proc.stdout.fileno(), False)
    while True:
        line = proc.stdout.readline()
        if line:
            lines.append(line.rstrip("\n"))
            log.say("  " + lines[-1])
            continue
        if proc.poll() is not None:
            break
        if not stopped and time.monotonic() > deadline:
            log.say(f"  (stopping after {timeout:.0f} s: SIGTERM)")
            os.killpg(proc.pid, signal.SIGTERM)
            stopped, deadline = True, time.monotonic() + 40
        elif stopped and time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.05)
    rest = proc.stdout.read() or ""
    for line in rest.splitlines():
        lines.append(line)
        log.say("  " + line)
    return (124 if stopped else proc.returncode), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU (works anywhere)")
    parser.add_argument("--out", type=Path, default=Path("runs/device-check"), help="where the results go")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check")
    parser.add_argument("--study", default="transformer-heads", help="the bundled study whose GPU profile runs")
    parser.add_argument("--per-device", type=int, default=2, help="workers per GPU for the study")
    args = parser.parse_args(argv)
    if args.budget < 60:
        parser.error("--budget: at least 60 seconds")
    start = time.monotonic()
    log = Log(args.out / "device-check.jsonl")

    def left() -> float:
        return args.budget - (time.monotonic() - start)

    info = machine(args.cpu)
    if not args.cpu and not info["cuda_available"]:
        log.say("device check: torch sees no CUDA device; use --cpu to check the CPU path")
        return 2
    log.record("machine", **info)
    log.say("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    failed = []

    log.say("tests that need CUDA, and the compiled steps':")
    code, lines = streamed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                           min(150.0, left() * 0.25), log)  # fmt: skip
    log.record("tests", exit_code=code, summary=lines[-1] if lines else "")
    if code != 0:
        failed.append("tests")

    log.say("bench figures, each as it completes:")
    device = "cpu" if args.cpu else "cuda"
    command = [ablate_exe(), "bench", "--json", "--device", device, "--only", CPU_FIGURES if args.cpu else GPU_FIGURES]
    code, lines = streamed([*command, "--quick"] if args.cpu else command, min(240.0, left() * 0.5), log)
    figures = [json.loads(line)["figure"] for line in lines if line.startswith('{"figure"')]
    for figure in figures:
        log.record("figure", **figure)
    if code != 0:
        failed.append("bench")

    runs = args.out / "runs"
    study = CPU_STUDY if args.cpu else [args.study, "--profile", "gpu", "--devices", "0", "--per-device",
                                        str(args.per_device)]  # fmt: skip
    # The sweep stops itself at its time limit (its workers checkpoint, exit 75), well before the budget ends;
    # SIGTERM from `streamed` only if it does not.
    limit = max(left() - STUDY_END_S, 10)
    log.say(f"study: ablate sweep {' '.join(study)} --time-limit {limit:.0f}")
    began = time.monotonic()
    code, lines = streamed([ablate_exe(), "sweep", *study, "--out", str(runs), "--wandb", "disabled",
                            "--time-limit", f"{limit:.0f}"], max(left() - 10, 10), log)  # fmt: skip
    name = study[0] if args.cpu else f"{args.study}-gpu"  # a profile's study is stored as <name>-<profile>
    _, status = streamed([ablate_exe(), "status", name, "--out", str(runs)], 20, log)
    finished = code == 0
    log.record("study", command=study, exit_code=code, seconds=round(time.monotonic() - began, 1),
               finished=finished, status=status, report=str(runs / name / "report" / "report.md"))  # fmt: skip
    if code not in (0, TIME_LIMIT_EXIT, 124):
        failed.append("study")
    log.say(f"device check: {'every step ran' if not failed else 'failed: ' + ', '.join(failed)}; "
            f"{time.monotonic() - start:.0f} s; study {'finished' if finished else 'stopped, resumable'}; "
            f"records in {log.path}")  # fmt: skip
    log.record("done", failed=failed, seconds=round(time.monotonic() - start, 1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
