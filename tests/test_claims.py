"""Claim forms against hand computations: interactions (paired by seed and not), uninformative outcomes
(ceiling, floor, a side that cannot learn), selectors resolved through presets, sources, profile claims."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from ablate.analysis import claims, stats
from ablate.analysis.claims import (
    CEILING,
    CONTRADICTED,
    FLOOR,
    INCONCLUSIVE,
    INSENSITIVE,
    PENDING,
    REPRODUCED,
    UNATTAINABLE,
    UNLEARNT,
)
from ablate.harness.study.validate import load_study
from ablate.reports import headline
from ablate.reports.render import build_report
from ablate.schema.errors import ConfigError
from ablate.schema.spec import ClaimSpec, StudySpec, apply_profile, variant_settings

SHORT, LONG = "test/tok_acc", "test_long/tok_acc"
SOURCE = {
    "paper": "Bahdanau et al. 2015",
    "where": "Sec. 5.1, Fig. 2",
    "reports": "RNNencdec drops with length",
}


def trials(cells: dict[tuple[str, int], dict[str, float]]) -> pd.DataFrame:
    """A trial table as analysis.table.trials_frame gives it: one completed trial per (variant, seed)."""
    rows = [{"trial": i, "variant": v, "seed": seed, "state": "COMPLETE", **metrics}
            for i, ((v, seed), metrics) in enumerate(cells.items())]  # fmt: skip
    return pd.DataFrame(rows)


def plain_attn(metric: str, plain: list[float], attn: list[float]) -> pd.DataFrame:
    """One metric's values by seed for the model without attention (plain) and the one with it (attn)."""
    return trials({("plain", s): {metric: x} for s, x in enumerate(plain)}
                  | {("attn", s): {metric: x} for s, x in enumerate(attn)})  # fmt: skip


def named_spec(claim: dict, seeds=(0, 1, 2)) -> StudySpec:
    return StudySpec.model_validate({
        "name": "bottleneck", "seeds": list(seeds),
        "variants": {"plain": {"preset": "lstm"}, "attn": {"preset": "lstm-bahdanau"}},
        "claims": [{"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"}, **claim}],
    })  # fmt: skip


def degradation(short_c, long_c, short_t, long_t) -> pd.DataFrame:
    """Per seed: the model without attention (plain) and with it (attn), in and beyond training lengths."""
    cells = {}
    for seed, values in enumerate(zip(short_c, long_c, short_t, long_t)):
        cells[("plain", seed)] = {SHORT: values[0], LONG: values[1]}
        cells[("attn", seed)] = {SHORT: values[2], LONG: values[3]}
    return trials(cells)


def t_interval(x: np.ndarray) -> tuple[float, float]:
    return sps.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sps.sem(x))


INTERACTION = {"metric": LONG, "versus": {"metric": SHORT}, "source": SOURCE}


def test_interaction_of_two_metrics_is_paired_by_seed():
    short_c, long_c = [0.90, 0.92, 0.94], [0.40, 0.45, 0.44]
    short_t, long_t = [1.00, 0.99, 1.00], [0.70, 0.72, 0.71]
    df = degradation(short_c, long_c, short_t, long_t)
    contrast = (np.array(long_c) - long_t) - (np.array(short_c) - short_t)  # [-0.20, -0.20, -0.21]
    spec = named_spec({**INTERACTION, "expect": "lower", "margin": 0.05})
    (result,) = claims.evaluate_all(spec, df)
    assert result.paired_by_seed and (result.compare, result.to) == (["plain"], ["attn"])
    assert result.metric == LONG and result.versus_metric == SHORT
    assert result.diff == pytest.approx(contrast.mean())
    assert (result.ci_low, result.ci_high) == pytest.approx(t_interval(contrast))
    assert result.diff_first == pytest.approx(np.mean(long_c) - np.mean(long_t))
    assert result.diff_versus == pytest.approx(np.mean(short_c) - np.mean(short_t))
    assert result.verdict == REPRODUCED and result.claim.source.paper == "Bahdanau et al. 2015"

    # The same data against the opposite expectation, and against a margin the contrast cannot reach.
    assert claims.evaluate_all(named_spec({**INTERACTION, "expect": "higher"}), df)[0].verdict == CONTRADICTED
    far = named_spec({**INTERACTION, "expect": "lower", "margin": 0.5})
    assert claims.evaluate_all(far, df)[0].verdict == CONTRADICTED


def test_interaction_with_seed_noise_is_inconclusive():
    # Per-seed contrasts -0.30, -0.10, +0.05: the t-interval with 2 df reaches both sides of -0.05.
    df = degradation([0.9, 0.9, 0.9], [0.4, 0.6, 0.75], [1.0, 1.0, 1.0], [0.8, 0.8, 0.8])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "lower", "margin": 0.05}), df)
    assert result.diff == pytest.approx(np.mean([-0.30, -0.10, 0.05]))
    assert result.ci_low < -0.05 < result.ci_high and result.verdict == INCONCLUSIVE


def test_an_interactions_interval_stays_within_its_own_range():
    # Per-seed contrasts -1.5 and +1.0: the t-interval with 1 df spans ±16; accuracies allow [-2, 2].
    df = degradation([1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 0.5])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "lower"}, seeds=(0, 1)), df)
    assert result.diff == pytest.approx(-0.25) and (result.ci_low, result.ci_high) == (-2.0, 2.0)
    assert result.verdict == INCONCLUSIVE


GRID_METRIC = "test/tok_acc"  # two seeds a side decide a claim on it (exact match needs three)


def grid_spec(claim: dict, seeds=(0, 1)) -> StudySpec:
    return StudySpec.model_validate({
        "name": "scaling", "seeds": list(seeds), "metric": {"name": GRID_METRIC},
        "factors": {"model.d_model": [16, 256], "model.scale": ["sqrt", "none"]},
        "claims": [{"text": "the scaling gap grows with d_k", "compare": {"model.scale": "none"},
                    "to": {"model.scale": "sqrt"}, "within": {"model.d_model": 256},
                    "versus": {"within": {"model.d_model": 16}}, "expect": "lower", "margin": 0.1, **claim}],
    })  # fmt: skip


GRID = {
    ("d_model=256,scale=none", 0): 0.01, ("d_model=256,scale=none", 1): 0.03,
    ("d_model=256,scale=sqrt", 0): 0.80, ("d_model=256,scale=sqrt", 1): 0.84,
    ("d_model=16,scale=none", 0): 0.30, ("d_model=16,scale=none", 1): 0.28,
    ("d_model=16,scale=sqrt", 0): 0.70, ("d_model=16,scale=sqrt", 1): 0.74,
}  # fmt: skip


def test_interaction_of_two_sub_grids_pairs_shared_seeds():
    df = trials({key: {GRID_METRIC: x} for key, x in GRID.items()})
    (result,) = claims.evaluate_all(grid_spec({}), df)
    contrast = np.array([(0.01 - 0.80) - (0.30 - 0.70), (0.03 - 0.84) - (0.28 - 0.74)])
    assert result.paired_by_seed and result.diff == pytest.approx(contrast.mean())
    assert (result.ci_low, result.ci_high) == pytest.approx(t_interval(contrast))
    assert result.compare == ["d_model=256,scale=none"] and result.to == ["d_model=256,scale=sqrt"]
    assert result.verdict == REPRODUCED


def test_interaction_without_shared_seeds_is_welchs_interval_of_four_groups():
    # The d_model=16 cells ran seeds 2 and 3: nothing to pair, four independent groups.
    shifted = {(v, seed + 2 if v.startswith("d_model=16") else seed): x for (v, seed), x in GRID.items()}
    df = trials({key: {GRID_METRIC: x} for key, x in shifted.items()})
    (result,) = claims.evaluate_all(grid_spec({}), df)
    groups = [
        np.array([GRID[(v, 0)], GRID[(v, 1)]])
        for v in (
            "d_model=256,scale=none",
            "d_model=256,scale=sqrt",
            "d_model=16,scale=none",
            "d_model=16,scale=sqrt",
        )
    ]
    estimate = (groups[0].mean() - groups[1].mean()) - (groups[2].mean() - groups[3].mean())
    terms = [g.var(ddof=1) / len(g) for g in groups]
    dof = sum(terms) ** 2 / sum(t**2 / (len(g) - 1) for t, g in zip(terms, groups))
    half = sps.t.ppf(0.975, dof) * np.sqrt(sum(terms))
    assert not result.paired_by_seed and result.diff == pytest.approx(estimate)  # fmt: skip
    assert (result.ci_low, result.ci_high) == pytest.approx((estimate - half, estimate + half))


def test_a_directional_interaction_carried_by_a_cell_at_the_floor_is_uninformative():
    # Unscaled at d_model 16 sits within half the margin (0.05) of 0 in every seed: its true value could be
    # lower still, so the gap at 16, and with it how much the gap grows, is the floor's, not measured.
    floor = {**GRID, ("d_model=16,scale=none", 0): 0.0, ("d_model=16,scale=none", 1): 0.02,
             ("d_model=16,scale=sqrt", 0): 0.50, ("d_model=16,scale=sqrt", 1): 0.52}  # fmt: skip
    (result,) = claims.evaluate_all(grid_spec({}), trials({key: {GRID_METRIC: x} for key, x in floor.items()}))
    assert claims.verdict(result.ci_low, result.ci_high, "lower", 0.1) == REPRODUCED
    assert result.verdict == FLOOR
    assert result.reason.startswith(
        "cell compare' (d_model=16,scale=none) lies within half the margin of the lower bound 0 of test/tok_acc "
        "in every seed: it learned nothing the metric measures, and Δ could be higher than measured, across the "
        "margin; Δ = ("
    )
    # At the floor on the side where it can only make Δ lower still, the bound cannot overturn the verdict.
    conservative = {**GRID, ("d_model=256,scale=none", 0): 0.0, ("d_model=256,scale=none", 1): 0.0}
    df = trials({key: {GRID_METRIC: x} for key, x in conservative.items()})
    (result,) = claims.evaluate_all(grid_spec({}), df)
    assert result.verdict == REPRODUCED
    assert result.reason.endswith(
        "; cell compare (d_model=256,scale=none) lies within half the margin of the lower bound 0 of test/tok_acc "
        "in every seed: it could be worse still, which puts the true Δ only further below the one measured, so "
        "the verdict stands"
    )


def test_an_interaction_cell_without_variants_or_seeds_is_inconclusive():
    df = trials({key: {GRID_METRIC: x} for key, x in GRID.items()})
    missing = grid_spec({"versus": {"within": {"model.d_model": 64}}})
    assert "no variant matches compare', to'" in claims.evaluate_all(missing, df)[0].reason
    one_seed = trials({(v, s): {GRID_METRIC: x} for (v, s), x in GRID.items() if s == 0})
    (result,) = claims.evaluate_all(grid_spec({}), one_seed)
    assert result.verdict == INCONCLUSIVE and "1 completed seed" in result.reason


def test_similar_claims_at_the_metrics_bounds_are_uninformative():
    similar = {"metric": SHORT, "expect": "similar", "margin": 0.05}
    ceiling = degradation([0.99, 1.0, 0.98], [0, 0, 0], [1.0, 1.0, 0.99], [0, 0, 0])
    (result,) = claims.evaluate_all(named_spec(similar), ceiling)
    assert result.verdict == CEILING and "upper bound 1" in result.reason
    floor = degradation([0.01, 0.0, 0.02], [0, 0, 0], [0.0, 0.0, 0.01], [0, 0, 0])
    assert claims.evaluate_all(named_spec(similar), floor)[0].verdict == FLOOR
    # Off the bounds the same claim is judged by its CI: it would be reproduced, but has no positive control.
    middle = degradation([0.70, 0.71, 0.72], [0, 0, 0], [0.70, 0.72, 0.71], [0, 0, 0])
    assert claims.evaluate_all(named_spec(similar), middle)[0].verdict == claims.UNCONTROLLED


def test_a_comparison_against_a_side_that_cannot_learn_is_uninformative():
    higher = {"metric": SHORT, "expect": "lower", "margin": 0.1, "chance": 0.1}
    # attn (the to side) learned; plain sits at 0.00-0.02, its whole CI below chance 0.1.
    df = degradation([0.0, 0.02, 0.01], [0, 0, 0], [0.9, 0.92, 0.91], [0, 0, 0])
    (result,) = claims.evaluate_all(named_spec(higher), df)
    assert result.verdict == UNLEARNT and result.reason.startswith("compare (plain)")
    # Without a stated chance level the same data reproduce the claim.
    assert claims.evaluate_all(named_spec({**higher, "chance": None}), df)[0].verdict == REPRODUCED
    # A side whose CI reaches above chance can learn.
    learns = degradation([0.0, 0.3, 0.1], [0, 0, 0], [0.9, 0.92, 0.91], [0, 0, 0])
    assert claims.evaluate_all(named_spec(higher), learns)[0].verdict != UNLEARNT
    # For a loss, a model that cannot learn stays above chance.
    loss = trials({("plain", s): {"val/loss": x} for s, x in enumerate([2.3, 2.31, 2.29])}
                  | {("attn", s): {"val/loss": x} for s, x in enumerate([0.1, 0.12, 0.11])})  # fmt: skip
    spec = named_spec({"metric": "val/loss", "expect": "higher", "chance": 2.0})
    assert claims.evaluate_all(spec, loss)[0].verdict == UNLEARNT


def test_a_baseline_short_of_the_studys_level_decides_no_claim():
    """bible's rule: claims are judged only once the baseline (attn) reaches 10 test BLEU; below it every
    claim is uninformative, its Δ and CI kept, and the looks end."""
    claim = {"metric": "test_long/bleu", "expect": "lower", "margin": 1.0}
    weak = trials({("plain", s): {"test/bleu": 2.0 + s, "test_long/bleu": 0.5} for s in range(3)}
                  | {("attn", s): {"test/bleu": 8.0 + s, "test_long/bleu": 6.0 + s} for s in range(3)})  # fmt: skip
    level = {"metric": "test/bleu", "value": 10.0, "why": "neither model translates"}
    spec = StudySpec.model_validate({**named_spec(claim).model_dump(), "baseline": "attn", "judge_from": level})
    (result,) = claims.evaluate_all(spec, weak)
    assert result.verdict == claims.UNDECIDABLE and result.decided
    assert result.reason == ("the baseline attn reaches test/bleu 9 (mean of 3 seeds); plain reaches test/bleu 3 "
                             "(mean of 3 seeds), short of the 10 the study judges from: neither model translates")  # fmt: skip
    assert result.diff == pytest.approx(0.5 - 7.0)  # the numbers stay for the reader
    # Without the level, or with a baseline that reaches it, the same claim is judged.
    unlevelled = StudySpec.model_validate({**spec.model_dump(), "judge_from": None})
    assert claims.evaluate_all(unlevelled, weak)[0].verdict == REPRODUCED
    strong = weak.assign(**{"test/bleu": weak["test/bleu"] + 10})
    assert claims.evaluate_all(spec, strong)[0].verdict == REPRODUCED
    # Where lower is better, the level is a ceiling on the baseline's mean.
    lossy = {"metric": "test/loss", "value": 1.0}
    on_loss = StudySpec.model_validate({**spec.model_dump(), "judge_from": lossy})
    assert claims.evaluate_all(on_loss, weak.assign(**{"test/loss": 2.0}))[0].verdict == claims.UNDECIDABLE
    assert claims.evaluate_all(on_loss, weak.assign(**{"test/loss": 0.5}))[0].verdict == REPRODUCED


def test_a_claim_that_leaves_the_baseline_out_is_judged_from_its_level_too():
    """bible's RNNsearch-30 against RNNencdec-50 compares two variants, neither of them the baseline whose
    level judge_from reads: the looks read the baseline's trials as well, so the claim is undecidable too;
    and so it is while a variant it compares falls short of the level."""
    spec = StudySpec.model_validate({
        "name": "bible", "seeds": [0, 1, 2], "baseline": "attn50",
        "variants": {"plain50": {"preset": "lstm", "task.max_tokens": 50},
                     "attn50": {"preset": "lstm-bahdanau", "task.max_tokens": 50},
                     "attn30": {"preset": "lstm-bahdanau", "task.max_tokens": 30}},
        "judge_from": {"metric": "test/bleu", "value": 10.0},
        "claims": [{"text": "t", "compare": {"task.max_tokens": 30}, "to": {"preset": "lstm"},
                    "metric": "test/bleu", "expect": "higher", "margin": 1.0}],
    })  # fmt: skip
    bleu = {"plain50": [0.2, 0.3, 0.25], "attn50": [0.6, 0.7, 0.65], "attn30": [4.0, 4.5, 5.0]}
    weak = trials({(v, s): {"test/bleu": x} for v, xs in bleu.items() for s, x in enumerate(xs)})
    assert claims.claim_variants(spec, spec.claims[0]) == ["attn30", "plain50", "attn50"]
    (result,) = claims.evaluate_all(spec, weak)
    assert result.verdict == claims.UNDECIDABLE and "the baseline attn50 reaches test/bleu 0.65" in result.reason
    # The baseline reaching the level is not enough: each variant the claim compares must reach it too.
    baseline_only = weak.assign(**{"test/bleu": weak["test/bleu"].where(weak["variant"] != "attn50", 12.0)})
    (result,) = claims.evaluate_all(spec, baseline_only)
    assert result.verdict == claims.UNDECIDABLE and result.reason.startswith(
        "attn30 reaches test/bleu 4.5 (mean of 3 seeds); plain50 reaches test/bleu 0.25"
    )
    strong = weak.assign(**{"test/bleu": weak["test/bleu"] + 12.0})
    assert claims.evaluate_all(spec, strong)[0].verdict == REPRODUCED


def test_a_profile_sets_its_own_level_or_none():
    tree = {"name": "lvl", "judge_from": {"metric": "test/bleu", "value": 10},
            "profiles": {"cpu": {}, "gpu": {"judge_from": {"metric": "test/bleu", "value": 20}},
                         "tiny": {"judge_from": None}}}  # fmt: skip
    assert StudySpec.model_validate(apply_profile(dict(tree), "cpu", "f")).judge_from.value == 10
    assert StudySpec.model_validate(apply_profile(dict(tree), "gpu", "f")).judge_from.value == 20
    assert StudySpec.model_validate(apply_profile(dict(tree), "tiny", "f")).judge_from is None


def test_a_level_on_a_metric_no_variant_reports_is_refused(tmp_path):
    tree = {"name": "lvl", "base": {"task": {"name": "reverse", "max_len": 4, "n_train": 8, "n_valid": 4,
            "n_test": 4}}, "variants": {"a": {}, "b": {"model.heads": 2}}, "seeds": [0, 1],
            "judge_from": {"metric": "test/bleu", "value": 10}}  # fmt: skip
    path = tmp_path / "lvl.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=r"judge_from.metric: 'test/bleu' is not reported by variant 'a'"):
        load_study(path)


def test_selectors_match_the_model_keys_a_preset_sets():
    spec = StudySpec.model_validate({
        "name": "scan", "seeds": [0, 1, 2],
        "factors": {"preset": ["lstm", "lstm-bahdanau", "transformer"], "task.split": ["simple", "length"]},
        "claims": [{"text": "RNNs fail on length", "compare": {"model.arch": "lstm", "task.split": "length"},
                    "to": {"model.arch": "lstm", "task.split": "simple"}, "expect": "lower", "margin": 0.3}],
    })  # fmt: skip
    settings = variant_settings(spec)
    assert settings["preset=lstm-bahdanau,split=simple"]["model.attention"] == "additive"
    values = {"simple": [0.95, 0.97, 0.96], "length": [0.10, 0.14, 0.12]}
    df = trials({(f"preset={p},split={s}", seed): {"test/seq_acc": x} for p in ("lstm", "lstm-bahdanau", "transformer")
                 for s, xs in values.items() for seed, x in enumerate(xs)})  # fmt: skip
    (result,) = claims.evaluate_all(spec, df)
    assert result.compare == ["preset=lstm,split=length", "preset=lstm-bahdanau,split=length"]
    assert result.to == ["preset=lstm,split=simple", "preset=lstm-bahdanau,split=simple"]
    assert result.paired and result.verdict == REPRODUCED
    # A key the variant overrides wins over its preset's value.
    named = StudySpec.model_validate(
        {"name": "n", "variants": {"nopos": {"preset": "transformer", "model.pos_encoding": "none"}}}
    )
    assert variant_settings(named)["nopos"]["model.pos_encoding"] == "none"


def test_claim_schema_checks_sources_and_interactions():
    claim = {"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"}, "expect": "lower"}
    with pytest.raises(ValueError, match="reports"):
        named_spec({"expect": "lower", "source": {"paper": "p", "where": "w"}})
    with pytest.raises(ValueError, match="versus: give another metric or another within"):
        named_spec({"expect": "lower", "metric": SHORT, "versus": {"metric": SHORT}})
    assert named_spec({"expect": "lower"}).claims[0].source is None  # optional for a user's own study
    assert StudySpec.model_validate({"name": "n", "claims": [claim]}).claims[0].versus is None


def test_a_profile_adds_its_own_claims(tmp_path):
    extra = {"text": "only at scale", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"},
             "expect": "lower", "source": SOURCE}  # fmt: skip
    tree = {"name": "s", "variants": {"plain": {"preset": "lstm"}, "attn": {"preset": "lstm-bahdanau"}},
            "claims": [{**extra, "text": "everywhere"}],
            "profiles": {"cpu": {}, "gpu": {"train.max_steps": 10, "claims": [extra]}}}  # fmt: skip
    assert [c["text"] for c in apply_profile(dict(tree), "cpu", "s.yaml")["claims"]] == ["everywhere"]
    assert [c["text"] for c in apply_profile(dict(tree), "gpu", "s.yaml")["claims"]] == [
        "everywhere",
        "only at scale",
    ]
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nvariants: {a: {preset: lstm}}\nclaims: [{text: t, compare: {}, to: {}, expect: up}]\n"
    )
    with pytest.raises(ConfigError, match=r"claims\[0\]\.expect"):
        load_study(path)


def test_the_report_prints_each_claims_source_beside_its_verdict(tmp_path, monkeypatch):
    import test_reports  # the constructed study of the report tests, with this claim in place of theirs

    source = {"paper": "Vaswani et al. 2017", "where": "Sec. 3.5", "reports": "positions <must> be injected"}
    claim = {**test_reports.CLAIM, "source": source, "confounds": "a 2-layer <model>"}
    monkeypatch.setattr(test_reports, "CLAIM", claim)
    spec, storage, runs = test_reports.synthetic_study(tmp_path)
    out = build_report(spec, storage, runs)
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Without positions"))
    cells = [c.strip() for c in row.split(" | ")]
    assert cells[1] == "**pending**"  # a trial of the claim still runs
    assert cells[2] == "Vaswani et al. 2017, Sec. 3.5: positions &lt;must&gt; be injected"
    assert "Confounds: a 2-layer &lt;model&gt;" in cells[0]
    assert "Vaswani et al. 2017, Sec. 3.5: positions &lt;must&gt; be injected</td>" in html
    assert 'class="pending">pending</td>' in html


def undecided(expect: str, margin: float, diff: float, ci: tuple[float, float], seeds: int = 3):
    spec = ClaimSpec(text="c", compare={"a": 1}, to={"a": 2}, expect=expect, margin=margin)
    return claims.ClaimResult(claim=spec, metric=SHORT, verdict=INCONCLUSIVE, reason="", diff=diff,
                              ci_low=ci[0], ci_high=ci[1], seeds=seeds, n_compare=seeds, n_to=seeds,
                              level=0.95, budget_spent=True)  # fmt: skip


@pytest.mark.parametrize(
    "expect,margin,diff,ci,needed",
    [
        # Half-width 0.15 at 3 seeds, 95%; lower than -0.1 needs the CI's upper end 0.05 nearer: a half-width
        # of 0.05, t(n-1)/sqrt(n) < (0.05/0.15) t(2)/sqrt(3) = 0.828: n=8 gives 2.365/2.828 = 0.836, n=9
        # 2.306/3 = 0.769.
        ("lower", 0.1, -0.15, (-0.3, 0.0), 9),
        ("higher", 0.1, 0.15, (0.0, 0.3), 9),  # the mirror image
        # Similar within 0.2, Δ 0.15: the CI must close to 0.05 around Δ, as above.
        ("similar", 0.2, 0.15, (0.0, 0.3), 9),
        # Similar within 0.1 with Δ 0.15: contradicting it needs the CI 0.05 from Δ too.
        ("similar", 0.1, 0.15, (0.0, 0.3), 9),
        # Half-width 0.15, distance 0.1: t(n-1)/sqrt(n) < 1.656; n=4 gives 3.182/2 = 1.591.
        ("lower", 0.1, -0.2, (-0.35, -0.05), 4),
        ("similar", 0.15, 0.15, (0.0, 0.3), None),  # Δ on the margin: no seed count decides it
    ],
)
def test_an_undecided_claim_says_how_many_seeds_would_decide_it(expect, margin, diff, ci, needed):
    result = undecided(expect, margin, diff, ci)
    assert claims.seeds_to_decide(result) == needed
    assert result.decision.startswith("budget spent (3 seeds, 95% CIs); ")
    assert result.decision.endswith(
        f"about {needed} seeds per variant would decide it at this spread" if needed
        else "no seed count up to 1000 would: Δ sits on the margin"
    )  # fmt: skip


@pytest.mark.parametrize(
    "expect,margin,diff,ci,seeds,needed",
    [
        # Δ on the wrong side of 0: the edge to clear is still the margin's own, -0.1 (0.15 away, the
        # half-width itself), so the first count past 3 does: not the 9 a distance |m - |Δ|| = 0.05 needs.
        ("lower", 0.1, 0.05, (-0.1, 0.2), 3, 4),
        ("higher", 0.1, -0.05, (-0.2, 0.1), 3, 4),
        # Two seeds: t(1)/sqrt(2) = 8.985; a third of it is 2.995, and n=3 gives 4.303/1.732 = 2.484.
        ("lower", 0.1, -0.15, (-0.3, 0.0), 2, 3),
        # An asymmetric CI narrower than the distance (half-width 0.085, distance 0.1): still one more seed.
        ("lower", 0.1, -0.2, (-0.22, -0.05), 3, 4),
        ("lower", 0.1, -0.05, (-0.05, -0.05), 3, None),  # no spread: more seeds change nothing
        ("lower", 0.1, -0.101, (-0.251, 0.049), 3, None),  # 0.001 from the margin: past 1000 seeds
    ],
)
def test_seed_projection_measures_from_the_margins_edge(expect, margin, diff, ci, seeds, needed):
    assert claims.seeds_to_decide(undecided(expect, margin, diff, ci, seeds)) == needed


def test_a_side_pooling_two_variants_projects_seeds_per_variant():
    """Three seeds of two variants a side are six values: t(n - 1)/sqrt(n) must fall below
    (0.1/0.15) t(5)/sqrt(6) = 0.700, first at n = 11 values (2.228/3.317 = 0.672), so six seeds a variant."""
    result = undecided("lower", 0.1, -0.2, (-0.35, -0.05), seeds=3)
    result.n_compare = result.n_to = 6
    assert claims.seeds_to_decide(result) == 6
    assert result.decision.endswith("about 6 seeds per variant would decide it at this spread")
    # One seed of two variants a side (a listed seed): 3 values a side decide it (as for two seeds of one
    # variant, above), so two seeds a variant.
    result = undecided("lower", 0.1, -0.15, (-0.3, 0.0), seeds=1)
    result.n_compare = result.n_to = 2
    assert claims.seeds_to_decide(result) == 2


def test_seed_projection_is_strict_and_looks_up_to_exactly_max_projected_seeds():
    width = lambda n: stats.t_quantile(0.95, n - 1) / math.sqrt(n)  # noqa: E731
    half = (0.2 - -0.1) / 2
    # Δ exactly where the projected half-width at 5 seeds lands (margin 0, so the distance is |Δ|): a CI
    # that only reaches the edge does not clear it, so 6.
    assert claims.seeds_to_decide(undecided("higher", 0.0, half * width(5) / width(3), (-0.1, 0.2))) == 6
    # A distance between the projections at n - 1 and n seeds is first cleared at n: 1000 is the last
    # count projected, 1001 is past it.
    for last, needed in ((1000, 1000), (1001, None)):
        diff = half * (width(last - 1) + width(last)) / 2 / width(3)
        assert claims.seeds_to_decide(undecided("higher", 0.0, diff, (-0.1, 0.2))) == needed


@pytest.mark.parametrize("shared_seeds", [True, False])
def test_an_interaction_is_judged_at_the_level_it_is_given(shared_seeds):
    grid = (
        GRID
        if shared_seeds
        else {(v, s + 2 if v.startswith("d_model=16") else s): x for (v, s), x in GRID.items()}
    )
    df = trials({key: {GRID_METRIC: x} for key, x in grid.items()})
    spec = grid_spec({})
    result = claims.evaluate(spec, spec.claims[0], df, level=0.99)
    groups = [np.array([GRID[(v, 0)], GRID[(v, 1)]]) for v in (
        "d_model=256,scale=none", "d_model=256,scale=sqrt", "d_model=16,scale=none", "d_model=16,scale=sqrt")]  # fmt: skip
    if shared_seeds:
        contrast = groups[0] - groups[1] - groups[2] + groups[3]
        expected = sps.t.interval(0.99, 1, loc=contrast.mean(), scale=sps.sem(contrast))
    else:
        estimate = (groups[0].mean() - groups[1].mean()) - (groups[2].mean() - groups[3].mean())
        terms = [g.var(ddof=1) / len(g) for g in groups]
        dof = sum(terms) ** 2 / sum(t**2 / (len(g) - 1) for t, g in zip(terms, groups))
        half = sps.t.ppf(0.995, dof) * np.sqrt(sum(terms))
        expected = (estimate - half, estimate + half)
    assert result.level == 0.99 and result.paired_by_seed == shared_seeds
    assert (result.ci_low, result.ci_high) == pytest.approx(expected, rel=1e-12)
    # Each side's mean is its change from the first sub-grid to the second; the reason gives both differences.
    assert result.mean_compare == pytest.approx(groups[0].mean() - groups[2].mean())
    assert result.mean_to == pytest.approx(groups[1].mean() - groups[3].mean())
    first, versus = groups[0].mean() - groups[1].mean(), groups[2].mean() - groups[3].mean()
    assert result.reason.startswith(
        f"Δ = ({first:.3g} on test/tok_acc) - ({versus:.3g} on test/tok_acc); CI of compare - to ["
    )


def test_an_interaction_cell_that_cannot_learn_is_named_by_its_arm():
    near_zero = {("d_model=256,scale=none", 0): 0.01, ("d_model=256,scale=none", 1): 0.011,
                 ("d_model=16,scale=none", 0): 0.02, ("d_model=16,scale=none", 1): 0.021}  # fmt: skip
    df = trials({key: {GRID_METRIC: x} for key, x in {**GRID, **near_zero}.items()})
    (result,) = claims.evaluate_all(grid_spec({"chance": 0.05}), df)
    assert result.verdict == UNLEARNT
    assert result.reason == (
        "compare (d_model=256,scale=none); compare' (d_model=16,scale=none): "
        "95% CI of the mean on the chance side of 0.05"
    )


def test_every_side_that_cannot_learn_is_listed_with_its_variants():
    # Sorting-like scores near 0 on both sides, two variants a side; both sides also sit at the floor of a
    # similar claim, but a side that cannot learn says more than that.
    spec = StudySpec.model_validate({
        "name": "s", "seeds": [0, 1, 2],
        "factors": {"preset": ["lstm", "lstm-bahdanau"], "task.split": ["simple", "length"]},
        "claims": [{"text": "t", "compare": {"task.split": "length"}, "to": {"task.split": "simple"},
                    "expect": "similar", "margin": 0.05, "chance": 0.1}],
    })  # fmt: skip
    values = {"simple": [0.02, 0.021, 0.02], "length": [0.0, 0.001, 0.0]}
    df = trials({(f"preset={p},split={s}", seed): {"test/seq_acc": x} for p in ("lstm", "lstm-bahdanau")
                 for s, xs in values.items() for seed, x in enumerate(xs)})  # fmt: skip
    (result,) = claims.evaluate_all(spec, df)
    assert result.verdict == UNLEARNT
    assert result.reason == (
        "compare (preset=lstm,split=length, preset=lstm-bahdanau,split=length); "
        "to (preset=lstm,split=simple, preset=lstm-bahdanau,split=simple): "
        "95% CI of the mean on the chance side of 0.1"
    )


def test_cannot_learn_reads_the_metrics_direction_and_is_strict():
    # AER is lower-is-better: a CI wholly above chance cannot learn; one that touches chance can.
    assert claims.cannot_learn(np.array([0.6, 0.61]), "test/aer", 0.5)
    assert not claims.cannot_learn(np.array([0.5, 0.5]), "test/aer", 0.5)
    assert not claims.cannot_learn(np.array([0.6, 0.61]), "test/seq_acc", 0.5)
    assert claims.cannot_learn(np.array([0.04, 0.041]), "test/seq_acc", 0.05)
    assert not claims.cannot_learn(np.array([0.05, 0.05]), "test/seq_acc", 0.05)


def test_the_bounds_margin_includes_its_edge():
    # Means exactly a margin of 0.25 from the bound count as at the bound (0.75 and 0.25 are exact).
    similar = {"metric": SHORT, "expect": "similar", "margin": 0.25}
    ceiling = degradation([0.75] * 3, [0, 0, 0], [0.75] * 3, [0, 0, 0])
    assert claims.evaluate_all(named_spec(similar), ceiling)[0].verdict == CEILING
    floor = degradation([0.25] * 3, [0, 0, 0], [0.25] * 3, [0, 0, 0])
    assert claims.evaluate_all(named_spec(similar), floor)[0].verdict == FLOOR


def test_a_loss_is_judged_as_a_ratio_with_a_relative_margin():
    # A leak takes the loss from 0.056 to 0.002 nats: 28 times lower, 0.054 lower. A margin of 1 (one side
    # at least twice the other) is met; as 1 nat it could never have been.
    leak = trials({("plain", s): {"val/loss": x} for s, x in enumerate([0.0021, 0.0019, 0.0020])}
                  | {("attn", s): {"val/loss": x} for s, x in enumerate([0.055, 0.057, 0.056])})  # fmt: skip
    (result,) = claims.evaluate_all(
        named_spec({"metric": "val/loss", "expect": "lower", "margin": 1.0}), leak
    )
    logs = np.log([0.0021, 0.0019, 0.0020]), np.log([0.055, 0.057, 0.056])
    assert result.diff == pytest.approx(logs[0].mean() - logs[1].mean())
    assert result.mean_compare == pytest.approx(np.exp(logs[0].mean()))  # geometric means
    terms = [x.var(ddof=1) / 3 for x in logs]
    dof = sum(terms) ** 2 / sum(t**2 / 2 for t in terms)
    half = sps.t.ppf(0.975, dof) * math.sqrt(sum(terms))
    assert (result.ci_low, result.ci_high) == pytest.approx((result.diff - half, result.diff + half))
    assert result.verdict == REPRODUCED and result.reason.startswith("CI of log(compare / to) [")
    assert f"below {-math.log(2):.3g}" in result.reason
    # The report shows the margin on the scale of the Δ beside it, not the study file's 1 next to a log.
    assert (result.expected, result.margin_text) == ("below -0.693", "ratio 2 (log 0.693)")
    assert headline.claim_line(result)["numbers"] == (
        f"log(compare / to) = {result.diff:.3f}, 95% CI [{result.ci_low:.3f}, {result.ci_high:.3f}], "
        "expected below -0.693 (a ratio of 2)."
    )
    any_drop = claims.evaluate_all(named_spec({"metric": "val/loss", "expect": "lower"}), leak)[0]
    assert (any_drop.expected, any_drop.margin_text) == ("below 0", "0")
    assert headline.claim_line(any_drop)["numbers"].endswith("expected below 0.")
    # 41 times lower is more than the data show.
    far = named_spec({"metric": "val/loss", "expect": "lower", "margin": 40.0})
    assert claims.evaluate_all(far, leak)[0].verdict == CONTRADICTED


def test_a_margin_the_to_side_leaves_no_room_for_is_unattainable():
    # The to side sits at 0.2 exact match: no compare side can lie 0.3 below it.
    low = degradation([0.01, 0.0, 0.02], [0, 0, 0], [0.19, 0.21, 0.2], [0, 0, 0])
    (result,) = claims.evaluate_all(named_spec({"metric": SHORT, "expect": "lower", "margin": 0.3}), low)
    assert result.verdict == UNATTAINABLE
    assert result.reason == "the to side's mean 0.2 lies within the margin 0.3 of the lower bound 0"
    high = degradation([0.99, 1.0, 0.98], [0, 0, 0], [0.8, 0.81, 0.79], [0, 0, 0])
    (result,) = claims.evaluate_all(named_spec({"metric": SHORT, "expect": "higher", "margin": 0.3}), high)
    assert result.verdict == UNATTAINABLE and "upper bound 1" in result.reason
    # With room for the margin the same claim is decided.
    room = degradation([0.01, 0.0, 0.02], [0, 0, 0], [0.5, 0.52, 0.51], [0, 0, 0])
    assert (
        claims.evaluate_all(named_spec({"metric": SHORT, "expect": "lower", "margin": 0.3}), room)[0].verdict
        == REPRODUCED
    )


EXACT = "test/seq_acc"


def exact_match(compare: list[float], to: list[float]) -> pd.DataFrame:
    return plain_attn(EXACT, compare, to)


def test_exact_match_is_never_decided_at_two_seeds_a_side():
    # One seed of a cell learns the rule (0.98), its sibling does not (0.24): at two seeds the interval
    # would rest on that split; two seeds that agree are no better evidence of the spread.
    claim = {"metric": EXACT, "expect": "lower", "margin": 0.02}
    for compare in ([0.24, 0.98], [0.86, 0.88]):
        (result,) = claims.evaluate_all(named_spec(claim, seeds=(0, 1)), exact_match(compare, [0.99, 0.99]))
        assert result.verdict == INCONCLUSIVE
        assert result.reason == f"a variant has 2 completed seed(s) of {EXACT}; a verdict needs 3"
    (result,) = claims.evaluate_all(named_spec(claim), exact_match([0.86, 0.88, 0.87], [0.99, 0.99, 0.98]))
    assert result.verdict == REPRODUCED
    # Token accuracy is decided at two seeds as before.
    tokens = named_spec({**claim, "metric": SHORT}, seeds=(0, 1))
    df = degradation([0.86, 0.88], [0, 0], [0.99, 0.99], [0, 0])
    assert claims.evaluate_all(tokens, df)[0].verdict == REPRODUCED


def test_an_exact_match_claim_waits_for_the_look_with_three_seeds():
    spec = StudySpec.model_validate({
        "name": "s", "seeds": {"min": 2, "max": 4},
        "variants": {"plain": {"preset": "lstm"}, "attn": {"preset": "lstm-bahdanau"}},
        "claims": [{"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"},
                    "metric": EXACT, "expect": "lower", "margin": 0.02}],
    })  # fmt: skip
    (result,) = claims.evaluate_all(spec, exact_match([0.86, 0.88], [0.99, 0.99]))
    assert (result.look, result.decided, result.budget_spent) == (0, False, False)
    assert claims.seeds_wanted(spec, [result]) == {"plain": 3, "attn": 3}
    (result,) = claims.evaluate_all(spec, exact_match([0.86, 0.88, 0.87], [0.99, 0.99, 0.98]))
    assert (result.verdict, result.look, result.decided) == (REPRODUCED, 1, True)


# The rules below each close one way a claim could be judged on what it cannot see: a study built to hit
# exactly that hole, and the verdict it gets.


def test_an_interaction_whose_to_side_falls_from_top_to_bottom_is_unattainable():
    # With attention, token accuracy itself falls from ~1 to ~0: without attention it cannot fall 0.05 more.
    # The CI alone (-0.031 to 0.045) would contradict the claim; the bound, not the data, rules it out.
    df = degradation([1.0, 0.99, 1.0], [0.0, 0.01, 0.02], [1.0, 1.0, 0.99], [0.01, 0.0, 0.0])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "lower", "margin": 0.05}), df)
    assert claims.verdict(result.ci_low, result.ci_high, "lower", 0.05) == CONTRADICTED
    assert result.verdict == UNATTAINABLE
    assert result.reason == "the to side's change -0.993 lies within the margin 0.05 of the lower bound -1"
    # With room below the to side's change, the same claim is judged by its CI.
    room = degradation([1.0, 0.99, 1.0], [0.0, 0.01, 0.02], [1.0, 1.0, 0.99], [0.71, 0.7, 0.7])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "lower", "margin": 0.05}), room)
    assert result.verdict == REPRODUCED


def test_a_similar_interaction_whose_cells_all_sit_at_a_bound_is_uninformative():
    # Every cell within 0.01 of 1: neither difference can move, so the two agree whatever the factor does.
    df = degradation([1.0, 0.99, 1.0], [0.99, 1.0, 1.0], [1.0, 1.0, 0.99], [1.0, 0.99, 1.0])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "similar", "margin": 0.05}), df)
    assert claims.verdict(result.ci_low, result.ci_high, "similar", 0.05) == REPRODUCED
    assert result.verdict == CEILING
    assert result.reason == (
        "in each difference both means lie within half the margin 0.05 of a bound "
        f"({LONG}: upper 1; {SHORT}: upper 1): neither difference can move"
    )
    # One difference off the bound can move: the claim is judged by its CI (which agrees; no control).
    off = degradation([0.6, 0.61, 0.6], [0.6, 0.6, 0.61], [1.0, 1.0, 0.99], [1.0, 0.99, 1.0])
    (result,) = claims.evaluate_all(named_spec({**INTERACTION, "expect": "similar", "margin": 0.05}), off)
    assert result.verdict == claims.UNCONTROLLED


PPL = "test/ppl"


def test_a_perplexity_near_its_bound_of_1_is_a_floor_on_the_ratio_scale():
    # Both perplexities within 1.05 of 1: their ratio cannot leave [1/1.05, 1.05] whatever the models do.
    near_one = plain_attn(PPL, [1.01, 1.02, 1.03], [1.02, 1.01, 1.02])
    (result,) = claims.evaluate_all(
        named_spec({"metric": PPL, "expect": "similar", "margin": 0.05}), near_one
    )
    assert result.verdict == FLOOR
    assert result.reason == (
        "both means lie within the margin ratio 1.05 (log 0.0488) of the lower bound 1: neither side can move"
    )
    # A to side at 1.02 leaves no room for a compare side 1.05 times lower.
    lower = named_spec({"metric": PPL, "expect": "lower", "margin": 0.05})
    assert claims.evaluate_all(lower, near_one)[0].verdict == UNATTAINABLE
    # A loss's bound 0 has no log: a ratio of two small losses can be anything, so no floor.
    small = plain_attn("test/loss", [0.010, 0.011, 0.012], [0.011, 0.010, 0.012])
    loss = named_spec({"metric": "test/loss", "expect": "similar", "margin": 0.5})
    assert claims.evaluate_all(loss, small)[0].verdict == claims.UNCONTROLLED  # judged by its CI, no control


def test_the_exact_match_floor_counts_seeds_of_each_variant_not_values_of_a_side():
    # Two variants of two seeds each pool four values on the compare side; neither has three seeds.
    spec = StudySpec.model_validate({
        "name": "s", "seeds": [0, 1, 2],
        "variants": {"small": {"preset": "lstm", "model.d_model": 32}, "wide": {"preset": "lstm", "model.d_model": 64},
                     "attn": {"preset": "lstm-bahdanau"}},
        "claims": [{"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"}, "metric": EXACT,
                    "expect": "lower", "margin": 0.3}],
    })  # fmt: skip
    df = trials({("small", 0): {EXACT: 0.2}, ("small", 1): {EXACT: 0.25}, ("wide", 0): {EXACT: 0.22},
                 ("wide", 1): {EXACT: 0.21}} | {("attn", s): {EXACT: x} for s, x in enumerate([0.95, 0.96, 0.97])})  # fmt: skip
    (result,) = claims.evaluate_all(spec, df)
    assert (result.n_compare, result.n_to) == (4, 3)
    assert result.verdict == INCONCLUSIVE
    assert result.reason == f"a variant has 2 completed seed(s) of {EXACT}; a verdict needs 3"
    # A third seed still running: pending, not inconclusive.
    running = pd.concat([df, pd.DataFrame([{"trial": 9, "variant": "small", "seed": 2, "state": "RUNNING"}])])
    assert claims.evaluate_all(spec, running)[0].verdict == PENDING
    third = trials({("small", 2): {EXACT: 0.23}, ("wide", 2): {EXACT: 0.2}})
    assert claims.evaluate_all(spec, pd.concat([df, third.assign(trial=[7, 8])]))[0].verdict == REPRODUCED


def test_not_worse_is_tested_as_non_inferiority_not_superiority():
    # Δ -0.01 with a CI around 0: "at least as good" holds within a margin of 0.05; as superiority it did not.
    level = degradation([0.80, 0.81, 0.79], [0, 0, 0], [0.81, 0.80, 0.82], [0, 0, 0])
    as_good = {"metric": SHORT, "expect": "not_worse", "margin": 0.05}
    (result,) = claims.evaluate_all(named_spec(as_good), level)
    # Non-inferior by its CI; without a positive control that is all it can say.
    assert result.ci_low < 0 < result.ci_high and result.verdict == claims.UNCONTROLLED
    assert result.expected == "above -0.05" and result.reason.startswith("CI of compare - to [")
    assert result.reason.endswith(
        "lies above -0.05; no positive control: whether the metric could tell the sides apart is not tested"
    )
    superior = named_spec({**as_good, "expect": "higher", "margin": 0.0})
    assert claims.evaluate_all(superior, level)[0].verdict == INCONCLUSIVE
    worse = degradation([0.60, 0.61, 0.59], [0, 0, 0], [0.81, 0.80, 0.82], [0, 0, 0])
    assert claims.evaluate_all(named_spec(as_good), worse)[0].verdict == CONTRADICTED
    # Where lower is better (AER), not worse means Δ below the margin.
    aer = plain_attn("test/aer", [0.31, 0.30, 0.32], [0.30, 0.29, 0.31])
    (result,) = claims.evaluate_all(named_spec({**as_good, "metric": "test/aer"}), aer)
    assert result.expected == "below 0.05" and result.verdict == claims.UNCONTROLLED
    worse = plain_attn("test/aer", [0.41, 0.40, 0.42], [0.30, 0.29, 0.31])
    assert (
        claims.evaluate_all(named_spec({**as_good, "metric": "test/aer"}), worse)[0].verdict == CONTRADICTED
    )


def test_not_worse_against_a_side_at_the_worse_bound_cannot_fail():
    # The to side sits at 0.02: no compare side can be 0.05 below it, so the claim holds whatever compare does.
    floor = degradation([0.0, 0.01, 0.0], [0, 0, 0], [0.02, 0.01, 0.03], [0, 0, 0])
    (result,) = claims.evaluate_all(
        named_spec({"metric": SHORT, "expect": "not_worse", "margin": 0.05}), floor
    )
    assert result.verdict == FLOOR
    assert result.reason == (
        "the to side's mean 0.02 lies within the margin 0.05 of the lower bound 0: "
        "no compare side can be worse by more than the margin"
    )


def control_spec(control: bool = True, seeds: list[int] | dict | None = None) -> StudySpec:
    """Sorting judged the same with and without positions, reversal (which needs order) as the control."""
    claim = {"text": "sort needs no positions", "compare": {"model.pos_encoding": "none", "task.name": "sort"},
             "to": {"model.pos_encoding": "sinusoidal", "task.name": "sort"}, "expect": "similar", "margin": 0.05}  # fmt: skip
    if control:
        claim["control"] = {"compare": {"model.pos_encoding": "none", "task.name": "reverse"},
                            "to": {"model.pos_encoding": "sinusoidal", "task.name": "reverse"}}  # fmt: skip
    return StudySpec.model_validate({
        "name": "s", "seeds": seeds or [0, 1, 2], "metric": {"name": EXACT},
        "factors": {"model.pos_encoding": ["none", "sinusoidal"], "task.name": ["reverse", "sort"]},
        "claims": [claim],
    })  # fmt: skip


def sorting(reverse_none: list[float], reverse_sinusoidal: list[float]) -> pd.DataFrame:
    cells = {"pos_encoding=none,name=sort": [0.90, 0.91, 0.92], "pos_encoding=sinusoidal,name=sort": [0.91, 0.90, 0.92],
             "pos_encoding=none,name=reverse": reverse_none, "pos_encoding=sinusoidal,name=reverse": reverse_sinusoidal}  # fmt: skip
    return trials({(v, s): {EXACT: x} for v, xs in cells.items() for s, x in enumerate(xs)})


def test_agreement_stands_only_where_a_positive_control_moves_the_metric_beyond_the_margin():
    # Reversal without positions fails: the metric moves, and sorting's agreement is informative.
    (result,) = claims.evaluate_all(control_spec(), sorting([0.0, 0.01, 0.0], [0.85, 0.86, 0.84]))
    assert result.verdict == REPRODUCED and result.control.verdict == CONTRADICTED
    assert result.reason.endswith(
        "; the control (model.pos_encoding=none, task.name=reverse against model.pos_encoding=sinusoidal, "
        f"task.name=reverse): {result.control.reason}, so the metric moves by the margin"
    )
    # Reversal without positions does as well as with them: the metric (or the training) does not register
    # positions at all, and agreement on sorting says nothing.
    (result,) = claims.evaluate_all(control_spec(), sorting([0.90, 0.91, 0.90], [0.91, 0.90, 0.91]))
    assert result.verdict == INSENSITIVE and result.control.verdict == REPRODUCED
    assert result.reason.endswith(
        "the metric does not move by the margin even where a difference is designed in"
    )
    # A control whose CI straddles the margin decides nothing yet: inconclusive, and more seeds are wanted
    # for the control's variants too.
    undecided = sorting([0.75, 0.90, 0.84], [0.88, 0.90, 0.86])
    (result,) = claims.evaluate_all(control_spec(), undecided)
    assert result.verdict == INCONCLUSIVE and result.control.verdict == INCONCLUSIVE
    assert result.reason.startswith("the sides agree, but the control (")
    adaptive = control_spec(seeds={"min": 3, "max": 6, "step": 3})
    (result,) = claims.evaluate_all(adaptive, undecided)
    assert claims.seeds_wanted(adaptive, [result]) == {v: 6 for v in adaptive.variant_overrides()}
    # The same data without a control: the sides agree, but nothing shows the metric could tell them apart.
    (result,) = claims.evaluate_all(control_spec(control=False), undecided)
    assert result.verdict == claims.UNCONTROLLED and result.reason.endswith("is not tested")


def test_a_control_still_running_leaves_its_claim_pending():
    df = sorting([0.0, 0.01, 0.0], [0.85, 0.86, 0.84])
    df = df[~((df["variant"] == "pos_encoding=none,name=reverse") & (df["seed"] > 0))]
    running = pd.DataFrame([{"trial": 20 + s, "variant": "pos_encoding=none,name=reverse", "seed": s,
                             "state": "RUNNING"} for s in (1, 2)])  # fmt: skip
    (result,) = claims.evaluate_all(control_spec(), pd.concat([df, running]))
    assert result.verdict == PENDING and result.control.verdict == PENDING


def test_failed_seeds_do_not_decide_a_claim_and_are_counted_per_side():
    # The general score trains in six seeds of ten, as well as dot; its four failed seeds alone make it
    # "worse" on the mean of all ten.
    general = [0.80, 0.0, 0.82, 0.01, 0.81, 0.79, 0.0, 0.83, 0.02, 0.80]
    dot = [0.80, 0.81, 0.82, 0.80, 0.81, 0.79, 0.82, 0.81, 0.80, 0.83]
    df = plain_attn(SHORT, general, dot)
    claim = {"metric": SHORT, "expect": "lower", "chance": 0.05}
    assert (
        claims.evaluate_all(named_spec({**claim, "chance": None}, seeds=range(10)), df)[0].verdict
        == REPRODUCED
    )
    (result,) = claims.evaluate_all(named_spec(claim, seeds=range(10)), df)
    assert result.verdict == INCONCLUSIVE and (result.n_compare, result.n_to) == (6, 10)
    assert result.failed == [("compare", 4, 10), ("to", 0, 10)]
    assert result.reason.endswith(
        "; failed seeds (at or below chance 0.05), left out: compare 4 of 10, to 0 of 10"
    )
    # A variant left with fewer trained seeds than a verdict needs is inconclusive, and says why.
    few = plain_attn(SHORT, [0.80, 0.0, 0.01], [0.80, 0.81, 0.82])
    (result,) = claims.evaluate_all(named_spec(claim), few)
    assert result.verdict == INCONCLUSIVE
    assert result.reason == (
        f"a variant has 1 trained seed(s) of {SHORT}; a verdict needs 2; "
        "failed seeds (at or below chance 0.05), left out: compare 2 of 3, to 0 of 3"
    )
    # Where lower is better a failed seed is at or above chance.
    loss = plain_attn("val/loss", [0.1, 2.5, 0.12, 0.11], [0.5, 0.52, 0.51, 0.5])
    (result,) = claims.evaluate_all(named_spec({"metric": "val/loss", "expect": "lower", "chance": 2.0},
                                               seeds=range(4)), loss)  # fmt: skip
    assert result.verdict == REPRODUCED and result.failed == [("compare", 1, 4), ("to", 0, 4)]
    assert "failed seeds (at or above chance 2)" in result.reason


def test_a_seed_that_failed_in_one_cell_leaves_every_cell_of_a_paired_interaction():
    grid = {**GRID, ("d_model=256,scale=none", 2): 0.02, ("d_model=256,scale=sqrt", 2): 0.82,
            ("d_model=16,scale=none", 2): 0.29, ("d_model=16,scale=sqrt", 2): 0.0}  # fmt: skip
    df = trials({key: {GRID_METRIC: x} for key, x in grid.items()})
    (result,) = claims.evaluate_all(grid_spec({"chance": 0.005}, seeds=(0, 1, 2)), df)
    # Seed 2 of d_model=16,scale=sqrt failed: seeds 0 and 1 are compared in all four cells, still paired.
    contrast = np.array([(0.01 - 0.80) - (0.30 - 0.70), (0.03 - 0.84) - (0.28 - 0.74)])
    assert result.paired_by_seed and result.diff == pytest.approx(contrast.mean())
    assert result.failed == [("compare", 0, 3), ("to", 0, 3), ("compare'", 0, 3), ("to'", 1, 3)]
    assert result.reason.endswith(
        "failed seeds (at or below chance 0.005), left out: compare 0 of 3, to 0 of 3, compare' 0 of 3, to' 1 of 3; "
        "a seed failed in one cell is left out of all four"
    )


def test_claim_kinds_and_controls_in_the_schema():
    claim = {"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"}, "expect": "lower"}
    assert named_spec({"expect": "lower"}).claims[0].kind == "test"
    assert named_spec({"expect": "lower", "kind": "check"}).claims[0].kind == "check"
    with pytest.raises(ValueError, match="kind"):
        named_spec({"expect": "lower", "kind": "demo"})
    control = {"compare": {"preset": "lstm"}, "to": {"preset": "lstm-bahdanau"}}
    with pytest.raises(ValueError, match="control: only a similar or not_worse claim takes one"):
        StudySpec.model_validate({"name": "n", "claims": [{**claim, "control": control}]})
    with pytest.raises(ValueError, match="an interaction takes none"):
        named_spec({"expect": "similar", "metric": SHORT, "versus": {"metric": LONG}, "control": control})
    spec = named_spec({"expect": "similar", "control": control})
    results = claims.evaluate_all(spec, degradation([0.9] * 3, [0] * 3, [0.9] * 3, [0] * 3))
    assert claims.by_kind(results) == (results, [])
