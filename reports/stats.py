"""Statistics of a study's table: per-variant summaries with Student t CIs of the mean; differences to
the baseline with Welch t CIs (Welch-Satterthwaite df), Welch and permutation p-values, Holm's
correction and Hedges' g; ranks; and the Pareto front. CIs are t-intervals, not bootstraps: with the
2-5 seeds a study has, a percentile bootstrap of a mean is about [min, max] of the seeds, far too narrow.

One value per (variant, seed) enters: the latest completed trial of that grid point, so a retried
trial is never counted twice."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

LEVEL = 0.95


def seed_values(df: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Variant -> its finite metric values indexed by seed, from completed trials."""
    if metric not in df:
        return {}
    done = df[(df["state"] == "COMPLETE") & np.isfinite(pd.to_numeric(df[metric], errors="coerce"))]
    done = done.sort_values("trial").drop_duplicates(["variant", "seed"], keep="last")
    return {v: g.set_index("seed")[metric].astype(float) for v, g in done.groupby("variant", sort=False)}


def variant_values(df: pd.DataFrame, metric: str) -> dict[str, np.ndarray]:
    """Variant -> its finite metric values, one per seed, from completed trials."""
    return {v: s.to_numpy() for v, s in seed_values(df, metric).items()}


@dataclass(frozen=True)
class MetricRange:
    """The values a metric can take: [low, high], either end possibly infinite."""

    low: float = -math.inf
    high: float = math.inf


UNBOUNDED = MetricRange()
# The one list of metric ranges, by the name after the split ("test/seq_acc" -> "seq_acc"); a name ending in
# "_" covers every metric it begins (rank_collapse_encoder, rank_collapse_decoder).
METRIC_RANGES = {
    "seq_acc": MetricRange(0.0, 1.0), "tok_acc": MetricRange(0.0, 1.0), "aer": MetricRange(0.0, 1.0),
    "rank_collapse_": MetricRange(0.0, 1.0), "bleu": MetricRange(0.0, 100.0), "chrf": MetricRange(0.0, 100.0),
    "loss": MetricRange(0.0), "ppl": MetricRange(1.0),
}  # fmt: skip


def metric_range(metric: str) -> MetricRange:
    """The range of a metric named `split/name` (or a bare name); unknown metrics are unbounded."""
    name = metric.rsplit("/", 1)[-1]
    for key, value in METRIC_RANGES.items():
        if name == key or (key.endswith("_") and name.startswith(key)):
            return value
    return UNBOUNDED


def _t_interval(estimate: float, groups: list[np.ndarray], scale: float, level: float) -> tuple[float, float]:
    """estimate ± t · scale · sqrt(sum of s^2/n over the groups), with Welch-Satterthwaite df over the
    groups of two or more values; zero-width when there is no variance (equal values, one value a group)."""
    # Equal values count as exactly no variance: np.var leaves ~1e-34 of rounding on them.
    terms = [((np.var(g, ddof=1) if np.ptp(g) else 0.0) / len(g), len(g) - 1) for g in groups if len(g) > 1]
    variance = sum(v for v, _ in terms)
    if variance == 0:
        return (float(estimate), float(estimate))
    df = variance**2 / sum(v**2 / dof for v, dof in terms)
    half = sps.t.ppf((1 + level) / 2, df) * scale * np.sqrt(variance)
    return (float(estimate - half), float(estimate + half))


def mean_ci(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Student t CI of the mean (n - 1 df); a single value gives a zero-width interval at that value,
    none gives NaN."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return (np.nan, np.nan)
    return _t_interval(values.mean(), [values], 1.0, level)


def diff_ci(pairs: list[tuple[np.ndarray, np.ndarray]], level: float = LEVEL) -> tuple[float, float, float]:
    """The mean over the k pairs of mean(a) - mean(b), and its Welch t CI: all groups are independent
    runs, so the variance is sum(s^2/n over the 2k groups) / k^2, with Welch-Satterthwaite df. Empty
    groups make it NaN."""
    if not pairs or any(len(a) == 0 or len(b) == 0 for a, b in pairs):
        return (np.nan, np.nan, np.nan)
    estimate = float(np.mean([np.mean(a) - np.mean(b) for a, b in pairs]))
    groups = [np.asarray(g, dtype=float) for pair in pairs for g in pair]
    return (estimate, *_t_interval(estimate, groups, 1 / len(pairs), level))


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Welch t-test p-value; NaN with fewer than two values a side or no variance at all."""
    if len(a) < 2 or len(b) < 2 or (np.var(a) == 0 and np.var(b) == 0):
        return np.nan
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def permutation_p(a: np.ndarray, b: np.ndarray, n_resamples: int = 9999, seed: int = 0) -> float:
    """Two-sided permutation test of the difference of means: exact when the relabellings number at
    most n_resamples, Monte Carlo otherwise. NaN with fewer than two values a side."""
    if len(a) < 2 or len(b) < 2:
        return np.nan
    result = sps.permutation_test(
        (a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis), vectorized=True,
        permutation_type="independent", alternative="two-sided", n_resamples=n_resamples,
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(result.pvalue)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaNs stay NaN and do not count as tests)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def hedges_g(a: np.ndarray, b: np.ndarray) -> float:
    """Standardized mean difference (a - b) with the pooled SD and the small-sample correction;
    NaN with fewer than two values a side or zero pooled variance."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return np.nan
    pooled = ((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2)
    if pooled == 0:
        return np.nan
    correction = 1 - 3 / (4 * (na + nb) - 9)
    return float((a.mean() - b.mean()) / np.sqrt(pooled) * correction)


def summarize(
    df: pd.DataFrame, metric: str, order: list[str], baseline: str | None, direction: str = "maximize"
) -> pd.DataFrame:
    """One row per variant in `order`: n, mean, std, 95% CI; against the baseline: diff (variant -
    baseline) with its Welch t CI, Welch and permutation p-values, p (Welch where defined, else the
    permutation test), p_holm (Holm across the non-baseline variants) and Hedges' g; and rank (1 = best
    mean in the metric's direction)."""
    values = variant_values(df, metric)
    base = values.get(baseline, np.array([]))
    rows = []
    for variant in order:
        v = values.get(variant, np.array([]))
        lo, hi = mean_ci(v)
        row = {"variant": variant, "n": len(v), "mean": v.mean() if len(v) else np.nan,
               "std": v.std(ddof=1) if len(v) > 1 else np.nan, "ci_low": lo, "ci_high": hi,
               "diff": np.nan, "diff_ci_low": np.nan, "diff_ci_high": np.nan, "p_welch": np.nan,
               "p_perm": np.nan, "p": np.nan, "g": np.nan}  # fmt: skip
        if variant != baseline and len(base):
            row["diff"], row["diff_ci_low"], row["diff_ci_high"] = diff_ci([(v, base)])
            row["p_welch"], row["p_perm"] = welch_p(v, base), permutation_p(v, base)
            row["p"] = row["p_welch"] if np.isfinite(row["p_welch"]) else row["p_perm"]
            row["g"] = hedges_g(v, base)
        rows.append(row)
    out = pd.DataFrame(rows, columns=[*(rows[0] if rows else ["variant"])])
    if out.empty:
        return out
    out["p_holm"] = holm(out["p"].tolist())
    out["rank"] = out["mean"].rank(ascending=direction == "minimize", method="min").astype("Int64")
    return out


def pareto_front(cost: np.ndarray, quality: np.ndarray, maximize: bool = True) -> np.ndarray:
    """Mask of the points no other point beats: at most the cost and at least the quality (for
    `maximize`), strictly better in one. NaN points are never on the front."""
    cost, quality = np.asarray(cost, dtype=float), np.asarray(quality, dtype=float)
    q = quality if maximize else -quality
    ok = np.isfinite(cost) & np.isfinite(q)
    front = np.zeros(len(cost), dtype=bool)
    for i in np.flatnonzero(ok):
        others = ok & (cost <= cost[i]) & (q >= q[i]) & ((cost < cost[i]) | (q > q[i]))
        front[i] = not others.any()
    return front
