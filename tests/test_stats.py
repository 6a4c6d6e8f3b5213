"""Report statistics and claim verdicts against known answers (scipy and hand-computed references)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from ablate.analysis import claims, stats
from ablate.analysis.claims import CONTRADICTED, INCONCLUSIVE, REPRODUCED, UNATTAINABLE
from ablate.schema.spec import StudySpec

METRIC = "test/seq_acc"
UNBOUNDED = "test/score"  # not in the metric registry: no range


def table(
    values: dict[str, list[float]], extra: list[dict] | None = None, metric: str = METRIC
) -> pd.DataFrame:
    """A trial table as analysis.table.trials_frame gives it: one completed trial per (variant, seed)."""
    rows = [
        {"trial": 0, "variant": v, "seed": seed, "state": "COMPLETE", metric: x}
        for v, xs in values.items()
        for seed, x in enumerate(xs)
    ]
    rows += extra or []
    for i, row in enumerate(rows):
        row["trial"] = i
    return pd.DataFrame(rows)


def test_welch_and_difference_match_scipy_on_a_constructed_table():
    base = [0.50, 0.55, 0.70, 0.90]
    worse = [0.10, 0.20, 0.30, 0.40]
    same = [0.52, 0.61, 0.68, 0.80]
    # An unbounded metric: its intervals are the textbook t and Welch intervals.
    df = table({"base": base, "worse": worse, "same": same}, metric=UNBOUNDED)
    summary = stats.summarize(df, UNBOUNDED, ["base", "worse", "same"], "base").set_index("variant")

    for name, values in (("worse", worse), ("same", same)):
        row = summary.loc[name]
        ref = sps.ttest_ind(values, base, equal_var=False)
        assert row["p"] == pytest.approx(ref.pvalue, rel=1e-9)  # the test that inverts Welch's interval
        assert row["diff"] == pytest.approx(np.mean(values) - np.mean(base))
        ci = ref.confidence_interval(0.95)
        assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert summary.loc["worse", "diff_ci_high"] < 0 < summary.loc["same", "diff_ci_high"]
    assert summary.loc["base", "n"] == 4
    assert summary.loc["base", "mean"] == pytest.approx(np.mean(base))
    assert summary.loc["base", "std"] == pytest.approx(np.std(base, ddof=1))
    ci = sps.t.interval(0.95, 3, loc=np.mean(base), scale=sps.sem(base))
    assert tuple(summary.loc["base", ["ci_low", "ci_high"]]) == pytest.approx(ci, rel=1e-12)
    assert math.isnan(summary.loc["base", "diff"]) and math.isnan(summary.loc["base", "p_holm"])
    # Holm over the two comparisons, by hand.
    p_worse, p_same = summary.loc["worse", "p"], summary.loc["same", "p"]
    assert p_worse < p_same
    assert summary.loc["worse", "p_holm"] == pytest.approx(min(1, 2 * p_worse))
    assert summary.loc["same", "p_holm"] == pytest.approx(max(min(1, 2 * p_worse), p_same))
    assert summary["rank"].tolist() == [1, 3, 2]  # base 0.6625 > same 0.6525 > worse 0.25
    ranked_min = stats.summarize(df, UNBOUNDED, ["base", "worse", "same"], "base", direction="minimize")
    assert ranked_min["rank"].tolist() == [3, 1, 2]


def test_permutation_test_is_exact_for_small_groups():
    # Of the 20 ways to split {1..6} into 3 + 3, only the two extreme splits reach |diff| = 3.
    assert stats.permutation_p(np.array([1.0, 2, 3]), np.array([4.0, 5, 6])) == pytest.approx(2 / 20)
    a, b = np.array([0.2, 0.5, 0.9, 0.4]), np.array([0.1, 0.3, 0.35])
    pooled, observed = np.concatenate([a, b]), abs(a.mean() - b.mean())
    splits = list(itertools.combinations(range(7), 4))
    extreme = sum(
        abs(pooled[list(idx)].mean() - np.delete(pooled, idx).mean()) >= observed - 1e-12 for idx in splits
    )
    assert stats.permutation_p(a, b) == pytest.approx(extreme / len(splits))


def test_holm_by_hand():
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = stats.holm([math.nan, 0.01, 0.04])
    assert math.isnan(adjusted[0]) and adjusted[1:] == pytest.approx([0.02, 0.04])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]


def test_hedges_g_and_degenerate_groups():
    # Pooled variance (3 * 5/3 + 4 * 5/2) / 7 = 15/7, d = -1.5 / sqrt(15/7), correction 1 - 3/27.
    g = stats.hedges_g(np.array([1.0, 2, 3, 4]), np.array([2.0, 3, 4, 5, 6]))
    assert g == pytest.approx(-1.5 / math.sqrt(15 / 7) * (1 - 3 / 27))
    assert math.isnan(stats.hedges_g(np.array([1.0]), np.array([2.0, 3.0])))
    # No variance on either side and no example count: the interval has no width at any level, so its
    # p-value is 0; the permutation test still has its floor of 2 relabellings in 20.
    df = table({"base": [0.0, 0.0, 0.0], "perfect": [1.0, 1.0, 1.0]})
    row = stats.summarize(df, METRIC, ["base", "perfect"], "base").iloc[1]
    assert row["p"] == 0.0 and row["p_perm"] == row["p_perm_floor"] == pytest.approx(2 / 20)
    assert (row["diff"], row["diff_ci_low"], row["diff_ci_high"]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("values", [[0.8, 0.84], [0.2, 0.5, 0.45], [3.0, 1.0, 4.0, 1.0, 5.0]])
def test_mean_ci_is_the_student_t_interval(values):
    ref = sps.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=sps.sem(values))
    assert stats.mean_ci(np.array(values)) == pytest.approx(ref, rel=1e-12)


def test_mean_ci_degenerate_groups():
    assert all(math.isnan(x) for x in stats.mean_ci(np.array([0.7])))  # one seed: no spread, no interval
    assert all(math.isnan(x) for x in stats.mean_ci(np.array([])))
    lo, hi = stats.mean_ci(np.array([0.1, 0.1, 0.1]))  # equal values: no spread, not a rounding-wide one
    assert lo == hi == pytest.approx(0.1)


@pytest.mark.parametrize(
    "a, b",
    [
        ([0.8, 0.84], [0.7, 0.74, 0.71]),
        ([1.0, 2, 3, 4], [2.0, 3, 4, 5, 9]),
        ([0.5, 0.9, 0.7, 0.6, 0.65], [0.1, 0.3]),
    ],
)
def test_diff_ci_of_one_pair_is_welchs_interval(a, b):
    ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    diff, lo, hi = stats.diff_ci([(np.array(a), np.array(b))])
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_diff_ci_pools_pairs_with_welch_satterthwaite_df():
    # Pair 1: mean 2 - 2, s^2/n = 2/2 (1 df) and 4/3 (2 df). Pair 2: mean 7 - 3, s^2/n = 4/3 (2 df) and 2/2 (1 df).
    pairs = [(np.array([1.0, 3]), np.array([0.0, 2, 4])), (np.array([5.0, 7, 9]), np.array([2.0, 4]))]
    variance = (1 + 4 / 3 + 4 / 3 + 1) / 2**2  # 7/6
    df = (14 / 3) ** 2 / (1**2 / 1 + (4 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2 + 1**2 / 1)  # 98/17
    half = sps.t.ppf(0.975, df) * math.sqrt(variance)
    assert stats.diff_ci(pairs) == pytest.approx((2.0, 2.0 - half, 2.0 + half), rel=1e-12)
    # A single value says nothing of its side's spread: the difference has an estimate but no interval.
    diff, lo, hi = stats.diff_ci([(np.array([5.0]), np.array([1.0, 2, 3]))])
    assert diff == 3.0 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(x) for x in stats.diff_ci([(np.array([1.0]), np.array([]))]))
    assert all(math.isnan(x) for x in stats.diff_ci([]))


def test_two_seeds_give_honestly_wide_intervals():
    # A percentile bootstrap gives about [0.80, 0.84] here, and a difference that excludes 0.
    a, b = np.array([0.80, 0.84]), np.array([0.70, 0.74])
    lo, hi = stats.mean_ci(a)
    assert hi - lo > 10 * (a.max() - a.min())
    _, lo, hi = stats.diff_ci([(a, b)])
    assert lo < 0 < hi


def test_summary_counts_completed_grid_points_once():
    extra = [
        {"variant": "a", "seed": 0, "state": "FAIL", METRIC: math.nan},  # failed, then retried below
        {"variant": "a", "seed": 0, "state": "COMPLETE", METRIC: 0.9},  # the retry: replaces seed 0's 0.1
        {"variant": "a", "seed": 2, "state": "RUNNING", METRIC: math.nan},
        {"variant": "b", "seed": 2, "state": "PRUNED", METRIC: math.nan},
    ]
    df = table({"a": [0.1, 0.3], "b": [0.5]}, extra)
    summary = stats.summarize(df, METRIC, ["a", "b", "never-ran"], "a").set_index("variant")
    assert summary.loc["a", "n"] == 2 and summary.loc["a", "mean"] == pytest.approx(0.6)
    assert summary.loc["b", "n"] == 1 and math.isnan(summary.loc["b", "std"])
    assert math.isnan(summary.loc["b", "ci_low"]) and math.isnan(summary.loc["b", "ci_high"])  # one seed
    assert math.isnan(summary.loc["b", "p"])
    assert summary.loc["never-ran", "n"] == 0 and pd.isna(summary.loc["never-ran", "rank"])


def test_pareto_front():
    cost = np.array([1.0, 2.0, 3.0, 2.0, np.nan])
    quality = np.array([0.5, 0.7, 0.6, 0.4, 0.99])
    assert stats.pareto_front(cost, quality).tolist() == [True, True, False, False, False]
    assert stats.pareto_front(cost, quality, maximize=False).tolist() == [True, False, False, True, False]


@pytest.mark.parametrize(
    "lo, hi, expect, margin, verdict",
    [
        (-0.6, -0.4, "lower", 0.3, REPRODUCED),
        (-0.4, -0.1, "lower", 0.3, INCONCLUSIVE),  # the drop may or may not reach the margin
        (-0.2, -0.1, "lower", 0.3, CONTRADICTED),  # a drop, but surely smaller than the margin
        (0.1, 0.2, "lower", 0.0, CONTRADICTED),
        (-0.1, 0.1, "lower", 0.0, INCONCLUSIVE),
        (0.2, 0.5, "higher", 0.1, REPRODUCED),
        (0.0, 0.5, "higher", 0.1, INCONCLUSIVE),
        (-0.3, 0.05, "higher", 0.1, CONTRADICTED),
        (-0.04, 0.03, "similar", 0.05, REPRODUCED),
        (-0.04, 0.08, "similar", 0.05, INCONCLUSIVE),
        (0.06, 0.2, "similar", 0.05, CONTRADICTED),
        (-0.2, -0.06, "similar", 0.05, CONTRADICTED),
        (math.nan, math.nan, "lower", 0.1, INCONCLUSIVE),
    ],
)
def test_verdict_margin_semantics(lo, hi, expect, margin, verdict):
    assert claims.verdict(lo, hi, expect, margin) == verdict


def grid_spec(claim: dict, seeds=(0, 1, 2)) -> StudySpec:
    return StudySpec.model_validate({
        "name": "grid", "seeds": list(seeds),
        "factors": {"model.pos_encoding": ["sinusoidal", "none"], "model.norm": ["post", "pre"]},
        "claims": [claim],
    })  # fmt: skip


def test_claim_pairs_variants_across_the_other_factor():
    spec = grid_spec({"text": "no positions hurt", "compare": {"model.pos_encoding": "none"},
                      "to": {"model.pos_encoding": "sinusoidal"}, "expect": "lower", "margin": 0.3})  # fmt: skip
    df = table({
        "pos_encoding=sinusoidal,norm=post": [0.9, 0.92, 0.94],
        "pos_encoding=sinusoidal,norm=pre": [0.7, 0.72, 0.74],
        "pos_encoding=none,norm=post": [0.1, 0.12, 0.14],
        "pos_encoding=none,norm=pre": [0.3, 0.32, 0.34],
    })  # fmt: skip
    (result,) = claims.evaluate_all(spec, df)
    assert result.paired and result.compare == ["pos_encoding=none,norm=post", "pos_encoding=none,norm=pre"]
    assert result.to == ["pos_encoding=sinusoidal,norm=post", "pos_encoding=sinusoidal,norm=pre"]
    assert result.diff == pytest.approx(((0.12 - 0.92) + (0.32 - 0.72)) / 2)
    assert result.ci_high < -0.3 and result.verdict == REPRODUCED
    assert (result.n_compare, result.n_to) == (6, 6)

    # The same numbers against a margin the drop cannot reach: the to side sits 0.82 above 0.
    spec = grid_spec({**spec.claims[0].model_dump(), "margin": 0.9})
    assert claims.evaluate_all(spec, df)[0].verdict == UNATTAINABLE


def test_claim_pools_named_variants_and_keeps_compare_out_of_to():
    spec = StudySpec.model_validate({
        "name": "named", "seeds": [0, 1],
        "variants": {"lstm": {"preset": "lstm"}, "tf": {"preset": "transformer"},
                     "tf-nopos": {"preset": "transformer", "model.pos_encoding": "none"}},
        "claims": [{"text": "t", "compare": {"model.pos_encoding": "none"}, "to": {"preset": "transformer"},
                    "expect": "lower", "margin": 0.3},
                   {"text": "u", "compare": {"preset": "gru"}, "to": {"preset": "lstm"}, "expect": "higher"}],
    })  # fmt: skip
    df = table({"lstm": [0.2, 0.25], "tf": [0.95, 0.97], "tf-nopos": [0.1]})
    found, missing = claims.evaluate_all(spec, df)
    assert (found.compare, found.to, found.paired) == (["tf-nopos"], ["tf"], False)
    assert found.verdict == INCONCLUSIVE and "1 completed seed" in found.reason  # one seed: no CI
    assert found.diff == pytest.approx(0.1 - 0.96)
    assert missing.verdict == INCONCLUSIVE and "no variant matches compare" in missing.reason


# Boundaries and branches that mutation testing found unchecked (docs/TESTING.md).


def test_failed_trials_never_count_even_with_a_finite_value():
    df = pd.DataFrame({"variant": ["a", "a", "a"], "seed": [0, 1, 2], "trial": [0, 1, 2],
                       "state": ["COMPLETE", "FAIL", "COMPLETE"], "m": [0.5, 0.9, 0.7]})  # fmt: skip
    assert stats.variant_values(df, "m")["a"].tolist() == [0.5, 0.7]


def test_two_values_a_side_are_enough_for_the_tests_but_not_for_g():
    a, b = np.array([0.0, 1.0]), np.array([10.0, 11.0])
    assert stats.ci_p([(a, b)]) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    # 6 relabellings of 4 values into 2 + 2; the observed split and its mirror are the most extreme.
    assert stats.permutation_p(a, b) == pytest.approx(2 / 6) == stats.permutation_floor(2, 2)
    # A pooled SD on 2 df is no yardstick: g waits for three values a side.
    assert math.isnan(stats.hedges_g(a, b))
    assert math.isnan(
        stats.summarize(table({"a": [0.1, 0.3], "b": [0.5, 0.6]}), METRIC, ["a", "b"], "a")["g"][1]
    )
    est, lo, hi = stats.diff_ci([(np.array([1.0, 2.0, 3.0]), np.array([2.0]))])  # a one-value group
    assert est == pytest.approx(0.0) and math.isnan(lo) and math.isnan(hi)  # one seed says nothing of spread


def test_the_p_value_needs_variance_on_one_side_only():
    a, b = np.array([1.0, 1.0, 1.0]), np.array([2.0, 3.0, 4.0])
    assert stats.ci_p([(a, b)]) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)


def test_hedges_g_with_a_pooled_variance_of_one():
    # Variances 1 and 1: g = (1 - 6) / 1 * (1 - 3 / 15) = -4.
    assert stats.hedges_g(np.array([0.0, 1.0, 2.0]), np.array([5.0, 6.0, 7.0])) == pytest.approx(-4.0)


def test_holm_caps_adjusted_p_values_at_one():
    assert stats.holm([0.6, 0.7, math.nan]) == [1.0, 1.0, pytest.approx(math.nan, nan_ok=True)]


def frame(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [(v, seed, x) for v, xs in values.items() for seed, x in enumerate(xs)]
    return pd.DataFrame({"variant": [r[0] for r in rows], "seed": [r[1] for r in rows],
                         "trial": range(len(rows)), "state": "COMPLETE", "m": [r[2] for r in rows]})  # fmt: skip


def test_summarize_fills_std_g_and_shared_ranks():
    out = stats.summarize(frame({"base": [0.0, 1.0, 2.0], "same": [5.0, 6.0, 7.0], "tie": [7.0, 5.0]}),
                          "m", ["base", "same", "tie"], "base")  # fmt: skip
    assert out["std"].tolist() == pytest.approx([1.0, 1.0, math.sqrt(2.0)])  # two values have a std
    assert out["g"].tolist()[1] == pytest.approx(4.0)
    assert out["rank"].tolist() == [3, 1, 1] and str(out["rank"].dtype) == "Int64"  # ties share the best


def test_summarize_without_baseline_values_or_variants():
    out = stats.summarize(frame({"a": [1.0, 2.0]}), "m", ["a"], "missing")
    assert out["diff"].isna().all() and out["mean"].tolist() == [1.5]
    empty = stats.summarize(frame({"a": [1.0]}), "m", [], None)
    assert empty.empty and list(empty.columns) == ["variant"]


def test_pareto_front_ties_on_one_axis():
    # Equal cost, better quality dominates; equal quality, lower cost dominates.
    front = stats.pareto_front(np.array([1.0, 1.0, 2.0]), np.array([0.5, 0.9, 0.9]))
    assert front.dtype == bool and front.tolist() == [False, True, False]


@pytest.mark.parametrize(
    "lo, hi, expect, verdict",
    [
        # The margin's edge belongs to the inconclusive side for lower / higher: the CI must clear it.
        (-0.5, -0.2, "lower", INCONCLUSIVE),  # hi == -margin
        (-0.2, 0.1, "lower", INCONCLUSIVE),  # lo == -margin: not contradicted either
        (0.2, 0.5, "higher", INCONCLUSIVE),  # lo == margin
        (-0.1, 0.2, "higher", INCONCLUSIVE),  # hi == margin
        # ... and to the reproduced side for similar: a CI on [-margin, margin] is within it.
        (-0.2, 0.1, "similar", REPRODUCED),
        (-0.1, 0.2, "similar", REPRODUCED),
        (0.2, 0.5, "similar", INCONCLUSIVE),  # lo == margin: overlaps the band at one point
        (-0.5, -0.2, "similar", INCONCLUSIVE),
        (-0.5, -0.3, "similar", CONTRADICTED),
        (-0.5, 0.1, "similar", INCONCLUSIVE),  # overlaps the band
        (-0.1, math.nan, "lower", INCONCLUSIVE),
        (math.nan, 0.1, "similar", INCONCLUSIVE),
    ],
)
def test_verdict_at_the_margins_edges(lo, hi, expect, verdict):
    assert claims.verdict(lo, hi, expect, 0.2) == verdict


def test_monte_carlo_permutation_p_is_reproducible():
    # 10 + 10 values have 184756 relabellings: more than n_resamples, so the test samples; a report
    # rebuilt from the same storage must still print the same p.
    a, b = np.arange(10.0), np.arange(10.0) + 2.5
    p = stats.permutation_p(a, b)
    assert stats.permutation_p(a, b) == stats.permutation_p(a, b) == p and 0 < p < 1
    # It is the draw the report's Methods section states: 9,999 resamples, a generator seeded with 0.
    documented = sps.permutation_test(
        (a, b), lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis), vectorized=True,
        n_resamples=9999, rng=np.random.default_rng(0),
    )  # fmt: skip
    assert p == documented.pvalue


GRID_TABLE = {
    "pos_encoding=sinusoidal,norm=post": [0.9, 0.92, 0.94],
    "pos_encoding=sinusoidal,norm=pre": [0.7, 0.72, 0.74],
    "pos_encoding=none,norm=post": [0.1, 0.12, 0.14],
    "pos_encoding=none,norm=pre": [0.3, 0.32, 0.34],
}


@pytest.mark.parametrize(
    "expect, margin, verdict, says",
    [
        ("lower", 0.3, REPRODUCED, "lies below -0.3"),
        ("lower", 0.7, CONTRADICTED, "rules out an effect below -0.7"),
        ("higher", 0.3, CONTRADICTED, "rules out an effect above 0.3"),
        ("similar", 0.3, CONTRADICTED, "rules out an effect within ±0.3"),
        ("lower", 0.6, INCONCLUSIVE, "straddles the margin (expected below -0.6)"),
        ("similar", 0.6, INCONCLUSIVE, "straddles the margin (expected within ±0.6)"),
    ],
)
def test_claim_reason_names_the_ci_and_the_bound(expect, margin, verdict, says):
    spec = grid_spec({"text": "t", "compare": {"model.pos_encoding": "none"},
                      "to": {"model.pos_encoding": "sinusoidal"}, "expect": expect, "margin": margin})  # fmt: skip
    (result,) = claims.evaluate_all(spec, table(GRID_TABLE))
    assert result.verdict == verdict
    assert result.reason == f"CI of compare - to [{result.ci_low:.3g}, {result.ci_high:.3g}] {says}"


def claim_of(factors: dict, claim: dict, values: dict[str, list[float]]):
    spec = StudySpec.model_validate({"name": "g", "seeds": [0, 1, 2], "factors": factors, "claims": [claim]})
    (result,) = claims.evaluate_all(spec, table(values))
    return result


NO_POSITIONS = {"text": "t", "compare": {"model.pos_encoding": "none"},
                "to": {"model.pos_encoding": "sinusoidal"}, "expect": "lower", "margin": 0.1}  # fmt: skip


def test_claim_means_pairing_and_seed_minimum():
    result = claim_of({"model.pos_encoding": ["sinusoidal", "none"]}, NO_POSITIONS,
                      {"pos_encoding=sinusoidal": [0.9, 0.8, 0.85], "pos_encoding=none": [0.1, 0.2, 0.15]})  # fmt: skip
    assert result.metric == "test/seq_acc" and not result.paired  # one pair: nothing to pair across
    assert (result.mean_compare, result.mean_to) == (pytest.approx(0.15), pytest.approx(0.85))
    assert result.verdict == REPRODUCED  # three seeds a side are enough for a verdict on exact match

    norms = {"model.pos_encoding": ["sinusoidal", "none"], "model.norm": ["post", "pre", "none"]}
    values = {f"pos_encoding={p},norm={n}": [base + shift, base + shift + 0.02]
              for p, base in (("sinusoidal", 0.8), ("none", 0.2)) for n, shift in (("post", 0), ("pre", 0.05), ("none", 0.1))}  # fmt: skip
    result = claim_of(norms, NO_POSITIONS, values)
    assert result.paired and result.to == [
        f"pos_encoding=sinusoidal,norm={n}" for n in ("post", "pre", "none")
    ]


def test_claim_with_a_variant_that_never_completed():
    # Paired: the missing variant contributes no values; unpaired (named) the same.
    missing = {"pos_encoding=sinusoidal,norm=post": [0.9, 0.92], "pos_encoding=sinusoidal,norm=pre": [0.7, 0.72],
               "pos_encoding=none,norm=post": [0.1, 0.12]}  # fmt: skip
    result = claims.evaluate_all(grid_spec(NO_POSITIONS), table(missing))[0]
    assert (result.n_compare, result.n_to) == (2, 4) and result.verdict == INCONCLUSIVE
    assert result.reason == "a variant has 0 completed seed(s) of test/seq_acc; a verdict needs 3"
    assert result.mean_compare == pytest.approx(0.11) and result.mean_to == pytest.approx(0.81)
    missing_to = {k: v for k, v in GRID_TABLE.items() if k != "pos_encoding=sinusoidal,norm=pre"}
    result = claims.evaluate_all(grid_spec(NO_POSITIONS), table(missing_to))[0]
    assert (result.n_compare, result.n_to) == (6, 3) and result.verdict == INCONCLUSIVE
    spec = StudySpec.model_validate({
        "name": "named", "seeds": [0, 1, 2], "claims": [{**NO_POSITIONS, "to": {"preset": "transformer"}}],
        "variants": {"tf": {"preset": "transformer"}, "tf-nopos": {"preset": "transformer", "model.pos_encoding": "none"},
                     "tf-nopos-pre": {"preset": "transformer", "model.pos_encoding": "none", "model.norm": "pre"}},
    })  # fmt: skip
    result = claims.evaluate_all(spec, table({"tf": [0.9, 0.8, 0.85], "tf-nopos": [0.1, 0.2, 0.15]}))[0]
    assert (result.n_compare, result.n_to, result.paired) == (3, 3, False)
    # Pooled, the compare side's three values are all tf-nopos's: tf-nopos-pre has no seed to judge.
    assert result.mean_compare == pytest.approx(0.15) and result.verdict == INCONCLUSIVE
    assert result.reason == "a variant has 0 completed seed(s) of test/seq_acc; a verdict needs 3"
    # Nothing matches `to`: the reason names that side.
    spec = grid_spec({**NO_POSITIONS, "to": {"model.pos_encoding": "rope"}})
    result = claims.evaluate_all(spec, table(missing))[0]
    assert result.reason == "no variant matches to: {'model.pos_encoding': 'rope'}"


# Intervals inside the metric's range ---------------------------------------------------------------------

ACC = stats.metric_range(METRIC)
T1 = sps.t.ppf(0.975, 1)  # the critical value of two seeds


def on_score_boundary(p: float, size: float, q: float, x: float) -> bool:
    """Wilson's interval is {x : (p - x)^2 <= q^2 x (1 - x) / size}: its ends solve the equality."""
    return (p - x) ** 2 == pytest.approx(q**2 * x * (1 - x) / size, rel=1e-9, abs=1e-12)


def wilson_by_hand(p: float, size: float, q: float) -> tuple[float, float]:
    center = (p + q**2 / (2 * size)) / (1 + q**2 / size)
    half = q / (1 + q**2 / size) * math.sqrt(p * (1 - p) / size + q**2 / (4 * size**2))
    return center - half, center + half


def test_metric_ranges_come_from_the_names():
    assert stats.metric_range("test/seq_acc") == stats.metric_range("test_long/tok_acc") == ACC
    assert (ACC.low, ACC.high) == (0.0, 1.0)
    for name in ("test/aer", "test/rank_collapse_encoder", "test/rank_collapse_decoder"):
        assert stats.metric_range(name) == ACC
    assert (stats.metric_range("test/bleu").high, stats.metric_range("test/chrf").high) == (100.0, 100.0)
    assert (stats.metric_range("val/loss").low, stats.metric_range("val/loss").high) == (0.0, math.inf)
    assert stats.metric_range("test/ppl").low == 1.0
    assert not stats.metric_range("test/score").bounded and math.isinf(stats.metric_range("test/score").low)
    assert ACC.difference() == stats.MetricRange(-1.0, 1.0)
    assert stats.MetricRange(1.0, 3.0).difference() == stats.MetricRange(-2.0, 2.0)


def test_accuracy_seeds_at_089_095_by_hand():
    lo, hi = stats.mean_ci(np.array([0.89, 0.95]), ACC, 500)
    p, s2 = 0.92, np.var([0.89, 0.95], ddof=1)
    size = 2 * p * (1 - p) / s2  # the seeds vary far more than 500 examples would: their variance rules
    assert (lo, hi) == pytest.approx(wilson_by_hand(p, size, T1), rel=1e-12)
    assert on_score_boundary(p, size, T1, lo) and on_score_boundary(p, size, T1, hi)
    assert 0 < lo < p < hi < 1  # the t-interval would be [0.539, 1.301]
    assert sps.t.interval(0.95, 1, loc=p, scale=sps.sem([0.89, 0.95]))[1] > 1


def test_accuracy_seeds_at_zero_get_the_binomial_width_of_all_examples():
    lo, hi = stats.mean_ci(np.array([0.0, 0.0]), ACC, 500)
    # Wilson at 0 successes of 2 x 500 examples: [0, q^2 / (N + q^2)].
    assert (lo, hi) == pytest.approx((0.0, T1**2 / (1000 + T1**2)), rel=1e-12)
    assert stats.mean_ci(np.array([0.0, 0.0, 0.0]), ACC, 500)[1] < hi  # more seeds, narrower
    assert stats.mean_ci(np.array([0.0, 0.0]), ACC) == (0.0, 0.0)  # no example count known: no width to give


def test_accuracy_seeds_at_one_and_099_stay_below_one():
    lo, hi = stats.mean_ci(np.array([1.0, 0.99]), ACC, 500)
    p, s2 = 0.995, np.var([1.0, 0.99], ddof=1)
    size = 2 * p * (1 - p) / s2
    assert on_score_boundary(p, size, T1, lo) and on_score_boundary(p, size, T1, hi)
    assert 0 < lo < p < hi < 1


def test_a_single_seed_has_no_interval_on_any_scale():
    for rng in (ACC, stats.metric_range("val/loss"), stats.metric_range("test/score")):
        assert all(math.isnan(x) for x in stats.mean_ci(np.array([0.4]), rng, 500))


def test_bleu_is_an_accuracy_on_a_0_100_scale():
    lo, hi = stats.mean_ci(np.array([89.0, 95.0]), stats.metric_range("test/bleu"), 500)
    assert (lo / 100, hi / 100) == pytest.approx(stats.mean_ci(np.array([0.89, 0.95]), ACC, 500), rel=1e-12)


def test_wilson_approaches_the_t_interval_away_from_the_bounds():
    values = np.random.default_rng(0).normal(0.5, 0.03, size=30).clip(0, 1)
    t_lo, t_hi = sps.t.interval(0.95, 29, loc=values.mean(), scale=sps.sem(values))
    assert stats.mean_ci(values, ACC, 1000) == pytest.approx((t_lo, t_hi), abs=1e-3)


def test_loss_and_perplexity_intervals_stay_above_their_bounds():
    loss = np.array([0.1, 0.5, 3.0])
    q, se = sps.t.ppf(0.975, 2), sps.sem(loss)
    assert sps.t.interval(0.95, 2, loc=loss.mean(), scale=se)[0] < 0  # what a t-interval would say
    factor = math.exp(q * se / loss.mean())
    lo, hi = stats.mean_ci(loss, stats.metric_range("val/loss"))
    assert (lo, hi) == pytest.approx((loss.mean() / factor, loss.mean() * factor), rel=1e-12)
    assert 0 < lo < loss.mean() < hi
    lo, hi = stats.mean_ci(loss + 1, stats.metric_range("test/ppl"))
    assert (lo, hi) == pytest.approx((1 + loss.mean() / factor, 1 + loss.mean() * factor), rel=1e-12)


def test_a_bounded_range_is_mapped_onto_zero_one_and_back():
    # A metric in [1, 3] (every bundled bounded metric starts at 0) is the accuracy (x - 1) / 2, rescaled.
    lo, hi = stats.mean_ci(np.array([2.78, 2.9]), stats.MetricRange(1.0, 3.0), 500)
    unit_lo, unit_hi = stats.mean_ci(np.array([0.89, 0.95]), ACC, 500)
    assert (lo, hi) == pytest.approx((1 + 2 * unit_lo, 1 + 2 * unit_hi), rel=1e-12)


def test_seeds_all_at_one_stay_at_most_one_despite_rounding():
    # Wilson's upper end at p = 1 is exactly 1, but in floats some seed and example counts give 1 + 2.2e-16
    # (which ones depends on the last bit of scipy's t quantile: three seeds of 50 examples with scipy 1.17,
    # four with 1.15); the interval is clipped to the range in every such case.
    overshooting = [
        (k, n) for k in (2, 3, 4, 5) for n in (10, 20, 50, 64, 100, 300, 500)
        if wilson_by_hand(1.0, k / (1 / n), stats.t_quantile(0.95, k - 1))[1] > 1.0
    ]  # fmt: skip
    assert overshooting
    for k, n in overshooting:
        assert stats.mean_ci(np.ones(k), ACC, n)[1] == 1.0


def test_loss_intervals_are_degenerate_only_when_the_seeds_agree():
    # (mean - low) * exp(+-q se / (mean - low)) whatever the mean's size: a mean loss of half a nat, and
    # a standard error of exactly 1 ([9, 11]: s^2 = 2 over 2 seeds), get intervals like any other.
    loss = stats.metric_range("val/loss")
    for values in (np.array([0.4, 0.6]), np.array([9.0, 11.0])):
        factor = math.exp(T1 * sps.sem(values) / values.mean())
        expected = (values.mean() / factor, values.mean() * factor)
        assert stats.mean_ci(values, loss) == pytest.approx(expected, rel=1e-12)
    assert stats.mean_ci(np.array([0.5, 0.5]), loss) == (0.5, 0.5)


def test_examples_is_the_fewest_that_a_completed_trial_measured():
    df = table({"a": [0.5, 0.6, 0.7]}).assign(**{"examples/test": [300, 1, 40], "examples/valid": 200})
    assert stats.examples(df, "test/seq_acc") == 1
    assert stats.examples(df, "val/loss") == 200  # validation metrics are named val/, their split valid
    assert stats.examples(df, "test_long/seq_acc") is None  # no count recorded for that split
    df["examples/test"] = [300, 0, 40]
    assert stats.examples(df, "test/seq_acc") is None  # an empty split gives no binomial floor
    df["state"] = "FAIL"
    assert stats.examples(df, "test/seq_acc") is None


# Two seeds of a Transformer with and without positions, and the claim that the second is far lower.
NO_POSITIONS_SPEC = StudySpec.model_validate({
    "name": "n", "seeds": [0, 1],
    "variants": {"tf": {"preset": "transformer"}, "nopos": {"preset": "transformer", "model.pos_encoding": "none"}},
    "claims": [{"text": "t", "compare": {"model.pos_encoding": "none"}, "to": {"preset": "transformer"},
                "expect": "lower", "margin": 0.3}],
})  # fmt: skip


def test_summary_differences_take_the_example_count_too():
    # Seeds without spread: only the binomial floor of 500 examples gives either side any width.
    df = table({"tf": [1.0, 1.0], "nopos": [0.0, 0.0]}).assign(**{"examples/test": 500})
    row = stats.summarize(df, METRIC, ["tf", "nopos"], "tf").set_index("variant").loc["nopos"]
    expected = stats.diff_ci([(np.array([0.0, 0.0]), np.array([1.0, 1.0]))], ACC, 500)
    assert (row["diff"], row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx(expected, rel=1e-12)
    assert row["diff_ci_low"] == -1.0 < row["diff_ci_high"] < -0.95
    (result,) = claims.evaluate_all(NO_POSITIONS_SPEC, df)  # the claim reads the same count
    assert (result.ci_low, result.ci_high) == pytest.approx(expected[1:], rel=1e-12)


def test_differences_of_accuracies_stay_within_minus_one_and_one():
    a, b = np.array([0.0, 0.0]), np.array([1.0, 0.99])
    welch = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert welch.low < -1  # what Welch's interval would say
    diff, lo, hi = stats.diff_ci([(a, b)], ACC, 500)
    assert diff == pytest.approx(-0.995) and -1 <= lo < diff < hi < 0
    diff, lo, hi = stats.diff_ci([(b, a)], ACC, 500)
    assert 0 < lo < diff < hi <= 1


def test_difference_interval_is_mover_of_the_two_sides_with_a_pooled_dispersion():
    # b does not vary: the dispersion is a's s^2/(p(1-p)) pooled over both sides' 1 + 1 df.
    a, b = np.array([0.89, 0.95]), np.array([0.5, 0.5])
    dispersion = (np.var(a, ddof=1) / (0.92 * 0.08) + 0) / 2
    q = sps.t.ppf(0.975, 2)
    (la, ua), (lb, ub) = wilson_by_hand(0.92, 2 / dispersion, q), wilson_by_hand(0.5, 2 / dispersion, q)
    diff, lo, hi = stats.diff_ci([(a, b)], ACC, 500)
    assert diff == pytest.approx(0.42)
    assert lo == pytest.approx(diff - math.hypot(0.92 - la, ub - 0.5), rel=1e-12)
    assert hi == pytest.approx(diff + math.hypot(ua - 0.92, 0.5 - lb), rel=1e-12)
    # Seeds that vary less than 500 examples would: the binomial 1/500 is the dispersion.
    a = np.array([0.9, 0.9001])
    (la, ua), (lb, ub) = wilson_by_hand(0.90005, 1000, q), wilson_by_hand(0.5, 1000, q)
    assert stats.diff_ci([(a, b)], ACC, 500)[1] == pytest.approx(0.40005 - math.hypot(0.90005 - la, ub - 0.5))


def test_a_perfect_variant_against_a_noisy_one_at_zero_is_decided_with_two_seeds():
    # One side at exactly 1.0 must not leave the difference with the other side's single df.
    diff, lo, hi = stats.diff_ci([(np.array([0.03, 0.016]), np.array([1.0, 1.0]))], ACC, 100)
    assert -1 <= lo < diff < hi < -0.3


def test_summary_and_claims_read_the_example_counts_and_ranges():
    df = table({"tf": [1.0, 0.99], "nopos": [0.0, 0.0]}).assign(**{"examples/test": 500})
    summary = stats.summarize(df, METRIC, ["tf", "nopos"], "tf").set_index("variant")
    assert summary.loc["nopos", "ci_high"] == pytest.approx(T1**2 / (1000 + T1**2), rel=1e-12)
    assert summary.loc["nopos", "diff_ci_low"] >= -1 and summary.loc["tf", "ci_high"] < 1
    (result,) = claims.evaluate_all(NO_POSITIONS_SPEC, df)
    assert (result.ci_low, result.ci_high) == pytest.approx(
        tuple(summary.loc["nopos", ["diff_ci_low", "diff_ci_high"]])
    )
    assert -1 <= result.ci_low and result.ci_high < -0.3
    assert result.verdict == INCONCLUSIVE  # exact match needs three seeds a side


@pytest.mark.parametrize("metric", [METRIC, "test/loss", UNBOUNDED])
def test_the_p_value_is_below_005_exactly_when_the_95_ci_excludes_0(metric):
    rng = np.random.default_rng(7)
    disagree = []
    for _ in range(60):
        k = int(rng.integers(2, 5))
        centre = {"base": rng.uniform(0.05, 0.95), "a": rng.uniform(0.05, 0.95), "b": rng.uniform(0.05, 0.95)}
        values = {
            v: list(np.clip(c + rng.normal(0, rng.uniform(0.01, 0.2), k), 0, 1)) for v, c in centre.items()
        }
        df = table(values, metric=metric).assign(**{"examples/test": 500})
        for row in stats.summarize(df, metric, list(values), "base").iloc[1:].itertuples():
            excludes = row.diff_ci_low > 0 or row.diff_ci_high < 0
            disagree += (
                [] if (row.p < 0.05) == excludes else [(values, row.diff_ci_low, row.diff_ci_high, row.p)]
            )
            # At the level 1 - p the interval just touches 0.
            _, lo, hi = stats.diff_ci([(np.array(values[row.variant]), np.array(values["base"]))],
                                      stats.metric_range(metric), 500, 1 - row.p)  # fmt: skip
            assert min(abs(lo), abs(hi)) == pytest.approx(0, abs=1e-9)
    assert disagree == []


def test_the_p_value_of_an_unbounded_metric_is_welchs_t_test():
    rng = np.random.default_rng(3)
    for _ in range(30):
        a, b = rng.normal(0, 1, int(rng.integers(2, 7))), rng.normal(1, 2, int(rng.integers(2, 7)))
        assert stats.ci_p([(a, b)]) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-8)
    assert stats.ci_p([(np.array([1.0, 2.0]), np.array([2.0, 1.0]))]) == 1.0
    assert math.isnan(stats.ci_p([(np.array([1.0]), np.array([2.0, 3.0]))]))


@pytest.mark.parametrize("n_a, n_b, floor", [(2, 2, 2 / 6), (3, 3, 2 / 20), (2, 3, 2 / 10), (5, 5, 2 / 252),
                                             (10, 10, 2 / 10000)])  # fmt: skip
def test_the_permutation_floor_is_the_p_of_two_fully_separated_groups(n_a, n_b, floor):
    assert stats.permutation_floor(n_a, n_b) == pytest.approx(floor)
    separated = stats.permutation_p(np.arange(n_a, dtype=float), np.arange(n_b, dtype=float) + 100)
    assert separated == pytest.approx(floor)


def test_both_templates_show_the_variant_tables_columns_in_one_order():
    """reports/columns.py is the one list: the Markdown and HTML tables give its headers in its order, leave
    out a column that cannot mean anything at these seeds (the permutation test at three seeds a side), and
    mark the baseline's Δ."""
    from ablate.reports.columns import VARIANT_COLUMNS, variant_table
    from ablate.reports.render import _environment

    df = table({"base": [0.5, 0.6, 0.7], "worse": [0.1, 0.2, 0.15]}, metric=UNBOUNDED)
    summary = stats.summarize(df, UNBOUNDED, ["base", "worse"], "base").assign(params=10, wall_time=1.0, aer=np.nan)
    columns, rows = variant_table(summary, "base")
    headers = [c.header for c in columns]
    assert headers == [c.header for c in VARIANT_COLUMNS if c.header != "p (perm.)"]
    markdown = _environment(html=False).from_string(
        '{% import "table.md.j2" as t %}{{ t.variant_table(columns, rows) }}'
    ).render(columns=columns, rows=rows)
    lines = markdown.splitlines()
    assert lines[0] == "| " + " | ".join(headers) + " |"
    assert lines[2].startswith("| base | 3 | 1 | 0.600 |") and "| *baseline* | – |" in lines[2]
    html = _environment(html=True).from_string(
        '{% import "table.html.j2" as t %}{{ t.variant_rows(columns, rows) }}'
    ).render(columns=columns, rows=rows)
    assert html.splitlines()[0] == "<tr>" + "".join(f"<th>{h}</th>" for h in headers).replace("'", "&#39;") + "</tr>"
    assert "<td>base</td><td>3</td><td>1</td><td>0.600</td>" in html and "<td><em>baseline</em></td>" in html
    assert rows[1][headers.index("Δ vs baseline")].text == "-0.450"
