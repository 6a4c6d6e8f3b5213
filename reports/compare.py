"""Two runs compared (analysis/compare.py) as `ablate compare` writes them: tables for the terminal, one
JSON object, and Markdown tables that RESULTS.md can include. Each cell's text is made once (claim_table,
variant_table), so the terminal and the Markdown say the same; the JSON holds the numbers unrounded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ablate.analysis.claims import ClaimResult
from ablate.analysis.compare import ClaimRow, Comparison, VariantMean
from ablate.analysis.stats import LEVEL
from ablate.reports.files import write_whole
from ablate.reports.formats import bounds, md_cell, number
from ablate.schema.metric_registry import METRICS
from ablate.schema.text import terminal

Cells = tuple[list[str], list[list[str]]]  # a header and rows of cell texts
# What Δ is on each scale (claims.effect_name), naming the metrics judged as ratios (the registry's).
DELTA = "Δ: compare - to, log(compare / to) on " + " or ".join(
    m.name for m in METRICS.values() if m.scale == "ratio"
)
LEFT = ("claim", "variant", "verdict", "margin", "changed", "in")  # the columns of words; numbers align right


def interval(value: float, low: float, high: float, level: float = LEVEL) -> str:
    """'-0.872 [-0.910, -0.810]', with the CI's level after it where it is not 95% ('(98.3%)', an adaptive
    study's looks); a dash without a value."""
    if not math.isfinite(value):
        return "–"
    text = f"{number(value)} {bounds(low, high)}"
    return text if level == LEVEL else f"{text} ({f'{level:.1%}'.replace('.0%', '%')})"


def claim_table(c: Comparison) -> Cells:
    """Per claim: its text, each run's verdict, Δ [CI] and seeds (compare vs to side), the margin, and
    whether the verdict changed (or which run alone has the claim)."""
    a, b = c.labels
    header = ["claim", f"{a} verdict", f"{b} verdict", f"{a} Δ [CI]", f"{b} Δ [CI]", "expect, margin",
              f"{a} seeds", f"{b} seeds", "changed"]  # fmt: skip
    rows = []
    for row in c.claims:
        results = row.results
        margins = list(dict.fromkeys(f"{r.claim.expect} {r.margin_text}" for r in results if r))
        rows.append([
            row.text, *(r.verdict if r else "–" for r in results),
            *(interval(r.diff, r.ci_low, r.ci_high, r.level) if r else "–" for r in results),
            " / ".join(margins), *(f"{r.n_compare} vs {r.n_to}" if r else "–" for r in results),
            changed(row, c.labels),
        ])  # fmt: skip
    return header, rows


def changed(row: ClaimRow, labels: tuple[str, str]) -> str:
    if row.changed is None:
        return f"only in {next(label for label, r in zip(labels, row.results) if r)}"
    return "yes" if row.changed else "no"


def variant_table(c: Comparison) -> Cells:
    """Per variant: each run's mean of the metric [95% CI] and its seeds, or which run alone has it."""
    a, b = c.labels
    header = ["variant", f"{a} mean [95% CI]", f"{a} seeds", f"{b} mean [95% CI]", f"{b} seeds", "in"]
    rows = []
    for row in c.variants:
        cells = [
            [interval(m.mean, m.ci_low, m.ci_high), str(m.seeds)] if m else ["–", "–"] for m in row.means
        ]
        present = [label for label, m in zip(c.labels, row.means) if m]
        rows.append(
            [row.variant, *cells[0], *cells[1], "both" if len(present) == 2 else f"only in {present[0]}"]
        )
    return header, rows


def runs_line(c: Comparison) -> list[str]:
    """What each label stands for: '<label>: study <name> in <storage>'."""
    return [f"{label}: study {run.spec.name} in {run.where}" for label, run in zip(c.labels, c.runs)]


def show(c: Comparison, console: Console) -> None:
    """The two tables on the terminal (user text printed as it is, never read as rich markup)."""
    for line in runs_line(c):
        console.print(terminal(line))
    for title, (header, rows) in ((f"claims ({DELTA})", claim_table(c)),
                                  (f"{c.metric} per variant", variant_table(c))):  # fmt: skip
        table = Table(title=terminal(title))
        for name in header:  # folded, never cut: a verdict or a bound is read whole
            table.add_column(terminal(name), justify="left" if name.endswith(LEFT) else "right", overflow="fold")
        for cells in rows:
            table.add_row(*map(terminal, cells))
        console.print(table)


def markdown(c: Comparison) -> str:
    """The runs, then the claims table and the variants table, in Markdown."""
    lines = [f"- {md_cell(line)}" for line in runs_line(c)]
    for caption, (header, rows) in ((f"Claims ({DELTA}):", claim_table(c)),
                                    (f"{c.metric} per variant:", variant_table(c))):  # fmt: skip
        rule = ["---" if name.endswith(LEFT) else "---:" for name in header]
        lines += ["", md_cell(caption), "", _md_row(header), "|" + "|".join(rule) + "|"]
        lines += [_md_row(cells) for cells in rows]
    return "\n".join(lines) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(md_cell(cell) for cell in cells) + " |"


def write_markdown(c: Comparison, path: Path) -> None:
    write_whole(path, markdown(c))


def as_json(c: Comparison) -> dict[str, Any]:
    """Everything the tables show, unrounded; a missing number (NaN) is null, a run without the claim or
    variant null in its place."""
    return {
        "runs": [{"label": label, "study": run.spec.name, "storage": run.where}
                 for label, run in zip(c.labels, c.runs)],
        "metric": c.metric,
        "claims": [{"text": row.text, "changed": row.changed,
                    "in": [label for label, r in zip(c.labels, row.results) if r],
                    "runs": [_claim(r) for r in row.results]} for row in c.claims],
        "variants": [{"variant": row.variant, "in": [label for label, m in zip(c.labels, row.means) if m],
                      "runs": [_variant(m) for m in row.means]} for row in c.variants],
    }  # fmt: skip


def _claim(r: ClaimResult | None) -> dict[str, Any] | None:
    if r is None:
        return None
    numbers = {"diff": r.diff, "ci_low": r.ci_low, "ci_high": r.ci_high, "level": r.level,
               "margin": r.claim.margin, "mean_compare": r.mean_compare, "mean_to": r.mean_to}  # fmt: skip
    return {"verdict": r.verdict, "metric": r.metric, "expect": r.claim.expect, **_finite(numbers),
            "n_compare": r.n_compare, "n_to": r.n_to, "reason": r.reason}  # fmt: skip


def _variant(m: VariantMean | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {**_finite({"mean": m.mean, "ci_low": m.ci_low, "ci_high": m.ci_high}), "seeds": m.seeds}


def _finite(numbers: dict[str, float]) -> dict[str, float | None]:
    """JSON has no NaN: a number that is not finite is null."""
    return {k: float(v) if math.isfinite(v) else None for k, v in numbers.items()}
