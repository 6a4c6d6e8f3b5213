"""Verdicts on a study's claims: reproduced, contradicted or inconclusive, with the numbers behind them.

Matching. A claim's `compare` and `to` select the variants whose overrides contain every given key/value
(for named variants the overrides include 'preset'). Variants selected by `compare` are removed from
the `to` side, so `to: {preset: transformer}` means "the transformers that are not the compared one".

Pairing. In a factor grid a selector usually matches several variants (one per level of the other
factors). Each compare variant is paired with the `to` variant that has the same overrides once the
`to` keys are applied; when every compare variant finds its partner, the effect is the mean over pairs
of mean(compare) - mean(to): the effect averaged over the other factors. Otherwise (named variants)
the trials of each side are pooled and the effect is mean(compare) - mean(to) over the pooled seeds.
The 95% CI is stats.diff_ci's: every variant's seeds are independent runs, each variant's interval
respects the metric's range, and MOVER adds them up, so the CI of a difference of accuracies stays
within [-1, 1].

Scale. Losses and perplexities (scale "ratio" in schema.metric_registry) are judged on the log scale:
every seed's value enters as its log, so d = log(compare / to) of the sides' geometric means, its CI is the
t-interval of logs (as stats gives losses theirs), and a margin m is a ratio: the smallest effect that
counts is one side 1 + m times the other, d beyond ±log(1 + m). A loss of 0.002 against 0.056 is then the
factor 28 it is, not 0.054 of a nat that no margin fixed in nats could foresee. Every other metric is judged
on its own scale, d = compare - to, with a margin in its units.

Verdict, with d = compare - to, CI [lo, hi] and margin m >= 0 (the smallest effect that counts):
  expect lower:   reproduced if hi < -m; contradicted if lo > -m; inconclusive otherwise.
  expect higher:  reproduced if lo > m;  contradicted if hi < m;  inconclusive otherwise.
  expect similar: reproduced if -m <= lo and hi <= m; contradicted if lo > m or hi < -m;
                  inconclusive otherwise.
So a claim is reproduced only when the whole CI clears the margin in the claimed direction, and
contradicted when the whole CI lies on the other side of it (the data rule out an effect that large).
A side with fewer than two seeds has no CI, so its claim is inconclusive; on exact match (`seq_acc`,
exact_match in the registry) a side needs three (MIN_SEEDS_EXACT): a model either learns a task's rule or
does not, so exact match splits between seeds (0.24 in one, 0.98 in the next), and two seeds that happen to
agree give a spread, and an interval, that says nothing of that split. Pending instead of inconclusive while
trials of the claim are still queued or running.

Looks. With adaptive seeds (`seeds: {min, max, step}`) a claim is judged at up to K looks, after min,
min + step, ..., max seeds per variant; the first look whose verdict is not inconclusive (reproduced,
contradicted, or uninformative: more seeds cannot change it) decides it, and later seeds, run for other
claims, do not reopen it. Each look's CI has level 1 - 0.05/K (Bonferroni over the K looks fixed in
advance), so the chance that any look's CI misses the true effect, and with it the chance of a wrong
verdict at whichever look stops, is at most 0.05 whatever the stopping rule. A study with a list of seeds
has one look at level 0.95. The sweep asks `seeds_wanted` which variants need the next look's seeds:
those of claims still open; the report and the sweep both read these verdicts, so the queue stops exactly
where the report says a claim was decided.

Selectors match a variant's settings: its overrides plus the model keys its preset sets (the variant's
preset, else the study base's), so `model.arch: lstm` selects the variants of `preset: lstm-bahdanau`.
A claim's `within` selects both sides within a sub-grid.

Interaction claims (`versus`). Δ = (compare - to on the claim's metric and `within`) - (compare - to on
versus.metric and versus.within): one difference compared with another, e.g. the drop from test to
test_long with and without attention. Each of the four cells is a per-seed value (the mean over the
cell's variants at that seed). Where all four cells hold the same two or more seeds, the contrast is
formed per seed and its CI is the Student t CI of their mean (stats.mean_ci): paired by seed, as the
seeds share their data. Otherwise the cells are independent groups and the CI is Welch's
(stats.diff_ci of the pairs (compare, to) and (to', compare'), doubled). Either CI is cut to the range a
difference of differences can take: ±2 (high - low) for a metric in [low, high] (judged_range). The
verdict rule is the one above.

Uninformative. Some outcomes say nothing about the claim, whatever the CI:
  unattainable margin: on a metric in [low, high], a `lower` claim whose `to` side's mean lies within
    the margin of `low` (no compare side could lie m below it), or a `higher` one within m of `high`,
    unless the CI lies wholly on the other side of 0 (then the claim is contradicted, margin or not);
  ceiling / floor: a `similar` claim whose two sides both have means within the margin of the metric's
    upper (lower) bound (judged_range): they are similar because neither can move;
  cannot learn: with `chance` given, a side whose 95% CI of the mean lies wholly on the chance side of it
    (upper bound below chance for metrics where higher is better, lower bound above it for those the
    registry minimizes: loss, perplexity and AER): a comparison against a model that learned nothing of
    the task."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ablate.analysis.stats import LEVEL, diff_ci, examples, mean_ci, seed_values, t_quantile
from ablate.schema.metric_registry import UNBOUNDED, MetricRange, metric_info
from ablate.schema.spec import ClaimSpec, StudySpec, Value, variant_settings

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
# Too few completed seeds on a side while trials of the claim are still queued or running: not judged yet.
PENDING = "pending"
CEILING, FLOOR, UNLEARNT = "uninformative (ceiling)", "uninformative (floor)", "uninformative (cannot learn)"
UNATTAINABLE = "uninformative (margin unattainable)"
MIN_SEEDS = 2
MIN_SEEDS_EXACT = 3  # exact match: see the module docstring
MAX_PROJECTED_SEEDS = 1000  # seeds_to_decide looks no further
FINISHED = ("COMPLETE", "FAIL", "PRUNED")  # trial states that will not change


def on_ratio_scale(metric: str) -> bool:
    """Whether claims judge `metric` as log(compare / to), its margins as ratios (module docstring)."""
    return metric_info(metric).scale == "ratio"


def judged_range(metric: str) -> MetricRange:
    """The range of the values claims judge `metric` on: its own, or none for the logs of a ratio metric."""
    return UNBOUNDED if on_ratio_scale(metric) else metric_info(metric).range


def effect_name(metric: str) -> str:
    """What Δ is on `metric`'s scale, in the report's words."""
    return "log(compare / to)" if on_ratio_scale(metric) else "compare - to"


def min_seeds(metric: str) -> int:
    """The seeds a side needs for a verdict on `metric` (module docstring)."""
    return MIN_SEEDS_EXACT if metric_info(metric).exact_match else MIN_SEEDS


def threshold(claim: ClaimSpec, metric: str) -> float:
    """The margin on the scale Δ is measured on: log(1 + m) for a ratio, m otherwise."""
    m = abs(claim.margin)
    return math.log1p(m) if on_ratio_scale(metric) else m


def on_scale(values: pd.Series, metric: str) -> pd.Series:
    """Values of `metric` on the scale claims judge them: logs for a ratio metric (a value of 0 or less has
    no log: NaN, and the claim stays inconclusive)."""
    return np.log(values.where(values > 0)) if on_ratio_scale(metric) else values


@dataclass
class ClaimResult:
    claim: ClaimSpec
    metric: str
    verdict: str
    reason: str
    compare: list[str] = field(default_factory=list)
    to: list[str] = field(default_factory=list)
    paired: bool = False
    n_compare: int = 0
    n_to: int = 0
    mean_compare: float = np.nan
    mean_to: float = np.nan
    diff: float = np.nan
    ci_low: float = np.nan
    ci_high: float = np.nan
    # Interaction claims: the second difference's metric, the two differences, whether paired by seed.
    versus_metric: str | None = None
    diff_first: float = np.nan
    diff_versus: float = np.nan
    paired_by_seed: bool = False
    variants: list[str] = field(default_factory=list)  # every variant the claim compares, both arms
    level: float = LEVEL
    look: int = 0  # the look these numbers come from (0-based)
    decided: bool = False  # reproduced or contradicted at a look whose seeds all finished
    budget_spent: bool = False  # still inconclusive after the last look's seeds finished
    running: bool = False  # the look's trials have not all finished: a provisional verdict
    looks: int = 1  # how many looks the study plans
    seeds: int = 0  # seeds per variant at this look

    @property
    def expected(self) -> str:
        """The outcome the claim expects, on Δ's own scale: 'below -0.3', or 'below -0.693' for a ratio
        margin of 1 on a loss (Δ is then log(compare / to))."""
        m = threshold(self.claim, self.metric)
        return {"lower": f"below {0 - m:.3g}", "higher": f"above {m:.3g}", "similar": f"within ±{m:.3g}"}[
            self.claim.expect
        ]  # 0 - m: a margin of 0 reads 'below 0', not 'below -0'

    @property
    def margin_text(self) -> str:
        """The margin as the study file gives it, with the log it is judged at for a ratio: '0.3', or
        'ratio 2 (log 0.693)' for a margin of 1 on a loss."""
        m = abs(self.claim.margin)
        if not on_ratio_scale(self.metric) or m == 0:
            return f"{m:g}"
        return f"ratio {1 + m:g} (log {threshold(self.claim, self.metric):.3g})"

    @property
    def decision(self) -> str:
        """When the verdict was reached, for the report: 'look 1 of 3 (2 seeds, 98.3% CIs)', or why not."""
        at = f"{self.seeds} seeds, {self.level:.1%} CIs".replace(".0%", "%")
        if self.decided:
            return f"look {self.look + 1} of {self.looks} ({at})"
        if self.budget_spent:
            needed = seeds_to_decide(self)
            return f"budget spent ({at}); " + (
                f"about {needed} seeds per variant would decide it at this spread" if needed
                else f"no seed count up to {MAX_PROJECTED_SEEDS} would: Δ sits on the margin"
            )  # fmt: skip
        return (
            f"open: look {self.look + 1} of {self.looks} running"
            if self.running
            else "open: more seeds queued"
        )


def seeds_to_decide(r: ClaimResult) -> int | None:
    """Seeds per variant at which an undecided claim's CI would clear its margin if Δ and the spread
    between seeds stayed as they are: the half-width scales as t(k - 1)/sqrt(k) at the claim's level, k the
    values a side (seeds times the variants a side pools). None when no k up to MAX_PROJECTED_SEEDS would
    (Δ on, or too near, the margin)."""
    k, half = max(r.seeds, min(r.n_compare, r.n_to)), (r.ci_high - r.ci_low) / 2
    m = threshold(r.claim, r.metric)
    edge = {"lower": -m, "higher": m}.get(r.claim.expect)
    # Distance from Δ to the nearest edge its CI must clear (for "similar": to ±m from inside or outside).
    distance = abs(r.diff - edge) if edge is not None else abs(m - abs(r.diff))
    if k < MIN_SEEDS or not (np.isfinite(half) and half > 0 and distance > 0):
        return None
    width = lambda n: t_quantile(r.level, n - 1) / math.sqrt(n)  # noqa: E731
    needed = next(
        (n for n in range(k + 1, MAX_PROJECTED_SEEDS + 1) if half * width(n) / width(k) < distance), None
    )
    # A side pooling two variants gains two values a seed: the budget is counted in seeds per variant.
    return None if needed is None else math.ceil(needed * max(r.seeds, 1) / k)


def matching_variants(overrides: dict[str, dict[str, Value]], selector: dict[str, Value]) -> list[str]:
    return [name for name, o in overrides.items() if all(k in o and o[k] == v for k, v in selector.items())]


def claim_sides(
    settings: dict[str, dict[str, Value]], claim: ClaimSpec, within: dict[str, Value]
) -> tuple[list[str], list[str]]:
    """The compare and to variants of a claim within a sub-grid; compare's are left out of to."""
    compare = matching_variants(settings, {**claim.compare, **within})
    return compare, [v for v in matching_variants(settings, {**claim.to, **within}) if v not in compare]


def verdict(lo: float, hi: float, expect: str, margin: float) -> str:
    """See the module docstring; NaN bounds are inconclusive."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return INCONCLUSIVE
    m = abs(margin)
    if expect == "lower":
        return REPRODUCED if hi < -m else CONTRADICTED if lo > -m else INCONCLUSIVE
    if expect == "higher":
        return REPRODUCED if lo > m else CONTRADICTED if hi < m else INCONCLUSIVE
    if -m <= lo and hi <= m:
        return REPRODUCED
    return CONTRADICTED if lo > m or hi < -m else INCONCLUSIVE


def _pairs(
    overrides: dict[str, dict[str, Value]], compare: list[str], to: list[str], claim: ClaimSpec
) -> list[tuple[str, str]] | None:
    """(compare, to) variant pairs that differ only in the claim's keys, or None if some compare
    variant has no such partner."""
    pairs = []
    for c in compare:
        target = {**overrides[c], **claim.to}
        partner = [t for t in to if overrides[t] == target]
        if len(partner) != 1:
            return None
        pairs.append((c, partner[0]))
    return pairs


def evaluate(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, level: float = LEVEL) -> ClaimResult:
    """The claim's verdict on the completed trials in `df`, with CIs at `level`."""
    if claim.versus is not None:
        return evaluate_interaction(spec, claim, df, level)
    ((metric, within),) = claim.arms(spec.metric.name)
    overrides = variant_settings(spec)
    compare, to = claim_sides(overrides, claim, within)
    result = ClaimResult(claim, metric, INCONCLUSIVE, "", compare, to, level=level)
    if not compare or not to:
        side = "compare" if not compare else "to"
        result.reason = f"no variant matches {side}: {getattr(claim, side)}"
        return result
    raw = seed_values(df, metric)
    values = {v: on_scale(x, metric).to_numpy() for v, x in raw.items()}
    empty = np.array([])
    pairs = _pairs(overrides, compare, to, claim)
    result.paired = pairs is not None and len(pairs) > 1
    if pairs is not None:
        groups = [(values.get(c, empty), values.get(t, empty)) for c, t in pairs]
    else:
        groups = [tuple(np.concatenate([values.get(v, empty) for v in side]) for side in (compare, to))]
    pooled_c, pooled_t = (np.concatenate([g[i] for g in groups]) for i in (0, 1))
    result.n_compare, result.n_to = len(pooled_c), len(pooled_t)
    # On the log scale the means shown are geometric, so that Δ is the log of their ratio.
    unscale = np.exp if on_ratio_scale(metric) else float
    result.mean_compare = unscale(pooled_c.mean()) if len(pooled_c) else np.nan
    result.mean_to = unscale(pooled_t.mean()) if len(pooled_t) else np.nan
    result.diff, result.ci_low, result.ci_high = diff_ci(
        groups, judged_range(metric), examples(df, metric), level
    )
    fewest, needed = min(min(len(a), len(b)) for a, b in groups), min_seeds(metric)
    if fewest < needed:
        result.reason = f"a variant has {fewest} completed seed(s) of {metric}; a verdict needs {needed}"
        result.verdict = PENDING if unfinished(df, compare + to) else INCONCLUSIVE
        return result
    result.verdict = verdict(result.ci_low, result.ci_high, claim.expect, threshold(claim, metric))
    result.reason = _reason(result)
    sides = [(label, side, np.concatenate([raw[v].to_numpy() for v in side if v in raw] or [empty]))
             for label, side in (("compare", compare), ("to", to))]  # fmt: skip
    if not _uninformative(result, sides):
        _at_bound(result)
        _unattainable(result)
    return result


def _cells(
    spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame
) -> tuple[list[tuple[str, list[str], str]], list[pd.Series]]:
    """An interaction's four cells, (label, variants, metric) each, in the order compare, to, compare',
    to', and each cell's values by seed: at every seed all its variants have, their mean."""
    settings = variant_settings(spec)
    cells, series = [], []
    for arm, (arm_metric, within) in enumerate(claim.arms(spec.metric.name)):
        values = seed_values(df, arm_metric)
        suffix = "" if arm == 0 else "'"
        for side, variants in zip(("compare", "to"), claim_sides(settings, claim, within)):
            cells.append((side + suffix, variants, arm_metric))
            columns = [values[v] for v in variants if v in values]
            found = pd.concat(columns, axis=1).dropna() if len(columns) == len(variants) and columns else None
            series.append(found.mean(axis=1) if found is not None else pd.Series(dtype=float))
    return cells, series


def evaluate_interaction(
    spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, level: float = LEVEL
) -> ClaimResult:
    """Δ = (compare - to) - (compare' - to'), see the module docstring."""
    cells, raw = _cells(spec, claim, df)
    metric, versus_metric = cells[0][2], cells[2][2]
    c1, t1, c2, t2 = (on_scale(s, m) for s, (_, _, m) in zip(raw, cells))
    result = ClaimResult(
        claim, metric, INCONCLUSIVE, "", cells[0][1], cells[1][1], versus_metric=versus_metric, level=level
    )
    empty = [label for (label, variants, _), s in zip(cells, (c1, t1, c2, t2)) if not variants]
    if empty:
        result.reason = f"no variant matches {', '.join(empty)}"
        return result
    result.n_compare, result.n_to = min(len(c1), len(c2)), min(len(t1), len(t2))
    result.mean_compare, result.mean_to = c1.mean() - c2.mean(), t1.mean() - t2.mean()
    result.diff_first, result.diff_versus = c1.mean() - t1.mean(), c2.mean() - t2.mean()
    seeds = sorted(c1.index)
    result.paired_by_seed = len(seeds) >= MIN_SEEDS and all(sorted(s.index) == seeds for s in (t1, c2, t2))
    if result.paired_by_seed:
        contrast = (c1 - t1 - c2 + t2).to_numpy()
        result.diff, (lo, hi) = float(contrast.mean()), mean_ci(contrast, level=level)
    else:
        cell_pairs = [(c1.to_numpy(), t1.to_numpy()), (t2.to_numpy(), c2.to_numpy())]
        estimate, lo, hi = diff_ci(cell_pairs, level=level)
        result.diff, lo, hi = 2 * estimate, 2 * lo, 2 * hi
    # (a - b) - (c - d): a difference in the first metric's difference range less one in the second's.
    first, second = (judged_range(m).difference() for m in (metric, versus_metric))
    result.ci_low, result.ci_high = max(lo, first.low - second.high), min(hi, first.high - second.low)
    fewest, needed = min(len(s) for s in (c1, t1, c2, t2)), max(min_seeds(metric), min_seeds(versus_metric))
    if fewest < needed:
        result.reason = f"a cell has {fewest} completed seed(s); a verdict needs {needed}"
        result.verdict = (
            PENDING if unfinished(df, [v for _, variants, _ in cells for v in variants]) else INCONCLUSIVE
        )
        return result
    result.verdict = verdict(result.ci_low, result.ci_high, claim.expect, threshold(claim, metric))
    result.reason = (
        f"Δ = ({result.diff_first:.3g} on {metric}) - ({result.diff_versus:.3g} on {versus_metric}); "
        + _reason(result)
    )
    sides = [(label, variants, s.to_numpy()) for (label, variants, _), s in zip(cells, raw)]
    _uninformative(result, sides)
    return result


def unfinished(df: pd.DataFrame, variants: list[str]) -> bool:
    """Whether trials of `variants` are still queued or running."""
    return bool((df["variant"].isin(variants) & ~df["state"].isin(FINISHED)).any())


def cannot_learn(values: np.ndarray, metric: str, chance: float) -> bool:
    """Whether the 95% CI of the mean lies wholly on the chance side of `chance` (see the module doc)."""
    lo, hi = mean_ci(values)
    if metric_info(metric).direction == "minimize":
        return bool(lo > chance)
    return bool(hi < chance)


def _uninformative(result: ClaimResult, sides: list[tuple[str, list[str], np.ndarray]]) -> bool:
    """With `chance` given: marks the claim uninformative when a side cannot learn the task."""
    chance = result.claim.chance
    if chance is None:
        return False
    metric = result.metric
    unlearnt = [f"{label} ({', '.join(variants)})" for label, variants, values in sides
                if len(values) and cannot_learn(values, metric, chance)]  # fmt: skip
    if unlearnt:
        result.verdict = UNLEARNT
        result.reason = f"{'; '.join(unlearnt)}: 95% CI of the mean on the chance side of {chance:g}"
    return bool(unlearnt)


def _at_bound(result: ClaimResult) -> None:
    """Marks a `similar` claim whose two sides both sit within the margin of the metric's bound (a ratio
    metric's logs have none)."""
    rng, m = judged_range(result.metric), abs(result.claim.margin)
    if result.claim.expect != "similar":
        return
    means = (result.mean_compare, result.mean_to)
    if all(x >= rng.high - m for x in means):
        result.verdict, bound = CEILING, f"the upper bound {rng.high:g}"
    elif all(x <= rng.low + m for x in means):
        result.verdict, bound = FLOOR, f"the lower bound {rng.low:g}"
    else:
        return
    result.reason = f"both means lie within the margin {m:g} of {bound}: neither side can move"


def _unattainable(result: ClaimResult) -> None:
    """Marks a `lower` (`higher`) claim on a bounded metric whose `to` side's mean lies within the margin
    of the metric's lower (upper) bound: no compare side could clear the margin (a ratio metric's logs have
    no bound)."""
    rng, m, expect = judged_range(result.metric), abs(result.claim.margin), result.claim.expect
    if expect == "similar" or m == 0:
        return
    room = result.mean_to - rng.low if expect == "lower" else rng.high - result.mean_to
    # Data that rule out even a zero effect in the claimed direction contradict it, whatever the margin.
    if room < m and verdict(result.ci_low, result.ci_high, expect, 0.0) != CONTRADICTED:
        bound = f"lower bound {rng.low:g}" if expect == "lower" else f"upper bound {rng.high:g}"
        result.verdict = UNATTAINABLE
        result.reason = f"the to side's mean {result.mean_to:.3g} lies within the margin {m:g} of the {bound}"


def _reason(r: ClaimResult) -> str:
    ci = f"CI of {effect_name(r.metric)} [{r.ci_low:.3g}, {r.ci_high:.3g}]"
    bound = r.expected
    if r.verdict == REPRODUCED:
        return f"{ci} lies {bound}"
    if r.verdict == CONTRADICTED:
        return f"{ci} rules out an effect {bound}"
    return f"{ci} straddles the margin (expected {bound})"


def claim_variants(spec: StudySpec, claim: ClaimSpec) -> list[str]:
    """Every variant a claim compares: both sides of each of its arms."""
    settings = variant_settings(spec)
    found = [v for _, within in claim.arms(spec.metric.name) for side in claim_sides(settings, claim, within)
             for v in side]  # fmt: skip
    return list(dict.fromkeys(found))


def look_level(spec: StudySpec) -> float:
    """The confidence level of each look: 1 - 0.05 / (number of looks)."""
    return 1 - (1 - LEVEL) / len(spec.seed_looks)


def _look_trials(spec: StudySpec, df: pd.DataFrame, variants: list[str], look: int) -> pd.DataFrame | None:
    """The trials of `variants` whose seeds the look covers, or None when some of those seeds were never
    queued (the look was not reached)."""
    seeds = spec.seed_pool[: spec.seed_looks[look]]
    rows = df[df["variant"].isin(variants) & df["seed"].isin(seeds)]
    queued = rows.groupby("variant")["seed"].nunique()
    return rows if all(queued.get(v, 0) == len(seeds) for v in variants) else None


def judge(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame) -> ClaimResult:
    """The claim at each look in turn, until one decides it, the next was not reached, or one is still
    running (its trials then give a provisional verdict); see the module docstring."""
    level = look_level(spec)
    result = evaluate(spec, claim, df, level)
    result.looks, result.running = len(spec.seed_looks), True  # until its first look's seeds are queued
    variants = claim_variants(spec, claim)
    for look in range(len(spec.seed_looks)):
        rows = _look_trials(spec, df, variants, look)
        if rows is None:
            break
        result = evaluate(spec, claim, rows, level)
        result.look, result.looks, result.seeds = look, len(spec.seed_looks), spec.seed_looks[look]
        result.variants = variants
        finished = rows["state"].isin(FINISHED).all()
        result.decided = finished and result.verdict != INCONCLUSIVE
        result.budget_spent = finished and not result.decided and look == len(spec.seed_looks) - 1
        result.running = not finished
        if result.decided or not finished:
            break
    return result


def seeds_wanted(spec: StudySpec, results: list[ClaimResult]) -> dict[str, int]:
    """Variant -> how many seeds the next look needs, for the variants of claims still open after a look
    whose trials all finished; empty when no claim can use more seeds."""
    wanted: dict[str, int] = {}
    for r in results:
        if r.decided or r.budget_spent or r.running or not (r.compare and r.to):
            continue
        count = spec.seed_looks[r.look + 1]
        for variant in r.variants:
            wanted[variant] = max(wanted.get(variant, 0), count)
    return wanted


def evaluate_all(spec: StudySpec, df: pd.DataFrame) -> list[ClaimResult]:
    return [judge(spec, claim, df) for claim in spec.claims]
