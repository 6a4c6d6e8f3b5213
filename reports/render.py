"""Writes report.html (self-contained), report.md, results.csv and the figures as PNG."""

from __future__ import annotations

import base64
import io
import os
import tempfile
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from harness.study import StudySpec, study_dir
from reports import plots, stats
from reports.collect import trials_frame


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plots.plt.close(fig)
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename: a report is never half-written."""
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
        f.write(data)
    os.replace(tmp, path)


def build_report(
    spec: StudySpec, storage, runs_root: str | Path = "runs", out: str | Path | None = None
) -> Path:
    out_dir = Path(out) if out else study_dir(spec, runs_root) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    df = trials_frame(spec, storage)
    order = list(spec.variant_overrides())
    metric = spec.metric.name
    summary = stats.summarize(df, metric, order) if metric in df else pd.DataFrame()

    figures: dict[str, bytes] = {}
    if metric in df and (df["state"] == "COMPLETE").any():
        figures["metric_by_variant"] = _png(plots.metric_by_variant(df, metric, order))

    counts = df["state"].value_counts().to_dict() if len(df) else {}
    context = {
        "spec": spec,
        "metric": metric,
        "summary": summary.to_dict("records"),
        "counts": counts,
        "failed": df[df["state"] == "FAIL"][["trial", "variant", "seed", "fail_reason"]].to_dict("records"),
        "figures": {k: base64.b64encode(v).decode() for k, v in figures.items()},
    }
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=select_autoescape(["html"]))
    env.filters["num"] = lambda x, d=3: "–" if x is None or pd.isna(x) else f"{x:.{d}f}"
    for name, data in figures.items():
        _atomic_write(out_dir / f"{name}.png", data)
    _atomic_write(out_dir / "results.csv", df.to_csv(index=False))
    _atomic_write(out_dir / "report.md", env.get_template("report.md.j2").render(**context))
    _atomic_write(out_dir / "report.html", env.get_template("report.html.j2").render(**context))
    return out_dir
