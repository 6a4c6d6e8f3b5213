"""The metric registry is what every reader of a metric name reads: a metric added to it in a test gets its
range in the tables and figures, its direction in the claims' verdicts, its scale in the claims' words, and
its splits in what a configuration produces and tuning reads."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch

from ablate.analysis import claims, stats
from ablate.harness.metrics import produced_metrics
from ablate.reports import headline, plots
from ablate.reports.collect import collect
from ablate.reports.render import build_report
from ablate.schema.config import build_config
from ablate.schema.metric_registry import METRICS, PROPORTION, Metric, metric_info
from ablate.schema.spec import MetricSpec, StudySpec, validation_metric

NEW = "edit_rate"  # a metric no trial reports until a test registers it


def test_a_split_qualified_name_reads_its_metrics_entry():
    assert metric_info("test_long/seq_acc") is metric_info("seq_acc") is METRICS["seq_acc"]
    assert metric_info("val/loss").scale == "ratio" and metric_info("test/aer").direction == "minimize"
    assert metric_info(f"test/{NEW}") == Metric(NEW)  # outside the registry: unbounded, maximized, no trial


def test_produced_and_tuned_metrics_follow_where_a_metric_is_computed(monkeypatch):
    transformer, lstm = build_config({"preset": "transformer"}), build_config({"preset": "lstm"})

    def splits(cfg, name: str) -> set[str]:
        return {m.split("/")[0] for m in produced_metrics(cfg) if m.endswith(f"/{name}")}

    tested = Metric(NEW, PROPORTION, computed_by="evaluation", reported_for="Transformers")
    monkeypatch.setitem(METRICS, NEW, tested)
    assert splits(transformer, NEW) == splits(transformer, "seq_acc") - {"val"} and splits(lstm, NEW) == set()
    assert validation_metric(MetricSpec(name=f"test/{NEW}")).name == "val/loss"  # not logged on val
    # Logged by the module: at every validation too, so tuning reads it on val.
    logged = Metric(NEW, PROPORTION, computed_by="module", reported_for="every trial")
    monkeypatch.setitem(METRICS, NEW, logged)
    assert splits(lstm, NEW) == splits(lstm, "seq_acc") and "val" in splits(lstm, NEW)
    assert validation_metric(MetricSpec(name=f"test/{NEW}", direction="minimize")) == MetricSpec(
        name=f"val/{NEW}", direction="minimize"
    )
    # Measured before the first step: on the split "init" alone, never on val or a test split.
    monkeypatch.setitem(METRICS, NEW, Metric(NEW, computed_by="initialisation", reported_for="Transformers"))
    assert splits(transformer, NEW) == {"init"} and splits(lstm, NEW) == set()
    assert validation_metric(MetricSpec(name=f"init/{NEW}")).name == "val/loss"


def test_the_metrics_at_initialisation_are_what_a_transformer_trial_reports():
    initial = {m for m in produced_metrics(build_config({"preset": "transformer"})) if m.startswith("init/")}
    assert initial == {"init/grad_last", "init/grad_growth", "init/attn_entropy"}
    no_ffn = build_config({"preset": "transformer", "model": {"ffn": False}})
    assert {m for m in produced_metrics(no_ffn) if m.startswith("init/")} == {"init/attn_entropy"}
    silent = build_config({"preset": "transformer", "model": {"cross_attention": False,
                                                              "decoder_self_attention": False}})  # fmt: skip
    gradients = {"init/grad_last", "init/grad_growth"}  # no attention: no entropy
    assert {m for m in produced_metrics(silent) if m.startswith("init/")} == gradients


def test_the_metrics_at_initialisation_read_the_first_training_batch_cut_to_a_bounded_size(monkeypatch):
    from ablate.harness import trial

    cfg = build_config({"preset": "transformer", "model": {"d_model": 16, "heads": 2, "layers": 1, "d_ff": 16},
                        "task": {"n_train": 64, "n_valid": 8, "n_test": 8}, "train": {"batch_size": 32}})  # fmt: skip
    seen = []
    monkeypatch.setattr(trial, "at_initialisation", lambda model, batch, smoothing: seen.append(batch) or {})
    trial.Prepared.of(cfg)
    (whole,) = seen
    assert len(whole["src"]) == 32  # the batch the first step trains on, as the sampler draws it
    monkeypatch.setattr(trial, "INITIAL_POSITIONS", 1)  # fewer positions than one example: that example
    trial.Prepared.of(cfg)
    assert len(seen[1]["src"]) == 1
    monkeypatch.setattr(trial, "INITIAL_POSITIONS", 5 * (whole["src"].size(1) + whole["tgt_in"].size(1) + 1))
    trial.Prepared.of(cfg)
    cut = seen[2]["src"]
    assert 5 <= len(cut) < 32 and torch.equal(cut, whole["src"][: len(cut), : cut.size(1)])


def two_variants(values: dict[str, list[float]], metric: str) -> pd.DataFrame:
    rows = [{"variant": v, "seed": s, "state": "COMPLETE", metric: x} for v, xs in values.items()
            for s, x in enumerate(xs)]  # fmt: skip
    return pd.DataFrame(rows).assign(trial=range(len(rows)))


def claim_on(metric: str, **claim) -> StudySpec:
    return StudySpec.model_validate({
        "name": "s", "seeds": [0, 1, 2],
        "variants": {"new": {"preset": "transformer"}, "old": {"preset": "lstm"}},
        "claims": [{"text": "t", "compare": {"preset": "transformer"}, "to": {"preset": "lstm"},
                    "metric": metric, "expect": "lower", **claim}],
    })  # fmt: skip


def test_the_scale_names_the_effect_in_the_claims_reason_and_the_headline(monkeypatch):
    metric = f"test/{NEW}"
    new, old = [2.0, 2.2, 2.1], [4.0, 4.1, 4.3]
    spec, df = claim_on(metric, margin=0.5), two_variants({"new": new, "old": old}, metric)
    difference = claims.evaluate_all(spec, df)[0]
    assert difference.reason.startswith("CI of compare - to [")
    assert headline.claim_line(difference)["numbers"].startswith(f"Δ = {difference.diff:.3f}, 95% CI")
    monkeypatch.setitem(METRICS, NEW, Metric(NEW, scale="ratio"))
    ratio = claims.evaluate_all(spec, df)[0]
    assert ratio.diff == pytest.approx(np.mean(np.log(new)) - np.mean(np.log(old)))
    assert ratio.reason.startswith("CI of log(compare / to) [")
    assert ratio.margin_text == "ratio 1.5 (log 0.405)"
    assert headline.claim_line(ratio)["numbers"].startswith(f"log(compare / to) = {ratio.diff:.3f}, 95% CI")
    assert headline.claim_line(ratio)["numbers"].endswith("(a ratio of 1.5).")


def test_exact_match_needs_three_seeds_a_side(monkeypatch):
    metric = f"test/{NEW}"
    spec, df = claim_on(metric, margin=0.1), two_variants({"new": [0.1, 0.12], "old": [0.9, 0.92]}, metric)
    assert claims.evaluate_all(spec, df)[0].verdict == claims.REPRODUCED
    monkeypatch.setitem(METRICS, NEW, Metric(NEW, PROPORTION, exact_match=True))
    assert "a verdict needs 3" in claims.evaluate_all(spec, df)[0].reason


def test_a_metric_added_to_the_registry_sets_the_reports_intervals_axis_and_verdicts(tmp_path, monkeypatch):
    import test_reports  # its constructed study on the new metric: 0.85 with positions, 0.15 without

    metric = f"test/{NEW}"
    claim = {"text": "Positions cut edits", "compare": {"model.pos_encoding": "sinusoidal"},
             "to": {"model.pos_encoding": "none"}, "expect": "lower", "margin": 0.1,
             "chance": 0.5}  # fmt: skip
    variants = {"positions": {"model.pos_encoding": "sinusoidal"}, "none": {"model.pos_encoding": "none"}}
    keys = {"metric": {"name": metric, "direction": "minimize"}, "claims": [claim]}
    spec, storage, runs = test_reports.synthetic_study(tmp_path, variants=variants, keys=keys)
    df = collect(spec, storage, runs).trials
    values = stats.variant_values(df, metric)
    # Outside the registry: t-intervals, and higher is better: the side at 0.15 learnt nothing.
    (before,) = claims.evaluate_all(spec, df)
    assert before.verdict == claims.UNLEARNT and before.reason.startswith("to (none)")
    assert stats.summarize(df, metric, ["positions", "none"], "positions").loc[0, "ci_high"] == pytest.approx(
        stats.mean_ci(values["positions"])[1]
    )

    monkeypatch.setitem(METRICS, NEW, Metric(NEW, PROPORTION, "minimize", computed_by="evaluation"))
    md = (build_report(spec, storage, runs) / "report.md").read_text()
    claim_row = next(line for line in md.splitlines() if line.startswith("| Positions cut edits"))
    assert f"**{claims.UNLEARNT}**" in claim_row and "compare (positions)" in claim_row  # lower is better
    results = md[md.index("## Results by variant") : md.index("## Claims")]
    for variant in ("positions", "none"):
        row = next(line for line in results.splitlines() if line.startswith(f"| {variant} |"))
        lo, hi = (float(x) for x in re.search(r"\[([-\d.]+), ([-\d.]+)\]", row).groups())
        assert (lo, hi) == pytest.approx(stats.mean_ci(values[variant], PROPORTION), abs=5e-4)  # Wilson's
    assert stats.mean_ci(values["positions"], PROPORTION) != pytest.approx(stats.mean_ci(values["positions"]))
    ax = plots.metric_by_variant(df, metric, ["positions", "none"]).axes[0]
    assert ax.get_ylim() == pytest.approx((-plots.RANGE_PAD, 1 + plots.RANGE_PAD))  # the whole range
    plots.plt.close("all")
