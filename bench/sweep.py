"""The sweep figure (f): finished trials per hour of a tiny study with K = 1, 2, 4 concurrent worker
processes per device, started by the local launcher as `ablate sweep` starts them."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ablate.bench.timing import Figure, skipped


def sweep_spec(k: int, trials: int):
    from ablate.schema.spec import StudySpec

    return StudySpec(
        name=f"bench-sweep-k{k}",
        base={"preset": "transformer",
              "task": {"name": "reverse", "min_len": 2, "max_len": 6, "n_train": 500, "n_valid": 50, "n_test": 50},
              "model": {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64, "dropout": 0.0},
              "train": {"batch_size": 32, "max_steps": 60, "val_every": 30}},
        seeds=list(range(trials)),
    )  # fmt: skip


@contextlib.contextmanager
def output_to(path: Path):
    """Points this process's stdout and stderr file descriptors at `path` (children inherit them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def sweep_rate(k: int, trials: int, device: torch.device, root: Path) -> tuple[float, float, int]:
    """Runs a fresh study of `trials` tiny trials with k worker processes started by the local launcher, as
    `ablate sweep` starts them; returns (trials per hour, seconds, finished trials). Worker start-up counts: every sweep pays it."""
    import optuna

    from ablate.harness.artifacts import default_storage_url
    from ablate.harness.launchers import local
    from ablate.harness.study.queue import prepare_study, study_progress
    from ablate.harness.study.storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = sweep_spec(k, trials)
    url = default_storage_url(spec.slug, root)
    store = open_storage(url)
    prepare_study(spec, store)
    if device.type == "cuda":
        processes = local.Options(devices=str(device.index or 0), per_device=k)
    else:
        processes = local.Options(workers=k)
    log = root / f"workers-k{k}.log"
    start = time.perf_counter()
    with output_to(log):
        procs = local.start(spec, url, root, "disabled", None, processes)
    for proc in procs:
        proc.wait()
    seconds = time.perf_counter() - start
    if any(p.returncode for p in procs):
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"a K={k} worker failed: {' | '.join(tail)}")
    done = sum(row.done for row in study_progress(spec, store))
    return done * 3600 / seconds, seconds, done


def bench_sweep(device: torch.device, quick: bool) -> Figure:
    what = "finished trials/hour with K = 4 concurrent trials per device / K = 1"
    if quick:
        return skipped("f_sweep_scaling", what, "--quick: each worker process takes seconds to start",
                       target=">= 2.5 (GPU)")  # fmt: skip
    detail: dict[str, Any] = {"trials": 8, "trial": "reverse, d_model 32, 1 + 1 layers, 60 steps"}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        for k in (1, 2, 4):
            rate, seconds, done = sweep_rate(k, 8, device, Path(tmp))
            detail[f"k{k}_trials_per_hour"], detail[f"k{k}_seconds"], detail[f"k{k}_done"] = (
                rate,
                seconds,
                done,
            )
    figure = Figure("f_sweep_scaling", what, detail["k4_trials_per_hour"] / detail["k1_trials_per_hour"], "x",
                    detail=detail)  # fmt: skip
    figure.judge(">=", 2.5)
    if device.type != "cuda":
        figure.status = "info"
        figure.reason = (
            f"the target is set for a GPU; {os.cpu_count()} CPU cores are shared by the K processes"
        )
    return figure
