"""Paired significance over test sentences, for text tasks: sacreBLEU's paired bootstrap resampling
(Koehn 2004) of corpus BLEU, each variant against the baseline on the sentences both translated.

Seeds are paired: a variant's seed s is compared with the baseline's seed s, on a split whose references
are the same for both (the same sentences in the same order). Each seed pair gets its own test, and the
matched seeds' translations pooled (each system's hypotheses of every matched seed, one after the other,
against the references repeated) get one test. The seed-by-seed tests show whether one seed drives the
pooled result; the pooled test resamples sentences only, so it speaks of these trained models, not of
what another seed would train: the per-variant CIs over seeds are what generalise over training runs."""

from __future__ import annotations

from typing import Any

import pandas as pd
from sacrebleu.significance import PairedTest

from ablate.analysis.table import latest_trials
from ablate.harness.metrics import bleu_metric

RESAMPLES = 1000  # sacreBLEU's default for its paired bootstrap


def paired_bootstrap(baseline: list[str], system: list[str], references: list[str]) -> dict[str, Any]:
    """{bleu_baseline, bleu, p, signature}: sacreBLEU's paired bootstrap test of `system` against
    `baseline`, two-sided, with RESAMPLES resamples (seeded by SACREBLEU_SEED, 12345 by default). Two
    identical outputs get p = 1: sacreBLEU counts only resampled differences strictly above the observed
    one, so it gives them its smallest p, 1 / (RESAMPLES + 1)."""
    test = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": bleu_metric()}, [references],
                      test_type="bs", n_samples=RESAMPLES)  # fmt: skip
    signatures, scores = test()
    base, other = scores["BLEU"]
    p = 1.0 if list(system) == list(baseline) else other.p_value
    return {"bleu_baseline": base.score, "bleu": other.score, "p": p, "signature": str(signatures["BLEU"])}


def _by_seed(split_rows: pd.DataFrame, variant: str) -> dict[Any, pd.DataFrame]:
    """The variant's translations of one split by seed, of each seed's latest trial (a retried grid point
    counts once, as in every other table of the report)."""
    latest = latest_trials(split_rows[split_rows["variant"] == variant])
    return {seed: rows for seed, rows in latest.groupby("seed")}


def _test(base: dict[Any, pd.DataFrame], own: dict[Any, pd.DataFrame], seeds: list) -> dict[str, Any]:
    """paired_bootstrap on the seeds' translations, one seed's after the other's."""

    def pooled(frames: dict[Any, pd.DataFrame], column: str) -> list[str]:
        return [text for seed in seeds for text in frames[seed][column].tolist()]

    return paired_bootstrap(pooled(base, "hyp"), pooled(own, "hyp"), pooled(own, "ref"))


def paired_tests(translations: pd.DataFrame, order: list[str], baseline: str) -> list[dict[str, Any]]:
    """One row per variant other than the baseline and test split: {variant, split, seeds, sentences (per
    seed), bleu_baseline, bleu, diff, p (pooled seeds), p_seeds (per seed pair, in seed order),
    signature}; none where the two share no seed with the same references."""
    if translations.empty:
        return []
    splits = {split: rows for split, rows in translations.groupby("split", sort=False)}
    bases = {split: _by_seed(rows, baseline) for split, rows in splits.items()}
    rows = []
    for variant in [v for v in order if v != baseline]:
        for split, base in bases.items():
            own = _by_seed(splits[split], variant)
            seeds = [
                s for s in sorted(own) if s in base and base[s]["ref"].tolist() == own[s]["ref"].tolist()
            ]
            if not seeds:
                continue
            per_seed = [_test(base, own, [seed]) for seed in seeds]
            pooled = per_seed[0] if len(seeds) == 1 else _test(base, own, seeds)  # one seed: the same test
            rows.append({"variant": variant, "split": split, "seeds": seeds, "sentences": len(own[seeds[0]]),
                         **pooled, "diff": pooled["bleu"] - pooled["bleu_baseline"],
                         "p_seeds": [r["p"] for r in per_seed]})  # fmt: skip
    return rows
