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
A side with fewer than two seeds has no CI, so its claim is inconclusive."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.study import ClaimSpec, StudySpec, Value
from reports.stats import diff_ci, examples, metric_range, variant_values

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
MIN_SEEDS = 2


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


def evaluate(spec: StudySpec, claim: ClaimSpec, df: pd.DataFrame) -> ClaimResult:
    metric = claim.metric or spec.metric.name
    overrides = spec.variant_overrides()
    compare = matching_variants(overrides, claim.compare)
    to = [v for v in matching_variants(overrides, claim.to) if v not in compare]
    result = ClaimResult(claim, metric, INCONCLUSIVE, "", compare, to)
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
    result.diff, result.ci_low, result.ci_high = diff_ci(groups, metric_range(metric), examples(df, metric))
    fewest = min(min(len(a), len(b)) for a, b in groups)
    if fewest < MIN_SEEDS:
        result.reason = f"a variant has {fewest} completed seed(s) of {metric}; a verdict needs {MIN_SEEDS}"
        return result
    result.verdict = verdict(result.ci_low, result.ci_high, claim.expect, claim.margin)
    result.reason = _reason(result)
    return result


def _reason(r: ClaimResult) -> str:
    m, expect = abs(r.claim.margin), r.claim.expect
    ci = f"95% CI of compare - to [{r.ci_low:.3g}, {r.ci_high:.3g}]"
    bound = {"lower": f"below {-m:.3g}", "higher": f"above {m:.3g}", "similar": f"within ±{m:.3g}"}[expect]
    if r.verdict == REPRODUCED:
        return f"{ci} lies {bound}"
    if r.verdict == CONTRADICTED:
        return f"{ci} rules out an effect {bound}"
    return f"{ci} straddles the margin (expected {bound})"


def evaluate_all(spec: StudySpec, df: pd.DataFrame) -> list[ClaimResult]:
    return [evaluate(spec, claim, df) for claim in spec.claims]
