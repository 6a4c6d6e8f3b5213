"""The report's words about its numbers: the headline a reader sees first, and the notes under the variant
table that say why a p-value or a column is what it is. Plain text, the same in report.html, report.md and
the dashboard's note."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.analysis import stats
from ablate.analysis.claims import KIND_NAMES, ClaimResult, by_kind, effect_name, on_ratio_scale, tally
from ablate.reports.collect import StudyData
from ablate.reports.columns import show_g, show_permutation
from ablate.reports.formats import P_FLOOR, bounds, number, pvalue


def headline(data: StudyData, summary: pd.DataFrame, claims: list[ClaimResult]) -> dict[str, object]:
    """The report's first lines: what was compared, what won and how surely, the claims' verdicts counted
    by kind, and one line per claim: the tests of published findings (`claims`, each with its confounds),
    then the checks of mechanisms that hold by construction (`checks`)."""
    tests, checks = by_kind(claims)
    return {"compared": compared(data, summary), "winner": winner(data, summary), "tally": tally(claims),
            "claims": [claim_line(c) for c in tests], "checks": [claim_line(c) for c in checks]}  # fmt: skip


def _ci(lo: float, hi: float) -> str:
    return f"95% CI {bounds(lo, hi)}" if np.isfinite(lo) else "no CI (one seed)"


def _p(p: float) -> str:
    """The p-value after a CI in a sentence: ', p = 0.012', ', p < 0.001', or nothing without one."""
    return "" if not np.isfinite(p) else f", p < {P_FLOOR}" if p < P_FLOOR else f", p = {pvalue(p)}"


def claim_groups(claims: list[ClaimResult]) -> list[tuple[str, list[ClaimResult]]]:
    """The claims table's sections, tests first: (title, its claims) for each kind the study has."""
    about = {"test": "", "check": " (true by construction, kept as guards on the code)"}
    return [(KIND_NAMES[kind][1].capitalize() + about[kind], group)
            for kind, group in zip(KIND_NAMES, by_kind(claims)) if group]  # fmt: skip


def compared(data: StudyData, summary: pd.DataFrame) -> str:
    """What was compared: the variants, the task, the metric and its direction, the seeds."""
    spec = data.spec
    tasks = sorted({str(c["task.name"]) for c in data.configs.values() if c.get("task.name")})
    seeds = sorted(set(summary["n"]))
    counts = f"{seeds[-1]}" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    better = "higher" if spec.metric.direction == "maximize" else "lower"
    return (
        f"{len(summary)} variants ({', '.join(summary['variant'])})"
        + (f" on {', '.join(tasks)}" if tasks else "")
        + f", by {spec.metric.name} ({better} is better), {counts} seed(s) each."
    )


def winner(data: StudyData, summary: pd.DataFrame) -> str:
    """The best variant with its mean and CI, and its difference to the runner-up with that difference's
    CI and the p-value of the same interval (stats.difference)."""
    ranked = summary.dropna(subset=["mean"]).sort_values("rank")
    if ranked.empty:
        return "No variant has a completed trial yet."
    best = ranked.iloc[0]
    text = f"{best['variant']} scores {number(best['mean'])} ({_ci(best['ci_low'], best['ci_high'])})"
    if len(ranked) < 2:
        return text + "."
    runner_up = ranked.iloc[1]
    metric = data.spec.metric.name
    values = stats.variant_values(data.trials, metric)
    d = stats.difference(
        values[best["variant"]], values[runner_up["variant"]], stats.metric_range(metric),
        stats.examples(data.trials, metric),
    )  # fmt: skip
    sure = (
        ""  # one seed: no interval to read
        if not np.isfinite(d["diff_ci_low"])
        else "; the CI excludes 0"
        if d["diff_ci_low"] > 0 or d["diff_ci_high"] < 0
        else "; the CI includes 0: not distinguishable at these seeds"
    )
    return (
        text + f", ahead of the runner-up {runner_up['variant']} ({number(runner_up['mean'])}) by "
        f"Δ = {number(d['diff'])} ({_ci(d['diff_ci_low'], d['diff_ci_high'])}{_p(d['p'])}){sure}."
    )


def _statement(text: str) -> str:
    """A claim's statement without its explanation: the text up to its first '. ', ': ' or '; '."""
    cut = min((i for i in (text.find(s) for s in (". ", ": ", "; ")) if i > 0), default=len(text))
    return " ".join(text[:cut].rstrip(".").split())


def claim_line(result: ClaimResult) -> dict[str, str]:
    """One claim in a line, in four parts: its statement, its verdict, Δ with its CI (at the claim's level:
    above 95% where adaptive looks share the error) against its margin, with the seeds that failed where
    any did, and its confounds; Δ named as claims' reasons name it where it is a log ratio."""
    ratio = on_ratio_scale(result.metric)
    as_ratio = f" (a ratio of {1 + abs(result.claim.margin):g})" if ratio and result.claim.margin else ""
    failed = f" {result.failures[0].upper()}{result.failures[1:]}." if result.failures else ""
    return {
        "statement": _statement(result.claim.text),
        "verdict": result.verdict,
        "numbers": f"{effect_name(result.metric) if ratio else 'Δ'} = {number(result.diff)}, "
        f"{100 * result.level:.3g}% CI {bounds(result.ci_low, result.ci_high)}, "
        f"expected {result.expected}{as_ratio}.{failed}",
        "confounds": " ".join(result.claim.confounds.split()),
        "revised": " ".join(result.claim.revised.split()),
    }


def table_notes(summary: pd.DataFrame) -> list[str]:
    """Why the variant table's p-values read as they do, and which columns it leaves out and why."""
    compared_rows = summary[np.isfinite(summary["p"])]
    notes = [
        "p is the test of the CI beside it (the level at which that CI of Δ just reaches 0): it is below 0.05 "
        "exactly when the 95% CI of Δ excludes 0."
    ]
    if len(compared_rows) > 1:
        notes.append(
            f"p (Holm) corrects p for the {len(compared_rows)} comparisons with the baseline; the CIs are "
            "not corrected, so a CI that excludes 0 may sit beside a Holm p above 0.05."
        )
    floors = compared_rows["p_perm_floor"].dropna()
    if len(floors) and not show_permutation(summary):
        n = int(summary["n"].min())
        notes.append(
            f"Permutation test not shown: with {n} seeds a side its smallest possible p is "
            f"{number(floors.min())} (2 of C({2 * n}, {n}) = {math.comb(2 * n, n)} relabellings), so it could "
            "never reach 0.05."
            if summary["n"].nunique() == 1
            else f"Permutation test not shown: at these seeds its smallest possible p is {number(floors.min())} "
            "or more, so it could never reach 0.05."
        )
    if len(compared_rows) and not show_g(summary):
        notes.append(f"Hedges' g not shown: it needs {stats.G_MIN_SEEDS} seeds a side.")
    return notes
