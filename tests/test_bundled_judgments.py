"""Every bundled study judged on a fixed table of made-up results: the variant table of its metric, the
headline and each claim's verdict, Δ, CI and wording, as recorded in data/bundled_judgments.json.

The file holds what the judging rules (analysis.stats, analysis.claims, reports.headline) gave when the
metric registry replaced their lists of metric names; a refactoring must leave every entry as it is. After a
deliberate change to the rules, write the file again from `judgments()` and read the difference."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ablate.analysis import claims, stats
from ablate.harness.study.validate import load_study
from ablate.reports import headline
from ablate.schema.spec import StudySpec, bundled_studies_dir

RECORDED = Path(__file__).parent / "data" / "bundled_judgments.json"
EXAMPLES = 200  # test examples a trial scored: bounded metrics' CIs keep at least this binomial width


def draw(name: str, level: float, rng: np.random.Generator, seeds: int) -> np.ndarray:
    """`seeds` values of the metric `name` (after its split) around a variant's `level` in [0, 1], each on
    the metric's own scale, written out here so that the table does not depend on the code under test."""
    noise = rng.normal(0.0, 0.08, seeds)
    if name in ("loss", "ppl"):
        loss = (0.05 + 2.5 * level) * np.exp(2 * noise)
        return np.exp(loss) if name == "ppl" else loss
    if name in ("bleu", "chrf"):
        return np.clip(100 * (0.02 + 0.4 * level + noise / 2), 0.0, 100.0)
    return np.clip(level + noise, 0.0, 1.0)  # exact match, token accuracy, AER, rank collapse


def made_up_trials(spec: StudySpec) -> pd.DataFrame:
    """Every variant at every seed of the study's last look, each metric of the study and its claims drawn
    around a level of its own per variant."""
    arms = [metric for claim in spec.claims for metric, _ in claim.arms(spec.metric.name)]
    metrics = list(dict.fromkeys([spec.metric.name, *arms]))
    seeds = spec.seed_pool[: spec.seed_looks[-1]]
    rng = np.random.default_rng(0)
    columns: dict[str, list[float]] = {}
    for _ in spec.variant_overrides():
        for metric in metrics:
            values = draw(metric.rsplit("/", 1)[-1], rng.uniform(), rng, len(seeds))
            columns.setdefault(metric, []).extend(values.tolist())
    rows = [{"variant": v, "seed": s, "state": "COMPLETE"} for v in spec.variant_overrides() for s in seeds]
    sizes = {f"examples/{split}": EXAMPLES for split in ("valid", "test", "test_long")}
    return pd.DataFrame(rows).assign(trial=range(len(rows)), **columns, **sizes)


def plain(x) -> float | str | None:
    """A cell as JSON holds it: NaN as null."""
    if isinstance(x, str):
        return x
    return None if x is None or not math.isfinite(float(x)) else float(x)


def judged(spec: StudySpec) -> dict:
    df = made_up_trials(spec)
    order, metric = list(spec.variant_overrides()), spec.metric.name
    summary = stats.summarize(df, metric, order, spec.baseline_variant(), spec.metric.direction)
    results = claims.evaluate_all(spec, df)
    data = SimpleNamespace(spec=spec, trials=df, configs={})
    table = ["variant", "n", "mean", "ci_low", "ci_high", "diff", "diff_ci_low", "diff_ci_high", "p",
             "p_holm", "p_perm", "g", "rank"]  # fmt: skip
    return {
        "summary": [{k: plain(row[k]) for k in table} for row in summary.to_dict("records")],
        "headline": headline.headline(data, summary, results),
        "claims": [
            {"verdict": r.verdict, "reason": r.reason, "expected": r.expected, "margin": r.margin_text,
             "decision": r.decision, "look": r.look, "n": [r.n_compare, r.n_to],
             **{k: plain(getattr(r, k)) for k in ("diff", "ci_low", "ci_high", "mean_compare", "mean_to")}}
            for r in results
        ],  # fmt: skip
    }


def bundled() -> dict[str, StudySpec]:
    """Each bundled study file, its default profile, checked without its data."""
    paths = sorted(bundled_studies_dir().glob("*.yaml"))
    return {path.stem: load_study(path, None, read_data=False) for path in paths}


def judgments() -> dict[str, dict]:
    return {name: judged(spec) for name, spec in bundled().items()}


def same(recorded, now, where: str = "") -> list[str]:
    """Where `now` differs from `recorded`: numbers to 1e-9 relative (another BLAS or SciPy may move the last
    digits), everything else exactly."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        if recorded.keys() != now.keys():
            return [f"{where}: keys {sorted(recorded)} != {sorted(now)}"]
        return [d for k in recorded for d in same(recorded[k], now[k], f"{where}[{k!r}]")]
    if isinstance(recorded, list) and isinstance(now, list):
        if len(recorded) != len(now):
            return [f"{where}: {len(recorded)} items != {len(now)}"]
        return [d for i, (a, b) in enumerate(zip(recorded, now)) for d in same(a, b, f"{where}[{i}]")]
    if isinstance(recorded, float) and isinstance(now, (int, float)):
        close = now == pytest.approx(recorded, rel=1e-9, abs=1e-12)
        return [] if close else [f"{where}: {recorded!r} != {now!r}"]
    return [] if recorded == now else [f"{where}: {recorded!r} != {now!r}"]


def test_every_bundled_study_judges_as_recorded():
    recorded = json.loads(RECORDED.read_text())
    now = json.loads(json.dumps(judgments()))  # as the file holds it: tuples as lists
    assert set(now) == set(recorded), "a bundled study was added or removed: write the file again"
    differences = same(recorded, now)
    assert not differences, "\n".join(differences[:20])


def test_the_check_sees_a_changed_number_and_word():
    recorded = {"a": [{"ci_low": 0.125, "verdict": "reproduced"}]}
    assert not same(recorded, {"a": [{"ci_low": 0.125 * (1 + 1e-12), "verdict": "reproduced"}]})
    moved = same(recorded, {"a": [{"ci_low": 0.126, "verdict": "reproduced"}]})
    assert moved == ["['a'][0]['ci_low']: 0.125 != 0.126"]
    assert same(recorded, {"a": [{"ci_low": 0.125, "verdict": "inconclusive"}]})
