"""The whole run of `ablate bench`: every figure, in order, in one list (a measurement that raises is
reported as skipped, not lost with the run); the machine they were measured on; the device; the table."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ablate.bench.compile import bench_captured, bench_compile
from ablate.bench.decoding import bench_decoding
from ablate.bench.fused import bench_fused, bench_fused_trials
from ablate.bench.sweep import bench_sweep
from ablate.bench.timing import Figure, skipped
from ablate.bench.training import bench_lstm, bench_mfu, bench_overhead, bench_padding, bench_transformer
from ablate.bench.workload import bench_sizes
from ablate.harness import provenance
from ablate.schema.errors import ConfigError


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "commit": provenance.git_commit(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def guarded(key: str, what: str, measure: Callable[[], Figure | list[Figure]]) -> list[Figure]:
    """A figure whose measurement raised is reported as skipped with the error, not lost with the run."""
    try:
        result = measure()
    except Exception as e:  # one broken measurement must not hide the others
        return [skipped(key, what, f"error: {type(e).__name__}: {e}")]
    return result if isinstance(result, list) else [result]


def figure_steps(sizes, device: torch.device, quick: bool) -> list[tuple[str, str, Callable]]:
    """(key, what, measure) of every figure, in order: the one list of figure keys."""
    return [
        ("a_transformer_step", "Transformer step", lambda: bench_transformer(sizes, device)),
        ("b_harness_overhead", "harness overhead", lambda: bench_overhead(device, quick, 1 if quick else 7)),
        ("c_lstm_parallel", "LSTM family", lambda: bench_lstm(sizes, device)),
        ("d_greedy", "decoding", lambda: bench_decoding(sizes, device)),
        ("e_padding", "padding", lambda: bench_padding(quick)),
        ("f_sweep_scaling", "sweep throughput", lambda: bench_sweep(device, quick)),
        ("g_mfu", "MFU", lambda: bench_mfu(device, quick)),
        ("h_fused_seeds", "fused seeds", lambda: bench_fused(device, quick)),
        ("i_fused_trials", "fused trials", lambda: bench_fused_trials(device, quick)),
        ("j_compile", "compiled steps", lambda: bench_compile(device, quick)),
        ("k_trial_vs_captured", "a trial's step against a CUDA graph", lambda: bench_captured(device, quick)),
    ]


def chosen(only: str | None) -> list[str] | None:
    """--only's keys in the order given, each checked against the figures (ConfigError naming an unknown one)."""
    if only is None:
        return None
    keys = list(dict.fromkeys(key.strip() for key in only.split(",") if key.strip()))
    known = [key for key, _, _ in figure_steps(None, torch.device("cpu"), True)]
    unknown = sorted(set(keys) - set(known))
    if unknown or not keys:
        raise ConfigError(f"--only: unknown figure {', '.join(unknown) or '(none named)'}; known: {', '.join(known)}")
    return keys


def run_bench(
    device: torch.device,
    quick: bool = False,
    progress: Callable[[str], None] = lambda _: None,
    done: Callable[[dict[str, Any]], None] = lambda _: None,
    only: list[str] | None = None,
):
    """Every figure in order, or those keyed in `only` in its order; returns {'machine': ..., 'quick': ...,
    'figures': {key: figure dict}}. `done` gets each figure's dict as soon as it is measured, so a run killed
    later keeps what finished."""
    sizes = bench_sizes(device, quick)
    info = machine(device)
    steps = {key: (what, measure) for key, what, measure in figure_steps(sizes, device, quick)}
    figures: list[Figure] = []
    for key in only or steps:
        what, measure = steps[key]
        progress(what)
        start = time.perf_counter()
        for figure in guarded(key, what, measure):
            figure.detail["bench_seconds"] = round(time.perf_counter() - start, 2)
            figures.append(figure)
            done(asdict(figure))
    info["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": info, "quick": quick, "figures": {f.key: asdict(f) for f in figures}}


def resolve_device(requested: str | None) -> torch.device:
    """cuda when asked for (an error without one) or, unasked, when there is one; cpu otherwise."""
    if requested not in (None, "cpu", "cuda"):
        raise ConfigError(f"--device: expected cpu or cuda (got {requested!r})")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: cuda requested, but torch sees no CUDA device")
    if requested is None:
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return (
        torch.device(requested, torch.cuda.current_device()) if requested == "cuda" else torch.device("cpu")
    )


def format_value(figure: dict[str, Any]) -> str:
    if figure["value"] is None:
        return "-"
    value, unit = figure["value"], figure["unit"]
    if unit == "fraction":
        return f"{value:.1%}"
    return f"{value:.2f}{unit}" if unit == "x" else f"{value:,.1f} {unit}"


def figure_line(figure: dict[str, Any]) -> str:
    """One figure as it completes: 'a_transformer_step: 1.16x (target >= 1, pass)'."""
    judged = ", ".join(part for part in (f"target {figure['target']}" if figure["target"] else "",
                                          figure["status"], figure["reason"]) if part)  # fmt: skip
    return f"{figure['key']}: {format_value(figure)} ({judged})"


def print_table(result: dict[str, Any]) -> None:
    """The figures as a table on stdout, with the machine they were measured on."""
    from rich.console import Console
    from rich.table import Table

    info = result["machine"]
    table = Table(
        title=f"ablate bench on {info['device']} ({info['cpu']}, load {info['load_avg_1_5_15'][0]})"
    )
    for column in ("figure", "value", "target", "status", "detail"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for f in result["figures"].values():
        detail = ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in f["detail"].items() if k != "sizes")  # fmt: skip
        status = f"{f['status']} ({f['reason']})" if f["reason"] else f["status"]
        table.add_row(f"{f['key']}: {f['what']}", format_value(f), f["target"], status, detail)
    Console(width=200).print(table)
