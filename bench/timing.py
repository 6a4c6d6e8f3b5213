"""How a figure is measured and recorded: the Figure itself (value, target, status), and timing that
interleaves the compared runs, synchronises CUDA and runs under the harness's autocast."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Figure:
    key: str
    what: str
    value: float | None = None
    unit: str = ""
    target: str = ""  # e.g. ">= 1.0"; empty when the figure is for information
    status: str = "info"  # pass | fail | info | skipped
    reason: str = ""  # why it was skipped, or why the target does not apply here
    detail: dict[str, Any] = field(default_factory=dict)

    def judge(self, op: str, threshold: float) -> Figure:
        """Sets target and status from `value op threshold`."""
        self.target = f"{op} {threshold:g}"
        ok = self.value >= threshold if op == ">=" else self.value <= threshold
        self.status = "pass" if ok else "fail"
        return self


def skipped(key: str, what: str, reason: str, target: str = "") -> Figure:
    return Figure(key, what, target=target, status="skipped", reason=reason)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    runs: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 1,
    budget_s: float | None = None,
) -> dict[str, float]:
    """Median seconds of each run; every repeat calls each run once, in turn (ABAB...). With `budget_s`,
    no repeat starts once that many seconds have passed since the first (at least one always runs), so a
    device slower than the sizes assume still gives its figure in bounded time."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    start = time.perf_counter()
    for done in range(repeats):
        if done and budget_s is not None and time.perf_counter() - start > budget_s:
            break
        for name, run in runs.items():
            synchronize(device)
            began = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(ts) for name, ts in times.items()}


def autocast(device: torch.device):
    """bf16 autocast on CUDA, what tensor cores want at the figures' sizes (train.precision: bf16-mixed);
    full precision on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
