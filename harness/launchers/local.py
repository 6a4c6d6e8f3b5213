"""Local: the study's workers as processes on this machine, what `ablate sweep` does without --launcher.

Its options are `ablate sweep`'s --workers, --devices and --per-device (SweepOptions subclasses Options:
one schema for their ranges), or with `--launcher local` the study file's `launcher: {local: {...}}` and
--launch. Each process runs `ablate worker` with the storage URL in ABLATE_STORAGE and dies with the sweep,
which watches them, forwards stop signals and writes the report once all have exited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ablate.harness import signals
from ablate.harness.launchers import Problem
from ablate.harness.launchers.commands import python_command, worker_args

Count = Annotated[int, Field(ge=1)]  # worker processes: one at least
WORKER_GIB = 0.6  # a worker process's memory with torch and Lightning loaded and a tiny model (measured)


class Options(BaseModel):
    """`workers` CPU processes, or `per_device` on each GPU of `devices`; neither: one, environment as is."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    workers: Count | None = None  # local CPU worker processes
    devices: str | None = None  # GPUs, e.g. "0,1"
    per_device: Count = 1


def problems(options: Options, url: str | None, out: Path) -> list[Problem]:
    """The worker processes against this machine: CPU processes or GPUs, not both; the GPUs named exist;
    no more CPU workers than cores, nor processes than free memory holds (load_sweep adds the study's)."""
    if options.workers and options.devices:
        return [("--workers", "give either --workers (CPU processes) or --devices (GPUs), not both")]
    found = device_problems(options.devices) if options.devices is not None else []
    return found + capacity_problems(options.workers, options.devices, options.per_device)


def device_problems(devices: str) -> list[Problem]:
    gpus = [d.strip() for d in devices.split(",") if d.strip()]
    if not gpus or not all(d.isdigit() for d in gpus):
        return [("--devices", f"expected GPU indices like 0,1 (got {devices!r})")]
    import torch

    visible = torch.cuda.device_count()
    missing = [d for d in gpus if int(d) >= visible]
    if missing:
        return [("--devices", f"no GPU {', '.join(missing)}: torch sees {visible} "
                              f"({'CUDA_VISIBLE_DEVICES, driver or build' if visible else 'no CUDA device'})")]  # fmt: skip
    return []


def capacity_problems(workers: int | None, devices: str | None, per_device: int) -> list[Problem]:
    """Local worker processes against this machine: CPU workers (--workers) beyond its cores only wait for
    one another, and processes beyond its free memory are killed mid-trial."""
    if not workers and not devices:
        return []
    option, count = (
        ("--workers", workers) if workers else ("--per-device", len(devices.split(",")) * per_device)
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = available_memory_gib()
    most = max(1, min(cores if workers else count, int(memory / WORKER_GIB) if memory is not None else count))
    if count <= most:
        return []
    free = f", {memory:.1f} GiB of memory free" if memory is not None else ""
    return [(option, f"{count} worker processes exceed this machine ({cores} cores{free}, about {WORKER_GIB} "
                     f"GiB a worker): at most {most} here")]  # fmt: skip


def available_memory_gib() -> float | None:
    """Memory this process may still use: the kernel's MemAvailable, or less under a cgroup limit (a
    container, a SLURM job); None where neither can be read (not Linux)."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    free = next(
        int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")
    )
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free / 2**30


def start(spec, url: str, out: Path, wandb_mode: str, artifacts: str | None, options: Options):
    """Starts the worker processes here, and says how many and on which storage."""
    from ablate.harness.study.storage import masked_url

    # Each process's environment: `per_device` per listed GPU, each seeing only its GPU; N CPU workers (GPUs
    # hidden); or one worker with the environment as it is.
    if options.devices:
        slots = [{"CUDA_VISIBLE_DEVICES": d.strip()} for d in options.devices.split(",")
                 for _ in range(options.per_device)]  # fmt: skip
    else:
        slots = [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(options.workers or 0)] or [{}]
    print(f"{len(slots)} worker(s), storage {masked_url(url)}, W&B {wandb_mode}", file=sys.stderr, flush=True)
    return spawn_workers(spec.name, url, out, wandb_mode, slots, artifacts)


def spawn_workers(
    study_name: str, storage_url: str, runs_root: str | Path, wandb_mode: str, slots: list[dict[str, str]],
    artifacts: str | None = None,
) -> list[subprocess.Popen]:  # fmt: skip
    """Starts one `ablate worker` process per slot, each with CPU threads = cores / processes; the sweep
    that starts them writes the report once they have all exited, so they do not."""
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    command = [*python_command(), *worker_args(study_name, runs_root, wandb_mode, threads, artifacts)]
    # The URL travels in the environment: on the command line its password would show in `ps`.
    env = {**os.environ, "ABLATE_STORAGE": storage_url}
    return [
        subprocess.Popen(command, env={**env, **slot}, preexec_fn=signals.die_with_parent()) for slot in slots
    ]
