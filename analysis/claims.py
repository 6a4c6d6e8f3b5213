"""Verdicts on a study's claims: reproduced, contradicted or inconclusive, with the numbers behind them.

Kinds. A claim is a `test` of a paper's finding (the default) or a `check` of a mechanism that holds by
construction (a Transformer without positions cannot reverse), kept as a guard on the code. Both are judged
by the rules below; the report, `ablate status` and the API count and show them apart (by_kind).

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
  expect lower:     reproduced if hi < -m; contradicted if lo > -m; inconclusive otherwise.
  expect higher:    reproduced if lo > m;  contradicted if hi < m;  inconclusive otherwise.
  expect similar:   reproduced if -m <= lo and hi <= m; contradicted if lo > m or hi < -m;
                    inconclusive otherwise.
  expect not_worse: non-inferiority, compare at most m worse than to in the metric's direction (the
                    registry's): where higher is better reproduced if lo > -m, contradicted if hi < -m;
                    where lower is better reproduced if hi < m, contradicted if lo > m. Not superiority: a
                    CI that holds 0 can reproduce it.
So a claim is reproduced only when the whole CI clears the margin in the claimed direction, and
contradicted when the whole CI lies on the other side of it (the data rule out an effect that large).
A variant with fewer than two completed seeds gives no CI, so its claim is inconclusive; on exact match
(`seq_acc`, exact_match in the registry) every variant needs three (MIN_SEEDS_EXACT): a model either learns
a task's rule or does not, so exact match splits between seeds (0.24 in one, 0.98 in the next), and two seeds
that happen to agree give a spread, and an interval, that says nothing of that split. The floor counts seeds
of each variant, not the values a side pools: two variants of two seeds each are still two seeds of either.
Pending instead of inconclusive while trials of the claim are still queued or running.

Looks. With adaptive seeds (`seeds: {min, max, step}`) a claim is judged at up to K looks, after min,
min + step, ..., max seeds per variant; the first look whose verdict is not inconclusive (reproduced,
contradicted, or uninformative: more seeds cannot change it) decides it, and later seeds, run for other
claims, do not reopen it. Each look's CI has level 1 - 0.05/K (Bonferroni over the K looks fixed in
advance), so the chance that any look's CI misses the true effect, and with it the chance of a wrong
verdict at whichever look stops, is at most 0.05 whatever the stopping rule. A study with a list of seeds
has one look at level 0.95. The sweep asks `seeds_wanted` which variants need the next look's seeds:
those of claims still open (a control's variants with its claim's); the report and the sweep both read
these verdicts, so the queue stops exactly where the report says a claim was decided.

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
verdict rule is the one above. Δ is also each side's change between the arms, (compare - compare') -
(to - to'): the report's means of an interaction, which the bound rules below read.

Uninformative. Some outcomes say nothing about the claim, whatever the CI. The bounds are the metric's on
the scale it is judged on (judged_bounds): its range, or for a ratio metric the logs of its range, so a
perplexity's 1 is a bound (log 0) and a loss's 0 is none (a ratio of two small losses can be anything).
  unattainable margin: a `lower` claim whose `to` side lies within the margin of the lower bound (no
    compare side could lie m below it), or a `higher` one within m of the upper bound, unless the CI lies
    wholly on the other side of 0 (then the claim is contradicted, margin or not). For an interaction the
    `to` side is its change to - to', bounded by [low - high', high - low'] of the two arms' metrics:
    where the to side itself falls from the top to the bottom, no compare side can fall m further;
  ceiling / floor: a `similar` claim whose bounds alone hold Δ within the margin: both means within the
    margin of one bound of the metric (for an interaction, each arm's two means within half the margin of
    a bound of its metric: neither difference can move). A `not_worse` claim whose `to` side lies within
    the margin of the metric's worse bound (the lower where higher is better): no compare side can be
    worse by more than the margin, so the claim cannot fail;
  insensitive: a `similar` or `not_worse` claim that would be reproduced, whose positive control (two
    sides of the same study designed to differ, `control`, judged on the claim's metric at its level as a
    `similar` claim within the same margin) does not move the metric beyond the margin: its CI lies
    within ±m. Agreement then says nothing, since the metric does not move where a difference is designed
    in. A control whose CI straddles ±m leaves the claim inconclusive (pending while its trials run), so
    adaptive looks give it more seeds; one that clears ±m lets the verdict stand and is named in the
    reason. An agreement that would be reproduced without a control is uninformative (no positive
    control): nothing shows that the metric could have told the sides apart;
  cannot learn: with `chance` given, a side whose 95% CI of the mean lies wholly on the chance side of it
    (upper bound below chance for metrics where higher is better, lower bound above it for those the
    registry minimizes: loss, perplexity and AER): a comparison against a model that learned nothing of
    the task;
  below the study's level: with the study's `judge_from` (a metric and a value, fixed before the run), every
    claim whose look finds the baseline's mean on that metric, or the mean of a variant the claim compares,
    short of the value (below it where higher is better, above where lower is): those models have not
    learned the task well enough at this budget for the claim to be judged, so the verdict is that this
    profile cannot decide, not a verdict on the claimed factor. It ends the looks: more seeds of models this
    weak would not change it.

Failed seeds. With `chance` given, a seed of a variant whose value is at or on the chance side of it (at
or below chance where higher is better, at or above where lower is) failed to train, and the claim is not
decided by it: failed seeds are left out, the claim is judged on the seeds that trained (each variant
still needs its two, or three, trained seeds, else it is inconclusive, or pending), and the reason says how
many seeds failed on each side, so that a failure rate that differs between the sides is seen, not
averaged into Δ. In an interaction paired by seed, a seed that failed in any cell leaves all four, so the
contrast stays paired."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ablate.analysis.stats import LEVEL, diff_ci, examples, mean_ci, seed_values, t_quantile
from ablate.schema.metric_registry import UNBOUNDED, MetricRange, metric_info
from ablate.schema.spec import AGREEMENT, ClaimSpec, StudySpec, Value, variant_settings

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
# Too few completed seeds on a side while trials of the claim are still queued or running: not judged yet.
PENDING = "pending"
CEILING, FLOOR, UNLEARNT = "uninformative (ceiling)", "uninformative (floor)", "uninformative (cannot learn)"
UNATTAINABLE = "uninformative (margin unattainable)"
INSENSITIVE = "uninformative (insensitive)"
UNCONTROLLED = "uninformative (no positive control)"
UNDECIDABLE = "uninformative (below the study's level)"
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


def judged_bounds(metric: str) -> MetricRange:
    """The bounds the uninformative rules read, on the scale claims judge `metric` on: its range, or the logs
    of a ratio metric's (a perplexity's 1 is log 0; a loss's 0 has no log, so no bound)."""
    rng = metric_info(metric).range
    if not on_ratio_scale(metric):
        return rng
    log = lambda x: math.log(x) if x > 0 else -math.inf  # noqa: E731
    return MetricRange(log(rng.low), log(rng.high))


def effect_name(metric: str) -> str:
    """What Δ is on `metric`'s scale, in the report's words."""
    return "log(compare / to)" if on_ratio_scale(metric) else "compare - to"


def min_seeds(metric: str) -> int:
    """The seeds each variant needs for a verdict on `metric` (module docstring)."""
    return MIN_SEEDS_EXACT if metric_info(metric).exact_match else MIN_SEEDS


def threshold(claim: ClaimSpec, metric: str) -> float:
    """The margin on the scale Δ is measured on: log(1 + m) for a ratio, m otherwise."""
    m = abs(claim.margin)
    return math.log1p(m) if on_ratio_scale(metric) else m


def on_scale(values: pd.Series, metric: str) -> pd.Series:
    """Values of `metric` on the scale claims judge them: logs for a ratio metric (a value of 0 or less has
    no log: NaN, and the claim stays inconclusive)."""
    return np.log(values.where(values > 0)) if on_ratio_scale(metric) else values


def one_sided(expect: str, m: float, direction: str) -> tuple[str, float] | None:
    """Where a one-sided claim's CI must lie to reproduce it, as ('below', edge) or ('above', edge); None
    for `similar`. not_worse lets compare trail by m in the metric's worse direction."""
    if expect == "lower":
        return ("below", 0 - m)  # 0 - m: a margin of 0 reads 'below 0', not 'below -0'
    if expect == "higher":
        return ("above", m)
    if expect == "not_worse":
        return ("above", 0 - m) if direction == "maximize" else ("below", m)
    return None


def failed_seeds(values: pd.Series, metric: str, chance: float) -> pd.Series:
    """Which seeds failed to train: a value at or on the chance side of `chance` (module docstring)."""
    return values >= chance if metric_info(metric).direction == "minimize" else values <= chance


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
    # With `chance`: (side, seeds failed, seeds) for each side (each cell of an interaction).
    failed: list[tuple[str, int, int]] = field(default_factory=list)
    control: ClaimResult | None = None  # a similar / not_worse claim's positive control, where judged

    @property
    def kind(self) -> str:
        """'test' (of a paper's finding) or 'check' (of a mechanism that holds by construction)."""
        return self.claim.kind

    @property
    def expected(self) -> str:
        """The outcome the claim expects, on Δ's own scale: 'below -0.3', or 'below -0.693' for a ratio
        margin of 1 on a loss (Δ is then log(compare / to))."""
        m = threshold(self.claim, self.metric)
        side = one_sided(self.claim.expect, m, metric_info(self.metric).direction)
        return f"within ±{m:.3g}" if side is None else f"{side[0]} {side[1]:.3g}"

    @property
    def margin_text(self) -> str:
        """The margin as the study file gives it, with the log it is judged at for a ratio: '0.3', or
        'ratio 2 (log 0.693)' for a margin of 1 on a loss."""
        m = abs(self.claim.margin)
        if not on_ratio_scale(self.metric) or m == 0:
            return f"{m:g}"
        return f"ratio {1 + m:g} (log {threshold(self.claim, self.metric):.3g})"

    @property
    def failures(self) -> str:
        """How many seeds failed on each side, where any did: 'failed seeds (at or below chance 0.05), left
        out: compare 2 of 5, to 0 of 5'; empty otherwise."""
        if not any(n for _, n, _ in self.failed):
            return ""
        side = "above" if metric_info(self.metric).direction == "minimize" else "below"
        counts = ", ".join(f"{label} {n} of {total}" for label, n, total in self.failed)
        paired = "; a seed failed in one cell is left out of all four" if self.paired_by_seed else ""
        return f"failed seeds (at or {side} chance {self.claim.chance:g}), left out: {counts}{paired}"

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


def by_kind(results: list[ClaimResult]) -> tuple[list[ClaimResult], list[ClaimResult]]:
    """The tests of published findings, then the checks of mechanisms, each in the study's order."""
    return [r for r in results if r.kind == "test"], [r for r in results if r.kind == "check"]


def tests_first(results: list[ClaimResult]) -> list[ClaimResult]:
    """The results in the order the report lists them: by_kind's tests, then its checks."""
    return [r for group in by_kind(results) for r in group]


# How the report, `ablate status` and the API name each kind, one and several.
KIND_NAMES = {"test": ("test of a published finding", "tests of published findings"),
              "check": ("check of a mechanism", "checks of mechanisms")}  # fmt: skip


def tally(results: list[ClaimResult]) -> str:
    """Each kind's verdicts counted apart, claims revised after a run apart from those fixed before it:
    '3 tests of published findings: 2 reproduced, 1 inconclusive (1 revised after a run: 1 reproduced);
    1 check of a mechanism: 1 reproduced'; empty without claims."""

    def counted(group: list[ClaimResult]) -> str:
        counts = Counter(r.verdict for r in group)  # in the order verdicts first appear
        return ", ".join(f"{n} {verdict}" for verdict, n in counts.items())

    parts = []
    for kind, group in zip(KIND_NAMES, by_kind(results)):
        if group:
            fixed, revised = [r for r in group if not r.claim.revised], [r for r in group if r.claim.revised]
            part = f"{len(group)} {KIND_NAMES[kind][len(group) > 1]}: {counted(fixed) or 'none fixed before a run'}"
            parts.append(part + (f" ({len(revised)} revised after a run: {counted(revised)})" if revised else ""))
    return "; ".join(parts)


def seeds_to_decide(r: ClaimResult) -> int | None:
    """Seeds per variant at which an undecided claim's CI would clear its margin if Δ and the spread
    between seeds stayed as they are: the half-width scales as t(k - 1)/sqrt(k) at the claim's level, k the
    values a side (seeds times the variants a side pools). None when no k up to MAX_PROJECTED_SEEDS would
    (Δ on, or too near, the margin)."""
    k, half = max(r.seeds, min(r.n_compare, r.n_to)), (r.ci_high - r.ci_low) / 2
    m = threshold(r.claim, r.metric)
    side = one_sided(r.claim.expect, m, metric_info(r.metric).direction)
    # Distance from Δ to the nearest edge its CI must clear (for "similar": to ±m from inside or outside).
    distance = abs(r.diff - side[1]) if side is not None else abs(m - abs(r.diff))
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


def control_claim(claim: ClaimSpec, metric: str) -> ClaimSpec | None:
    """A claim's positive control as a claim of its own: its two sides on the claim's metric, `similar`
    within the claim's margin, so that 'contradicted' means the control moved the metric beyond it. No
    `chance`: a control that fails outright has moved the metric all the way."""
    if claim.control is None:
        return None
    return ClaimSpec(text=f"control of: {claim.text}", compare=claim.control.compare, to=claim.control.to,
                     metric=metric, expect="similar", margin=claim.margin)  # fmt: skip


def verdict(lo: float, hi: float, expect: str, margin: float, direction: str = "maximize") -> str:
    """See the module docstring; NaN bounds are inconclusive. `direction`: the metric's, which not_worse
    reads."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return INCONCLUSIVE
    m = abs(margin)
    side = one_sided(expect, m, direction)
    if side is None:
        if -m <= lo and hi <= m:
            return REPRODUCED
        return CONTRADICTED if lo > m or hi < -m else INCONCLUSIVE
    where, edge = side
    if where == "below":
        return REPRODUCED if hi < edge else CONTRADICTED if lo > edge else INCONCLUSIVE
    return REPRODUCED if lo > edge else CONTRADICTED if hi < edge else INCONCLUSIVE


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


def _difference(
    result: ClaimResult, groups: list[tuple[list[str], list[str]]], values: dict[str, pd.Series], df
) -> tuple[float, float]:
    """Fills in the claim's seeds, means, Δ and CI from `values` (variant -> its values by seed): Δ averaged
    over `groups`, each a (compare variants, to variants) pair of the CI (the pairs, or the pooled sides).
    Returns the two sides' means on the judged scale (logs for a ratio metric)."""
    metric, empty = result.metric, np.array([])
    scaled = lambda variants: np.concatenate(  # noqa: E731
        [on_scale(values[v], metric).to_numpy() for v in variants if v in values] or [empty]
    )
    arrays = [(scaled(c), scaled(t)) for c, t in groups]
    pooled_c, pooled_t = (np.concatenate([a[i] for a in arrays]) for i in (0, 1))
    result.n_compare, result.n_to = len(pooled_c), len(pooled_t)
    # On the log scale the means shown are geometric, so that Δ is the log of their ratio.
    unscale = np.exp if on_ratio_scale(metric) else float
    result.mean_compare = unscale(pooled_c.mean()) if len(pooled_c) else np.nan
    result.mean_to = unscale(pooled_t.mean()) if len(pooled_t) else np.nan
    result.diff, result.ci_low, result.ci_high = diff_ci(
        arrays, judged_range(metric), examples(df, metric), result.level
    )
    return (pooled_c.mean() if len(pooled_c) else np.nan, pooled_t.mean() if len(pooled_t) else np.nan)


def _too_few(result: ClaimResult, fewest: int, df, variants: list[str]) -> bool:
    """Marks the claim pending (trials of `variants` still queued or running) or inconclusive when a variant
    (an interaction's cell) has fewer seeds than its metrics need: completed ones, or those that trained."""
    needed = max(min_seeds(m) for m in (result.metric, result.versus_metric) if m)
    if fewest >= needed:
        return False
    done = "trained" if result.failures else "completed"
    what, of = ("a cell", "") if result.versus_metric else ("a variant", f" of {result.metric}")
    result.reason = f"{what} has {fewest} {done} seed(s){of}; a verdict needs {needed}"
    unfinished = df["variant"].isin(variants) & ~df["state"].isin(FINISHED)
    result.verdict = PENDING if unfinished.any() else INCONCLUSIVE
    return True


def evaluate(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, level: float = LEVEL) -> ClaimResult:
    """The claim's verdict on the completed trials in `df`, with CIs at `level`."""
    result = (evaluate_interaction if claim.versus is not None else evaluate_difference)(
        spec, claim, df, level
    )
    _sensitivity(spec, result, df)
    if result.failures:
        result.reason += f"; {result.failures}"
    _below_level(spec, result, df)
    return result


def _below_level(spec: StudySpec, result: ClaimResult, df: pd.DataFrame) -> None:
    """Marks a claim that this profile cannot decide: the baseline, or a variant the claim compares, short of
    the study's `judge_from` level (module docstring). Its Δ and CI stay as computed, for the reader."""
    level, baseline = spec.judge_from, spec.baseline_variant()
    if level is None or result.verdict == PENDING:
        return
    values, minimize = seed_values(df, level.metric), metric_info(level.metric).direction == "minimize"
    short = []
    for variant in dict.fromkeys([baseline, *compared_variants(spec, result.claim)]):
        found = values.get(variant)
        if variant is None or found is None or not len(found):
            continue
        mean = float(found.mean())
        if mean > level.value if minimize else mean < level.value:
            who = f"the baseline {variant}" if variant == baseline else variant
            short.append(f"{who} reaches {level.metric} {mean:.3g} (mean of {len(found)} seeds)")
    if short:
        result.verdict = UNDECIDABLE
        why = f": {level.why}" if level.why else ""
        why += f" (the level was revised after a run: {level.revised})" if level.revised else ""
        result.reason = f"{'; '.join(short)}, short of the {level.value:g} the study judges from{why}"


def evaluate_difference(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, level: float) -> ClaimResult:
    """A claim of one difference, compare - to, before its control (evaluate)."""
    ((metric, within),) = claim.arms(spec.metric.name)
    settings = variant_settings(spec)
    compare, to = claim_sides(settings, claim, within)
    result = ClaimResult(claim, metric, INCONCLUSIVE, "", compare, to, level=level)
    if not compare or not to:
        side = "compare" if not compare else "to"
        result.reason = f"no variant matches {side}: {getattr(claim, side)}"
        return result
    values = {v: s for v, s in seed_values(df, metric).items() if v in compare + to}
    pairs = _pairs(settings, compare, to, claim)
    result.paired = pairs is not None and len(pairs) > 1
    groups = [([c], [t]) for c, t in pairs] if pairs is not None else [(compare, to)]
    judged = _difference(result, groups, values, df)
    # Seeds of each variant, not values of a side: two variants pooled have no more seeds of either.
    count = lambda by_variant: min(len(by_variant.get(v, ())) for v in compare + to)  # noqa: E731
    if _too_few(result, count(values), df, compare + to):
        return result
    sides = [(label, side, np.concatenate([values[v].to_numpy() for v in side if v in values]))
             for label, side in (("compare", compare), ("to", to))]  # fmt: skip
    if _uninformative(result, sides):
        return result
    if claim.chance is not None:
        trained = {v: s[~failed_seeds(s, metric, claim.chance)] for v, s in values.items()}
        result.failed = [(label, sum(len(values[v]) - len(trained[v]) for v in side if v in values),
                          sum(len(values[v]) for v in side if v in values))
                         for label, side in (("compare", compare), ("to", to))]  # fmt: skip
        if result.failures:
            values = trained
            judged = _difference(result, groups, values, df)
            if _too_few(result, count(values), df, compare + to):
                return result
    _decide(result)
    rng = judged_bounds(metric)
    _at_bounds(result, [(*judged, rng)])
    _no_room(result, judged[1], rng, result.mean_to, metric_info(metric).range)
    return result


def _decide(result: ClaimResult) -> None:
    """The verdict of the claim's CI against its margin, and the reason that says so."""
    r, m = result, threshold(result.claim, result.metric)
    r.verdict = verdict(r.ci_low, r.ci_high, r.claim.expect, m, metric_info(r.metric).direction)
    ci, bound = f"CI of {effect_name(r.metric)} [{r.ci_low:.3g}, {r.ci_high:.3g}]", r.expected
    reasons = {REPRODUCED: f"{ci} lies {bound}", CONTRADICTED: f"{ci} rules out an effect {bound}"}
    r.reason = reasons.get(r.verdict, f"{ci} straddles the margin (expected {bound})")


def _cells(
    spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, chance: float | None = None
) -> tuple[list[tuple[str, list[str], str]], list[pd.Series]]:
    """An interaction's four cells, (label, variants, metric) each, in the order compare, to, compare',
    to', and each cell's values by seed: at every seed all its variants have, their mean. With `chance`,
    the seeds of a variant that failed there are left out (failed_seeds)."""
    settings = variant_settings(spec)
    cells, series = [], []
    for arm, (arm_metric, within) in enumerate(claim.arms(spec.metric.name)):
        values = seed_values(df, arm_metric)
        if chance is not None:
            values = {v: s[~failed_seeds(s, arm_metric, chance)] for v, s in values.items()}
        suffix = "" if arm == 0 else "'"
        for side, variants in zip(("compare", "to"), claim_sides(settings, claim, within)):
            cells.append((side + suffix, variants, arm_metric))
            columns = [values[v] for v in variants if v in values]
            found = pd.concat(columns, axis=1).dropna() if len(columns) == len(variants) and columns else None
            series.append(found.mean(axis=1) if found is not None else pd.Series(dtype=float))
    return cells, series


def _contrast(result: ClaimResult, cells: list[pd.Series]) -> None:
    """Fills in an interaction's seeds, each side's change, the two differences, Δ and its CI from the four
    cells' values by seed, on the judged scale (module docstring)."""
    c1, t1, c2, t2 = cells
    result.n_compare, result.n_to = min(len(c1), len(c2)), min(len(t1), len(t2))
    result.mean_compare, result.mean_to = c1.mean() - c2.mean(), t1.mean() - t2.mean()
    result.diff_first, result.diff_versus = c1.mean() - t1.mean(), c2.mean() - t2.mean()
    seeds = sorted(c1.index)
    result.paired_by_seed = len(seeds) >= MIN_SEEDS and all(sorted(s.index) == seeds for s in (t1, c2, t2))
    if result.paired_by_seed:
        contrast = (c1 - t1 - c2 + t2).to_numpy()
        result.diff, (lo, hi) = float(contrast.mean()), mean_ci(contrast, level=result.level)
    else:
        cell_pairs = [(c1.to_numpy(), t1.to_numpy()), (t2.to_numpy(), c2.to_numpy())]
        estimate, lo, hi = diff_ci(cell_pairs, level=result.level)
        result.diff, lo, hi = 2 * estimate, 2 * lo, 2 * hi
    # (a - b) - (c - d): a difference in the first metric's difference range less one in the second's.
    first, second = (judged_range(m).difference() for m in (result.metric, result.versus_metric))
    result.ci_low, result.ci_high = max(lo, first.low - second.high), min(hi, first.high - second.low)


def evaluate_interaction(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame, level: float) -> ClaimResult:
    """Δ = (compare - to) - (compare' - to'), see the module docstring."""
    cells, raw = _cells(spec, claim, df)
    metric, versus_metric = cells[0][2], cells[2][2]
    result = ClaimResult(
        claim, metric, INCONCLUSIVE, "", cells[0][1], cells[1][1], versus_metric=versus_metric, level=level
    )
    empty = [label for label, variants, _ in cells if not variants]
    if empty:
        result.reason = f"no variant matches {', '.join(empty)}"
        return result
    judged = lambda series: [on_scale(s, m) for s, (_, _, m) in zip(series, cells)]  # noqa: E731
    scaled = judged(raw)
    _contrast(result, scaled)
    variants = [v for _, cell, _ in cells for v in cell]
    if _too_few(result, min(len(s) for s in raw), df, variants):
        return result
    sides = [(label, cell, s.to_numpy()) for (label, cell, _), s in zip(cells, raw)]
    if _uninformative(result, sides):
        return result
    if claim.chance is not None:
        _, trained = _cells(spec, claim, df, claim.chance)
        result.failed = [(label, len(r) - len(t), len(r)) for (label, _, _), r, t in zip(cells, raw, trained)]
        if result.failures:
            if result.paired_by_seed:  # a seed that failed in one cell leaves all four: still paired
                kept = set.intersection(*(set(t.index) for t in trained))
                trained = [t[t.index.isin(kept)] for t in trained]
            scaled = judged(trained)
            _contrast(result, scaled)
            if _too_few(result, min(len(s) for s in trained), df, variants):
                return result
    _decide(result)
    result.reason = (
        f"Δ = ({result.diff_first:.3g} on {metric}) - ({result.diff_versus:.3g} on {versus_metric}); "
        + result.reason
    )
    first, second = (judged_bounds(m) for m in (metric, versus_metric))
    means = [s.mean() for s in scaled]
    _at_bounds(result, [(means[0], means[1], first), (means[2], means[3], second)])
    # Each side's change between the arms lies in [low - high', high - low'].
    changes = MetricRange(first.low - second.high, first.high - second.low)
    _no_room(result, result.mean_to, changes, result.mean_to, changes)
    _censored(result, cells, scaled)
    return result


def cannot_learn(values: np.ndarray, metric: str, chance: float) -> bool:
    """Whether the 95% CI of the mean lies wholly on the chance side of `chance` (see the module doc)."""
    lo, hi = mean_ci(values)
    return bool(lo > chance if metric_info(metric).direction == "minimize" else hi < chance)


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


def _at_bounds(result: ClaimResult, arms: list[tuple[float, float, MetricRange]]) -> None:
    """Marks a `similar` claim whose bounds alone hold Δ within the margin: in each of its differences (one,
    or an interaction's two) both means, on the judged scale, lie within the margin (shared out between
    the differences) of one bound of the difference's metric (judged_bounds)."""
    if result.claim.expect != "similar":
        return
    share = threshold(result.claim, result.metric) / len(arms)
    words = []
    for compare, to, rng in arms:
        if min(compare, to) >= rng.high - share:
            words.append("upper")
        elif max(compare, to) <= rng.low + share:
            words.append("lower")
        else:
            return
    result.verdict = CEILING if words[0] == "upper" else FLOOR
    metrics = [result.metric, result.versus_metric]
    # A bound as its metric writes it: a perplexity's log 0 is its 1.
    shown = [
        metric_info(m).range.high if w == "upper" else metric_info(m).range.low
        for w, m in zip(words, metrics)
    ]
    if len(arms) == 1:
        result.reason = (f"both means lie within the margin {result.margin_text} of the {words[0]} bound "
                         f"{shown[0]:g}: neither side can move")  # fmt: skip
        return
    at = "; ".join(f"{m}: {w} {b:g}" for m, w, b in zip(metrics, words, shown))
    result.reason = (f"in each difference both means lie within half the margin {result.margin_text} of a bound "
                     f"({at}): neither difference can move")  # fmt: skip


# Each cell's sign in Δ = (compare - to) - (compare' - to').
CELL_SIGNS = (1, -1, -1, 1)


def _censored(result: ClaimResult, cells: list[tuple[str, list[str], str]], values: list[pd.Series]) -> None:
    """A directional interaction with a cell at the floor of its metric (every seed within half the margin of
    its worse bound, on the judged scale: `values` are the cells' judged values): a model there learned
    nothing the metric measures and could be worse still, so its difference, and the interaction, are a
    bound. Where that bound could overturn the verdict (the cell's true value, at or beyond the floor, moves Δ
    against the cell's sign in Δ) the verdict is the floor's; otherwise the reason says Δ is a bound. A cell at
    the better bound has done all the task asks, which the claim's metric measures."""
    m = threshold(result.claim, result.metric)
    side = one_sided(result.claim.expect, m, metric_info(result.metric).direction)
    if side is None or result.verdict not in (REPRODUCED, CONTRADICTED):
        return
    # The direction in which the true Δ would overturn the verdict: up for Δ found below its edge.
    overturn_up = (side[0] == "below") == (result.verdict == REPRODUCED)
    for (label, variants, metric), sign, found in zip(cells, CELL_SIGNS, values):
        rng, info = judged_bounds(metric), metric_info(metric)
        worse_low = info.direction == "maximize"
        at_floor = len(found) and ((found <= rng.low + m / 2) if worse_low else (found >= rng.high - m / 2)).all()
        if not at_floor:
            continue
        shift = -sign if worse_low else sign  # the sign of true - measured Δ
        bound = f"lower bound {info.range.low:g}" if worse_low else f"upper bound {info.range.high:g}"
        at = f"cell {label} ({', '.join(variants)}) lies within half the margin of the {bound} of {metric} in every seed"
        if (shift > 0) == overturn_up:
            result.verdict = FLOOR
            result.reason = (f"{at}: it learned nothing the metric measures, and Δ could be "
                             f"{'higher' if shift > 0 else 'lower'} than measured, across the margin; "
                             + result.reason)  # fmt: skip
            return
        result.reason += (f"; {at}: it could be worse still, which puts the true Δ only further "
                          f"{'above' if shift > 0 else 'below'} the one measured, so the verdict stands")  # fmt: skip


def _no_room(
    result: ClaimResult, to: float, rng: MetricRange, to_shown: float, rng_shown: MetricRange
) -> None:
    """A `lower` (`higher`) claim whose `to` side (`to`, on the judged scale with its bounds `rng`) lies
    within the margin of the bound the claimed effect runs toward: no compare side could clear the margin
    (unattainable). A `not_worse` claim whose `to` side lies within the margin of the metric's worse bound:
    no compare side could be worse by more than it (floor, or ceiling where lower is better). `to_shown` and
    `rng_shown`: the same on the metric's own scale, for the reason."""
    expect, m = result.claim.expect, threshold(result.claim, result.metric)
    if expect == "similar" or (m == 0 and expect != "not_worse"):
        return
    # The bound in question: the one the claimed effect runs toward; for not_worse, the metric's worse one.
    low = metric_info(result.metric).direction == "maximize" if expect == "not_worse" else expect == "lower"
    room = to - rng.low if low else rng.high - to
    bound = f"lower bound {rng_shown.low:g}" if low else f"upper bound {rng_shown.high:g}"
    near = (f"the to side's {'change' if result.versus_metric else 'mean'} {to_shown:.3g} lies within the margin "
            f"{result.margin_text} of the {bound}")  # fmt: skip
    if expect == "not_worse":
        if room <= m:
            result.verdict = FLOOR if low else CEILING
            result.reason = f"{near}: no compare side can be worse by more than the margin"
    # Data that rule out even a zero effect in the claimed direction contradict it, whatever the margin.
    elif room < m and verdict(result.ci_low, result.ci_high, expect, 0.0) != CONTRADICTED:
        result.verdict, result.reason = UNATTAINABLE, near


def _selector(selector: dict[str, Value]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selector.items())


def _sensitivity(spec: StudySpec, result: ClaimResult, df: pd.DataFrame) -> None:
    """A reproduced `similar` or `not_worse` claim stands only where its positive control moves the metric
    beyond the margin (module docstring); without a control it is uninformative."""
    claim = result.claim
    if claim.expect not in AGREEMENT or result.verdict != REPRODUCED:
        return
    control = control_claim(claim, result.metric)
    if control is None:
        result.verdict = UNCONTROLLED
        result.reason += "; no positive control: whether the metric could tell the sides apart is not tested"
        return
    judged = result.control = evaluate_difference(spec, control, df, result.level)
    name = f"the control ({_selector(control.compare)} against {_selector(control.to)})"
    if judged.verdict == CONTRADICTED:
        result.reason += f"; {name}: {judged.reason}, so the metric moves by the margin"
    elif judged.verdict in (REPRODUCED, CEILING, FLOOR):
        result.verdict = INSENSITIVE
        result.reason = (f"{name}: {judged.reason}: the metric does not move by the margin even where a "
                         "difference is designed in")  # fmt: skip
    else:  # undecided, or still running: more seeds may decide the control
        result.verdict = PENDING if judged.verdict == PENDING else INCONCLUSIVE
        result.reason = f"the sides agree, but {name} is undecided: {judged.reason}"


def compared_variants(spec: StudySpec, claim: ClaimSpec) -> list[str]:
    """The variants on either side of each of the claim's arms."""
    settings = variant_settings(spec)
    return [v for _, within in claim.arms(spec.metric.name) for side in claim_sides(settings, claim, within)
            for v in side]  # fmt: skip


def claim_variants(spec: StudySpec, claim: ClaimSpec) -> list[str]:
    """Every variant a claim's verdict reads: both sides of each of its arms, of its control, and the
    baseline whose level `judge_from` checks (a claim that does not compare the baseline is judged from
    its level all the same)."""
    settings = variant_settings(spec)
    found = compared_variants(spec, claim)
    control = control_claim(claim, spec.metric.name)
    if control is not None:
        found += [v for side in claim_sides(settings, control, {}) for v in side]
    baseline = spec.baseline_variant()
    if spec.judge_from is not None and baseline is not None:
        found.append(baseline)
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
