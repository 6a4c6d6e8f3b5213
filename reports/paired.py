"""Paired significance over test sentences, for text tasks: sacreBLEU's paired bootstrap resampling
(Koehn 2004) of corpus BLEU, each variant against the baseline on the sentences both translated.

A variant's seed s is paired with the baseline's seed s on a split with the same references. Each pair gets
sacreBLEU's own test (does one seed drive the result?), and the matched seeds one cluster bootstrap: each
resample draws sentences, each with every seed's translations of it, and compares seed-averaged BLEU.
Pooling the seeds' translations into one corpus would count one sentence as several (seeds that agree
repeat each other) and understate p. Both resample sentences only, so they speak of these trained models;
the per-variant CIs over seeds are what generalise over training runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from sacrebleu import BLEU

from ablate.analysis.table import latest_trials
from ablate.harness.metrics import bleu_metric

RESAMPLES = 1000  # sacreBLEU's default for its paired bootstrap


def _seed() -> int | None:
    """The seed sacreBLEU's PairedTest draws its resamples with: SACREBLEU_SEED, 12345 by default; 'none'
    draws from the OS, and PairedTest passes 0 on as none too."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return None if seed.lower() == "none" else int(seed) or None


def signature(metric: BLEU, resamples: int) -> str:
    """The signature sacreBLEU's PairedTest gives its bootstrap: the metric's, with the seed and resamples."""
    sig = metric.get_signature()
    sig.update("seed", str(_seed()).lower())
    sig.update("bs", resamples)
    return str(sig)


def draws(sentences: int) -> np.ndarray:
    """(RESAMPLES, sentences) sentence indices drawn with replacement, as sacreBLEU's PairedTest draws
    them, so that a test of one seed pair resamples exactly what sacreBLEU's own would."""
    return np.random.default_rng(_seed()).choice(sentences, size=(RESAMPLES, sentences), replace=True)


def sentence_stats(metric: BLEU, hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """(sentences, 2 + 2 * order) integers: each sentence's BLEU sufficient statistics in sacreBLEU's order
    (hyp length, ref length, matched n-grams, hyp n-grams), summing to corpus BLEU's. From each sentence's own
    corpus score: public, where sentence_score warns every sentence and PairedTest reads a private method."""
    scores = [metric.corpus_score([hyp], [[ref]]) for hyp, ref in zip(hypotheses, references, strict=True)]
    return np.array([[s.sys_len, s.ref_len, *s.counts, *s.totals] for s in scores], dtype=np.int64)


def _bleu(metric: BLEU, stats: Sequence) -> float:
    """Corpus BLEU from summed sufficient statistics, by sacreBLEU's own formula and settings."""
    order = metric.max_ngram_order
    return metric.compute_bleu(
        correct=stats[2 : 2 + order], total=stats[2 + order :], sys_len=int(stats[0]), ref_len=int(stats[1]),
        smooth_method=metric.smooth_method, smooth_value=metric.smooth_value,
        effective_order=metric.effective_order, max_ngram_order=order,
    ).score  # fmt: skip


def _mean_bleu(metric: BLEU, seeds: list[np.ndarray], drawn: list[np.ndarray]) -> np.ndarray:
    """Per resample, each seed's corpus BLEU over its drawn sentences (drawn[k] the (resamples, sentences)
    indices of seed k), averaged over seeds. float32 sums, as sacreBLEU's own test adds them, so that one
    seed's p is sacreBLEU's to the resample."""
    sums = [stats.astype(np.float32)[d].sum(axis=1) for stats, d in zip(seeds, drawn, strict=True)]
    return np.mean([[_bleu(metric, row) for row in seed] for seed in sums], axis=0)  # sums: (resamples, stats)


def cluster_bootstrap(
    metric: BLEU, baseline: list[np.ndarray], system: list[np.ndarray], drawn: np.ndarray | list[np.ndarray]
) -> dict[str, float]:
    """{bleu_baseline, bleu, p}: the paired bootstrap of `system` against `baseline`, given per seed (paired
    by position) as sentence_stats. `drawn`: the resamples' sentence indices, one array for seeds that share
    their sentences, or one per seed where a task draws its data per seed. BLEU is averaged over seeds; p is
    sacreBLEU's two-sided p (the share of resamples whose absolute difference, centred on its mean, exceeds
    the observed one; one added to both counts), so one seed is sacreBLEU's test. Outputs BLEU cannot tell
    apart get p = 1, where sacreBLEU's strict count gives its smallest p, 1 / (resamples + 1)."""
    drawn = [drawn] * len(baseline) if isinstance(drawn, np.ndarray) else drawn
    bleu_baseline, bleu = (float(np.mean([_bleu(metric, s.sum(axis=0).tolist()) for s in side]))
                           for side in (baseline, system))  # fmt: skip
    if all(np.array_equal(b, s) for b, s in zip(baseline, system, strict=True)):
        return {"bleu_baseline": bleu_baseline, "bleu": bleu, "p": 1.0}
    resampled = np.abs(_mean_bleu(metric, system, drawn) - _mean_bleu(metric, baseline, drawn))
    exceeding = np.sum(resampled - resampled.mean() > abs(bleu - bleu_baseline))
    return {"bleu_baseline": bleu_baseline, "bleu": bleu, "p": float((exceeding + 1) / (len(drawn[0]) + 1))}


def _by_seed(split_rows: pd.DataFrame, variant: str) -> dict[Any, pd.DataFrame]:
    """The variant's translations of one split by seed, of each seed's latest trial (a retried grid point
    counts once, as in every other table of the report)."""
    latest = latest_trials(split_rows[split_rows["variant"] == variant])
    return {seed: rows for seed, rows in latest.groupby("seed")}


def paired_tests(translations: pd.DataFrame, order: list[str], baseline: str) -> list[dict[str, Any]]:
    """One row per non-baseline variant and test split: {variant, split, seeds, sentences (per seed),
    bleu_baseline, bleu (seed means of corpus BLEU), diff, p (the seeds together: cluster_bootstrap), p_seeds
    (per seed pair, in seed order), signature}; none where the two share no seed with the same references."""
    if translations.empty:
        return []
    metric = bleu_metric()
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
            # Each seed's own references: a task that draws its data per seed tests each seed on its own.
            references = {s: own[s]["ref"].tolist() for s in seeds}
            drawn = {s: draws(len(refs)) for s, refs in references.items()}
            # Each side's sentence statistics per seed, once for the per-seed tests and the joint one.
            stats = [[sentence_stats(metric, frames[s]["hyp"].tolist(), references[s]) for s in seeds]
                     for frames in (base, own)]  # fmt: skip
            per_seed = [cluster_bootstrap(metric, [b], [o], drawn[s]) for s, b, o in zip(seeds, *stats)]
            shared = all(refs == references[seeds[0]] for refs in references.values())
            joint = drawn[seeds[0]] if shared else [drawn[s] for s in seeds]
            together = per_seed[0] if len(seeds) == 1 else cluster_bootstrap(metric, *stats, joint)
            sizes = sorted({len(refs) for refs in references.values()})
            rows.append({"variant": variant, "split": split, "seeds": seeds,
                         "sentences": sizes[0] if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}",
                         **together, "diff": together["bleu"] - together["bleu_baseline"],
                         "p_seeds": [r["p"] for r in per_seed],
                         "signature": signature(metric, RESAMPLES)})  # fmt: skip
    return rows
