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
respects the metric's range, and MOVER adds them at the Welch-Satterthwaite critical value of the whole
effect, so the CI of a difference of accuracies stays within [-1, 1].

Verdict, with d = compare - to, CI [lo, hi] and margin m >= 0 (the smallest effect that counts):
  expect lower:   reproduced if hi < -m; contradicted if lo > -m; inconclusive otherwise.
  expect higher:  reproduced if lo > m;  contradicted if hi < m;  inconclusive otherwise.
  expect similar: reproduced if -m <= lo and hi <= m; contradicted if lo > m or hi < -m;
                  inconclusive otherwise.
So a claim is reproduced only when the whole CI clears the margin in the claimed direction, and
contradicted when the whole CI lies on the other side of it (the data rule out an effect that large).
A side with fewer than two seeds has no CI, so its claim is inconclusive.

Looks. With adaptive seeds (`seeds: {min, max, step}`) a claim is judged at up to K looks, after min,
min + step, ..., max seeds per variant; the first look whose verdict is reproduced or contradicted decides
it, and later seeds (run for other claims) do not reopen it. Each look's CI has level 1 - 0.05/K
(Bonferroni over the K looks fixed in advance), so the chance that any look's CI misses the true effect,
and with it the chance of a wrong verdict at whichever look stops, is at most 0.05 whatever the stopping
rule. A study with a list of seeds has one look at level 0.95. The sweep asks `seeds_wanted` which
variants need the next look's seeds: those of claims still open; the report and the sweep both read these
verdicts, so the queue stops exactly where the report says a claim was decided."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.study.spec import ClaimSpec, StudySpec, Value
from reports.stats import LEVEL, diff_ci, examples, metric_range, variant_values

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
MIN_SEEDS = 2
FINISHED = ("COMPLETE", "FAIL", "PRUNED")  # trial states that will not change


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
    level: float = LEVEL
    look: int = 0  # the look these numbers come from (0-based)
    decided: bool = False  # reproduced or contradicted at a look whose seeds all finished
    budget_spent: bool = False  # still inconclusive after the last look's seeds finished
    running: bool = False  # the look's trials have not all finished: a provisional verdict
    looks: int = 1  # how many looks the study plans
    seeds: int = 0  # seeds per variant at this look

    @property
    def decision(self) -> str:
        """When the verdict was reached, for the report: 'look 1 of 3 (2 seeds, 98.3% CIs)', or why not."""
        at = f"{self.seeds} seeds, {self.level:.1%} CIs".replace(".0%", "%")
        if self.decided:
            return f"look {self.look + 1} of {self.looks} ({at})"
        if self.budget_spent:
            return f"budget spent ({at})"
        return (
            f"open: look {self.look + 1} of {self.looks} running"
            if self.running
            else "open: more seeds queued"
        )


def matching_variants(overrides: dict[str, dict[str, Value]], selector: dict[str, Value]) -> list[str]:
    return [name for name, o in overrides.items() if all(k in o and o[k] == v for k, v in selector.items())]


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
    metric = claim.metric or spec.metric.name
    overrides = spec.variant_overrides()
    compare = matching_variants(overrides, claim.compare)
    to = [v for v in matching_variants(overrides, claim.to) if v not in compare]
    result = ClaimResult(claim, metric, INCONCLUSIVE, "", compare, to, level=level)
    if not compare or not to:
        side = "compare" if not compare else "to"
        result.reason = f"no variant matches {side}: {getattr(claim, side)}"
        return result
    values = variant_values(df, metric)
    empty = np.array([])
    pairs = _pairs(overrides, compare, to, claim)
    result.paired = pairs is not None and len(pairs) > 1
    if pairs is not None:
        groups = [(values.get(c, empty), values.get(t, empty)) for c, t in pairs]
    else:
        groups = [tuple(np.concatenate([values.get(v, empty) for v in side]) for side in (compare, to))]
    pooled_c, pooled_t = (np.concatenate([g[i] for g in groups]) for i in (0, 1))
    result.n_compare, result.n_to = len(pooled_c), len(pooled_t)
    result.mean_compare = pooled_c.mean() if len(pooled_c) else np.nan
    result.mean_to = pooled_t.mean() if len(pooled_t) else np.nan
    result.diff, result.ci_low, result.ci_high = diff_ci(
        groups, metric_range(metric), examples(df, metric), level
    )
    fewest = min(min(len(a), len(b)) for a, b in groups)
    if fewest < MIN_SEEDS:
        result.reason = f"a variant has {fewest} completed seed(s) of {metric}; a verdict needs {MIN_SEEDS}"
        return result
    result.verdict = verdict(result.ci_low, result.ci_high, claim.expect, claim.margin)
    result.reason = _reason(result)
    return result


def _reason(r: ClaimResult) -> str:
    m, expect = abs(r.claim.margin), r.claim.expect
    ci = f"CI of compare - to [{r.ci_low:.3g}, {r.ci_high:.3g}]"
    bound = {"lower": f"below {-m:.3g}", "higher": f"above {m:.3g}", "similar": f"within ±{m:.3g}"}[expect]
    if r.verdict == REPRODUCED:
        return f"{ci} lies {bound}"
    if r.verdict == CONTRADICTED:
        return f"{ci} rules out an effect {bound}"
    return f"{ci} straddles the margin (expected {bound})"


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
    variants = result.compare + result.to
    for look in range(len(spec.seed_looks)):
        rows = _look_trials(spec, df, variants, look)
        if rows is None:
            break
        result = evaluate(spec, claim, rows, level)
        result.look, result.looks, result.seeds = look, len(spec.seed_looks), spec.seed_looks[look]
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
        for variant in r.compare + r.to:
            wanted[variant] = max(wanted.get(variant, 0), count)
    return wanted


def evaluate_all(spec: StudySpec, df: pd.DataFrame) -> list[ClaimResult]:
    return [judge(spec, claim, df) for claim in spec.claims]
