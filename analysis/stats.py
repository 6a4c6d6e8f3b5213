"""Statistics of a study's table: per-variant means with CIs over seeds; differences to the baseline with
their CIs, the p-value inverting each CI (p < 0.05 exactly when the 95% CI excludes 0), permutation
p-values with their floor, Holm's correction and Hedges' g; ranks; and the Pareto front.

Every interval respects its metric's range (schema.metric_registry, which plots and claims read too):
- bounded metrics (accuracies, AER, rank collapse in [0, 1]; BLEU, chrF in [0, 100]): Wilson's score
  interval with the between-seed variance kept (quasi-binomial). A seed's value is a proportion of n test
  examples; the seeds' variance s^2, as a multiple of p(1 - p) and never below the binomial 1/n, sets an
  effective sample size k p(1 - p)/s^2, as for clustered survey proportions (Korn & Graubard 1998). The
  interval lies in the range and around the mean, and seeds all at 0 (or 1) still get the binomial width
  of k * n examples. Critical value: Student t, k - 1 df; for a difference s^2/(p(1 - p)) is pooled over
  the variants compared (p(1 - p) already lets a variant near 0 vary less than one near 0.5), sum(k - 1) df;
- metrics bounded below (loss >= 0, perplexity >= 1): the t-interval of log(mean - low) (delta method);
- anything else: Student's t-interval.
For these two a difference takes the Welch-Satterthwaite df. A difference's interval combines the two
sides' by MOVER (Zou & Donner 2008; diff_ci). These are t-intervals, not bootstraps: with 2-5 seeds a
percentile bootstrap of a mean is about [min, max] of the seeds, far too narrow. One seed gives no interval.
One value per (variant, seed) enters, the latest completed trial of that grid point, so a retried trial is
never counted twice."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as sps

from ablate.analysis.table import examples_column, latest_trials
from ablate.schema.metric_registry import UNBOUNDED, MetricRange, metric_range

LEVEL = 0.95


def seed_values(df: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Variant -> its finite metric values indexed by seed, from completed trials."""
    if metric not in df:
        return {}
    finite = np.isfinite(pd.to_numeric(df[metric], errors="coerce"))
    done = latest_trials(df[(df["state"] == "COMPLETE") & finite])
    return {v: g.set_index("seed")[metric].astype(float) for v, g in done.groupby("variant", sort=False)}


def variant_values(df: pd.DataFrame, metric: str) -> dict[str, np.ndarray]:
    """Variant -> its finite metric values, one per seed, from completed trials."""
    return {v: s.to_numpy() for v, s in seed_values(df, metric).items()}


# A metric's split, as its name spells it, -> the split whose example count trials record (split_sizes).
SPLIT_OF_PREFIX = {"val": "valid"}


def examples(df: pd.DataFrame, metric: str) -> int | None:
    """The fewest examples any completed trial measured `metric` on ("test/seq_acc": the test split), or
    None where trials did not record it."""
    split = metric.rsplit("/", 1)[0] if "/" in metric else ""
    column = examples_column(SPLIT_OF_PREFIX.get(split, split))
    if column not in df:
        return None
    counts = pd.to_numeric(df.loc[df["state"] == "COMPLETE", column], errors="coerce").dropna()
    return int(counts.min()) if len(counts) and counts.min() > 0 else None


def _spread(values: np.ndarray) -> float:
    """The sample variance; exactly 0 for equal values (np.var leaves ~1e-34 of rounding on them)."""
    return float(np.var(values, ddof=1)) if np.ptp(values) else 0.0


def _dispersion(units: list[np.ndarray], n_examples: int | None) -> float:
    """The quasi-binomial dispersion per seed, Var(seed's value) / (p(1 - p)), pooled over the groups
    (Pearson: sum of (k - 1) s^2 / (p(1 - p)) over sum of (k - 1)) and never below the binomial 1/n of
    n_examples (0 without a count). A group at p = 0 or 1 has no spread to add."""
    pooled = sum((len(u) - 1) * _spread(u) / (u.mean() * (1 - u.mean())) for u in units if 0 < u.mean() < 1)
    return max(pooled / sum(len(u) - 1 for u in units), 1 / n_examples if n_examples else 0.0)


def _wilson(unit: np.ndarray, dispersion: float, q: float) -> tuple[float, float]:
    """Wilson's score interval of the mean p of k proportions at effective sample size k / dispersion (Kish's
    design effect) and critical value q: in [0, 1], around p, at p = 0 or 1 as wide as for k * n examples."""
    p = float(unit.mean())
    if dispersion == 0:
        return (p, p)
    size = len(unit) / dispersion
    center = (p + q**2 / (2 * size)) / (1 + q**2 / size)
    half = q / (1 + q**2 / size) * math.sqrt(p * (1 - p) / size + q**2 / (4 * size**2))
    return (max(0.0, center - half), min(1.0, center + half))


def _log_scale(values: np.ndarray, low: float, q: float) -> tuple[float, float]:
    """t-interval of log(mean - low) by the delta method: (mean - low) * exp(±q * se / (mean - low)) + low.
    Stays above `low`, holds the mean, and is the plain t-interval when se is small against the mean."""
    excess = float(values.mean()) - low
    se = math.sqrt(_spread(values) / len(values))
    if excess <= 0 or se == 0:
        return (float(values.mean()), float(values.mean()))
    with np.errstate(over="ignore"):  # infinite at a level near 1 (ci_p's search)
        factor = float(np.exp(q * se / excess))
    return (low + excess / factor, low + excess * factor)


def t_quantile(level: float, df: float) -> float:
    return float(sps.t.ppf((1 + level) / 2, df))


def _welch_df(groups: list[np.ndarray]) -> float:
    """Welch-Satterthwaite df of sum(s^2/n) over the groups (one group: n - 1; none varies: sum(n - 1))."""
    terms = [(_spread(g) / len(g), len(g) - 1) for g in groups]
    variance = sum(v for v, _ in terms)
    return variance**2 / sum(v**2 / dof for v, dof in terms) if variance > 0 else sum(d for _, d in terms)


def _intervals(
    groups: list[np.ndarray], rng: MetricRange, n_examples: int | None, level: float
) -> list[tuple[float, float]]:
    """Each group's CI of its mean at one critical value (module doc): bounded metrics, Wilson with the pooled
    dispersion and sum(k - 1) df; others, the t-interval (log scale above a lower bound) at Welch's df."""
    if rng.bounded:
        width = rng.high - rng.low
        units = [(g - rng.low) / width for g in groups]
        dispersion, q = _dispersion(units, n_examples), t_quantile(level, sum(len(u) - 1 for u in units))
        return [
            (rng.low + lo * width, rng.low + hi * width)
            for lo, hi in (_wilson(u, dispersion, q) for u in units)
        ]
    q = t_quantile(level, _welch_df(groups))
    if math.isfinite(rng.low):
        return [_log_scale(g, rng.low, q) for g in groups]
    halves = [q * math.sqrt(_spread(g) / len(g)) for g in groups]
    return [(float(g.mean() - h), float(g.mean() + h)) for g, h in zip(groups, halves)]


def mean_ci(
    values: np.ndarray, rng: MetricRange = UNBOUNDED, n_examples: int | None = None, level: float = LEVEL
) -> tuple[float, float]:
    """The CI of the mean over seeds, inside the metric's range; NaN with fewer than two values (one seed
    says nothing of the spread between seeds)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return (np.nan, np.nan)
    return _intervals([values], rng, n_examples, level)[0]


def mean_table(rows: pd.DataFrame, keys: list[str], metric: str, n_column: str | None = None) -> pd.DataFrame:
    """Per group of `keys` (a variant at a length or a step), the mean of `metric` over its rows (one per
    seed) with mean_ci at the group's fewest examples in `n_column`: columns *keys, mean, ci_low, ci_high,
    seeds, groups in first-seen order. The report's and the dashboard's curves both draw it, so they agree."""
    rng, out = metric_range(metric), []
    for key, group in rows.groupby(keys, sort=False):
        values = group[metric].to_numpy(dtype=float)
        n_examples = int(group[n_column].min()) if n_column else 0
        out.append([*key, values.mean(), *mean_ci(values, rng, n_examples or None), len(values)])
    return pd.DataFrame(out, columns=[*keys, "mean", "ci_low", "ci_high", "seeds"])


def diff_ci(
    pairs: list[tuple[np.ndarray, np.ndarray]],
    rng: MetricRange = UNBOUNDED,
    n_examples: int | None = None,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """The mean over the k pairs of mean(a) - mean(b) and its CI by MOVER (Zou & Donner 2008; for one pair
    of proportions Newcombe's hybrid score interval): each variant's interval (_intervals) gives how far its
    mean may move down and up, and those distances, weighted 1/k, add in quadrature. With symmetric
    t-intervals this is exactly Welch's interval; range-respecting ones keep the difference in [low - high,
    high - low]. NaN estimate when a group is empty, NaN interval when one has fewer than two values."""
    if not pairs or any(len(a) == 0 or len(b) == 0 for a, b in pairs):
        return (np.nan, np.nan, np.nan)
    groups = [np.asarray(g, dtype=float) for pair in pairs for g in pair]
    weights = [sign / len(pairs) for _ in pairs for sign in (1.0, -1.0)]
    estimate = float(sum(w * g.mean() for w, g in zip(weights, groups)))
    if min(len(g) for g in groups) < 2:
        return (estimate, np.nan, np.nan)
    downs, ups = [], []
    for w, g, (lo, hi) in zip(weights, groups, _intervals(groups, rng, n_examples, level)):
        below, above = float(g.mean() - lo) * abs(w), float(hi - g.mean()) * abs(w)
        downs.append(below if w > 0 else above)
        ups.append(above if w > 0 else below)
    # hypot: in quadrature without squaring, so a near-infinite end (a level near 1) does not overflow
    return (estimate, estimate - math.hypot(*downs), estimate + math.hypot(*ups))


def ci_p(
    pairs: list[tuple[np.ndarray, np.ndarray]], rng: MetricRange = UNBOUNDED, n_examples: int | None = None
) -> float:
    """The two-sided p-value inverting diff_ci: the smallest alpha whose 1 - alpha CI of the difference
    excludes 0, by a root search over the level (the intervals are nested in it), so p < 0.05 exactly when
    the 95% CI excludes 0 (Welch's t-test where that CI is Welch's, for unbounded metrics). 1 for a
    difference of 0; 0 when no level's interval reaches 0 (seeds without spread, no example count); NaN
    where diff_ci gives none."""
    estimate, lo, _ = diff_ci(pairs, rng, n_examples)
    if not np.isfinite(lo):
        return np.nan
    if estimate == 0:
        return 1.0

    def gap(alpha: float) -> float:  # > 0 while the 1 - alpha interval excludes 0
        _, low, high = diff_ci(pairs, rng, n_examples, 1 - alpha)
        return low if estimate > 0 else -high

    widest = 1e-15  # 1 - alpha rounds to 1 below about 1e-16
    if gap(widest) > 0:
        return 0.0
    return float(optimize.brentq(gap, widest, 1.0, xtol=1e-300, rtol=1e-13))


PERMUTATION_RESAMPLES = 9999


def permutation_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided permutation test of the difference of means: exact when the relabellings number at
    most PERMUTATION_RESAMPLES, Monte Carlo (seed 0) otherwise. NaN with fewer than two values a side."""
    if len(a) < 2 or len(b) < 2:
        return np.nan
    result = sps.permutation_test(
        (a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis), vectorized=True,
        permutation_type="independent", alternative="two-sided", n_resamples=PERMUTATION_RESAMPLES,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    return float(result.pvalue)


def permutation_floor(n_a: int, n_b: int, n_resamples: int = PERMUTATION_RESAMPLES) -> float:
    """The smallest p permutation_p can return for groups of n_a and n_b values: twice one relabelling in
    C(n_a + n_b, n_a) when exact (2 vs 2 seeds: 2/6), twice one in n_resamples + 1 when Monte Carlo."""
    relabellings = math.comb(n_a + n_b, n_a)
    return min(1.0, 2 / (relabellings if relabellings <= n_resamples else n_resamples + 1))


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaNs stay NaN and do not count as tests)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    # The k-th smallest of m p-values times m - k (k from 0), capped at 1, and never below the one before it.
    out[order] = np.maximum.accumulate(np.minimum(1.0, (len(order) - np.arange(len(order))) * p[order]))
    return out.tolist()


# Hedges' g needs this many values a side: from two, the pooled SD rests on 2 df and g swings by a
# factor of several between reruns, a number that looks meaningful and is not.
G_MIN_SEEDS = 3


def hedges_g(a: np.ndarray, b: np.ndarray) -> float:
    """Standardized mean difference (a - b) with the pooled SD and the small-sample correction;
    NaN with fewer than G_MIN_SEEDS values a side or zero pooled variance."""
    na, nb = len(a), len(b)
    if min(na, nb) < G_MIN_SEEDS:
        return np.nan
    pooled = ((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2)
    if pooled == 0:
        return np.nan
    correction = 1 - 3 / (4 * (na + nb) - 9)
    return float((a.mean() - b.mean()) / np.sqrt(pooled) * correction)


def difference(a: np.ndarray, b: np.ndarray, rng: MetricRange, n_examples: int | None) -> dict[str, float]:
    """mean(a) - mean(b) with its 95% CI (diff_ci) and the p-value of that same interval (ci_p)."""
    diff, lo, hi = diff_ci([(a, b)], rng, n_examples)
    return {"diff": diff, "diff_ci_low": lo, "diff_ci_high": hi, "p": ci_p([(a, b)], rng, n_examples)}


def summarize(
    df: pd.DataFrame, metric: str, order: list[str], baseline: str | None, direction: str = "maximize"
) -> pd.DataFrame:
    """One row per variant in `order`: n, mean, std, 95% CI; against the baseline, diff (variant - baseline)
    with its CI and p (ci_p), p_holm (Holm across the non-baseline variants), p_perm with its floor
    p_perm_floor, and Hedges' g; and rank (1 = best mean in the metric's direction)."""
    values = variant_values(df, metric)
    rng, n_examples = metric_range(metric), examples(df, metric)
    base = values.get(baseline, np.array([]))
    rows = []
    for variant in order:
        v = values.get(variant, np.array([]))
        lo, hi = mean_ci(v, rng, n_examples)
        row = {"variant": variant, "n": len(v), "mean": v.mean() if len(v) else np.nan,
               "std": v.std(ddof=1) if len(v) > 1 else np.nan, "ci_low": lo, "ci_high": hi,
               "diff": np.nan, "diff_ci_low": np.nan, "diff_ci_high": np.nan, "p": np.nan,
               "p_perm": np.nan, "p_perm_floor": np.nan, "g": np.nan}  # fmt: skip
        if variant != baseline and len(base):
            row.update(difference(v, base, rng, n_examples))
            row["p_perm"] = permutation_p(v, base)
            row["p_perm_floor"] = (
                permutation_floor(len(v), len(base)) if np.isfinite(row["p_perm"]) else np.nan
            )
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
