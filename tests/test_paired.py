"""reports.paired: sacreBLEU's paired bootstrap between variants over test sentences, seeds paired, and its
cluster bootstrap of the seeds together."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ablate.harness.metrics import bleu_metric
from ablate.reports.paired import RESAMPLES, cluster_bootstrap, draws, paired_tests, sentence_stats, signature

REFERENCES = ["the cat sat on the mat", "a dog ran in the park", "it is raining today", "we sat on the mat",
              "birds sing in the early morning light", "the old man and the sea went out"]  # fmt: skip
BASELINE = ["the cat sat on a mat", "a dog ran in a park", "it rains today", "we sat on a mat",
            "birds sing in the morning light", "the old man and sea went out"]  # fmt: skip
SYSTEM = ["the cat is on the mat", "a dog ran in the park", "it is raining", "we sat on the mat",
          "birds sing in the early morning", "the old man and the sea went out"]  # fmt: skip


def paired_bootstrap(baseline, system, references, drawn=None) -> dict:
    """{bleu_baseline, bleu, p, signature}: cluster_bootstrap of `system` against `baseline`, each given as
    its seeds' translations of `references` (seed by seed, paired by position), resampled by `drawn` (by
    default, RESAMPLES draws seeded as sacreBLEU's): what paired_tests computes for one split."""
    metric = bleu_metric()
    drawn = draws(len(references)) if drawn is None else drawn
    base, own = ([sentence_stats(metric, hyps, references) for hyps in side] for side in (baseline, system))
    return {**cluster_bootstrap(metric, base, own, drawn), "signature": signature(metric, len(drawn))}


def test_paired_bootstrap_is_what_the_sacrebleu_command_reports(tmp_path):
    files = {}
    for name, lines in (("ref", REFERENCES), ("base", BASELINE), ("sys", SYSTEM)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i", str(files["base"]),
               str(files["sys"]),
               "--paired-bs", "--paired-bs-n", str(RESAMPLES), "-m", "bleu", "-f", "json"]  # fmt: skip
    base, system = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    result = paired_bootstrap([BASELINE], [SYSTEM], REFERENCES)  # one seed: sacreBLEU's own test
    assert result["bleu_baseline"] == pytest.approx(base["BLEU"]["score"])
    assert result["bleu"] == pytest.approx(system["BLEU"]["score"])
    assert result["p"] == pytest.approx(system["BLEU"]["p_value"])
    assert f"bs:{RESAMPLES}" in result["signature"] and "tok:13a" in result["signature"]
    assert paired_bootstrap([SYSTEM], [SYSTEM], REFERENCES)["p"] == 1.0  # itself: no evidence


def rows(
    trial: int, variant: str, seed: int, split: str, hypotheses: list[str], references=REFERENCES
) -> list:
    return [{"trial": trial, "variant": variant, "seed": seed, "split": split, "src_len": len(r.split()),
             "hyp": h, "ref": r} for h, r in zip(hypotheses, references)]  # fmt: skip


def test_paired_tests_pair_seeds_with_the_same_references_and_test_them_together():
    other = [r + " ." for r in REFERENCES]  # another test set: seed 2 of the variant cannot be paired
    translations = pd.DataFrame(
        rows(0, "attention", 0, "test", BASELINE) + rows(1, "attention", 1, "test", SYSTEM)
        + rows(2, "attention", 2, "test", BASELINE) + rows(3, "none", 0, "test", SYSTEM)
        + rows(4, "none", 1, "test", BASELINE) + rows(5, "none", 2, "test", SYSTEM, other)
        + rows(6, "none", 1, "test", SYSTEM)  # seed 1 again, retried: the later trial counts
        + rows(0, "attention", 0, "test_long", BASELINE) + rows(3, "none", 0, "test_long", SYSTEM)
    )  # fmt: skip
    [test, long] = paired_tests(translations, ["attention", "none"], baseline="attention")
    assert (test["variant"], test["split"], test["seeds"], test["sentences"]) == ("none", "test", [0, 1], 6)
    # The seeds together: baseline seeds 0 and 1 against the variant's, each sentence with both seeds.
    together = paired_bootstrap([BASELINE, SYSTEM], [SYSTEM, SYSTEM], REFERENCES)
    assert test["p"] == together["p"] and test["signature"] == together["signature"]
    corpus = [bleu_metric().corpus_score(hyps, [REFERENCES]).score for hyps in (BASELINE, SYSTEM)]
    assert (test["bleu_baseline"], test["bleu"]) == (pytest.approx(np.mean(corpus)), pytest.approx(corpus[1]))
    assert test["diff"] == pytest.approx(test["bleu"] - test["bleu_baseline"])
    assert test["p_seeds"] == [paired_bootstrap([BASELINE], [SYSTEM], REFERENCES)["p"], 1.0]
    assert (long["split"], long["seeds"]) == ("test_long", [0])
    assert paired_tests(translations, ["attention"], baseline="attention") == []
    assert paired_tests(pd.DataFrame(), ["attention", "none"], baseline="attention") == []


def test_seeds_with_test_sets_of_their_own_are_each_scored_on_their_own_references():
    """A task that draws its data per seed (the synthetic ones) gives each seed other test sentences: each
    seed's BLEU is its own corpus's, and the seeds together resample each seed's sentences among its own."""
    other = [r + " too" for r in REFERENCES]
    seed1 = [h + " too" for h in BASELINE]
    translations = pd.DataFrame(
        rows(0, "attention", 0, "test", BASELINE) + rows(1, "attention", 1, "test", seed1, other)
        + rows(2, "none", 0, "test", SYSTEM) + rows(3, "none", 1, "test", other, other)
    )  # fmt: skip
    (test,) = paired_tests(translations, ["attention", "none"], baseline="attention")
    bleu = bleu_metric()
    own = [bleu.corpus_score(BASELINE, [REFERENCES]).score, bleu.corpus_score(seed1, [other]).score]
    assert test["seeds"] == [0, 1] and test["bleu_baseline"] == pytest.approx(np.mean(own))
    assert test["bleu"] == pytest.approx(np.mean([bleu.corpus_score(SYSTEM, [REFERENCES]).score, 100.0]))
    assert test["p_seeds"][0] == paired_bootstrap([BASELINE], [SYSTEM], REFERENCES)["p"]
    assert test["p_seeds"][1] == paired_bootstrap([seed1], [other], other)["p"]


# Four-token sentences translated either exactly or with no word of the reference: a corpus's BLEU is then
# 100 times its share of exact translations (every n-gram precision is that share, lengths match), which a
# test can compute by hand.
SHORT = ["the cat sat down", "a dog ran off", "birds sing every morning"]
WRONG = "no words here match"


def exact_on(sentences: set[int], references: list[str]) -> list[str]:
    return [ref if i in sentences else WRONG for i, ref in enumerate(references)]


def test_cluster_bootstrap_draws_each_sentence_with_all_its_seeds_by_hand():
    baseline = [exact_on({0}, SHORT), exact_on({0, 1}, SHORT)]  # seeds 0 and 1: BLEU 100/3, 200/3
    system = [exact_on({0, 1, 2}, SHORT), exact_on({1}, SHORT)]  # 100, 100/3
    drawn = np.array([[0, 0, 2], [1, 1, 1], [2, 2, 0], [0, 1, 2]])
    result = paired_bootstrap(baseline, system, SHORT, drawn)
    # Observed: the mean over seeds of each seed's corpus BLEU, baseline 50, system 200/3: |Δ| = 50/3.
    assert (result["bleu_baseline"], result["bleu"]) == (pytest.approx(50), pytest.approx(200 / 3))
    # Per draw, (baseline seed 0 + seed 1) / 2 against (system seed 0 + seed 1) / 2. A sentence left out is
    # left out for every seed: in [0, 0, 2] the system's seed 1 has none of its one exact sentence, 1.
    baseline_means = [(200 / 3 + 200 / 3) / 2, (0 + 100) / 2, (100 / 3 + 100 / 3) / 2, 50]
    system_means = [(100 + 0) / 2, (100 + 100) / 2, (100 + 0) / 2, 200 / 3]
    # The hand values are sacreBLEU's corpus BLEU of each seed over the drawn sentences.
    for side, means in ((baseline, baseline_means), (system, system_means)):
        scores = [[bleu_metric().corpus_score([hyps[i] for i in draw], [[SHORT[i] for i in draw]]).score
                   for hyps in side] for draw in drawn]  # fmt: skip
        assert np.mean(scores, axis=1) == pytest.approx(means)
    # |Δ| per draw: 50/3, 50, 50/3, 50/3, mean 25.
    # Centred on their mean: -25/3 three times and 25, which alone exceeds 50/3: p = (1 + 1) / (4 + 1).
    assert result["p"] == pytest.approx(2 / 5)
    assert "bs:4" in result["signature"]


def test_seed_copies_add_no_evidence_where_pooling_them_did(monkeypatch):
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)  # the report's seed, 12345
    references = [f"w{i}a w{i}b w{i}c w{i}d" for i in range(10)]
    baseline, system = exact_on(set(range(4)), references), exact_on(set(range(5)), references)  # 40, 50
    one_seed = paired_bootstrap([baseline], [system], references)["p"]
    # Three seeds that translate alike: their test is the one seed's, since each draw moves all three.
    together = paired_bootstrap([baseline] * 3, [system] * 3, references)["p"]
    # Pooled, the three copies count as thirty independent sentences, and the same evidence reads as
    # significant: the flaw the cluster bootstrap removes.
    pooled = paired_bootstrap([baseline * 3], [system * 3], references * 3)["p"]
    assert together == one_seed and pooled < 0.05 < together
