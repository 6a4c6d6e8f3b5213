"""reports.paired: sacreBLEU's paired bootstrap between variants over test sentences, seeds paired."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from ablate.reports.paired import RESAMPLES, paired_bootstrap, paired_tests

REFERENCES = ["the cat sat on the mat", "a dog ran in the park", "it is raining today", "we sat on the mat",
              "birds sing in the early morning light", "the old man and the sea went out"]  # fmt: skip
BASELINE = ["the cat sat on a mat", "a dog ran in a park", "it rains today", "we sat on a mat",
            "birds sing in the morning light", "the old man and sea went out"]  # fmt: skip
SYSTEM = ["the cat is on the mat", "a dog ran in the park", "it is raining", "we sat on the mat",
          "birds sing in the early morning", "the old man and the sea went out"]  # fmt: skip


def test_paired_bootstrap_is_what_the_sacrebleu_command_reports(tmp_path):
    files = {}
    for name, lines in (("ref", REFERENCES), ("base", BASELINE), ("sys", SYSTEM)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "sacrebleu", str(files["ref"]), "-i", str(files["base"]),
               str(files["sys"]),
               "--paired-bs", "--paired-bs-n", str(RESAMPLES), "-m", "bleu", "-f", "json"]  # fmt: skip
    base, system = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    result = paired_bootstrap(BASELINE, SYSTEM, REFERENCES)
    assert result["bleu_baseline"] == pytest.approx(base["BLEU"]["score"])
    assert result["bleu"] == pytest.approx(system["BLEU"]["score"])
    assert result["p"] == pytest.approx(system["BLEU"]["p_value"])
    assert f"bs:{RESAMPLES}" in result["signature"] and "tok:13a" in result["signature"]
    assert paired_bootstrap(SYSTEM, SYSTEM, REFERENCES)["p"] == 1.0  # a system against itself: no evidence


def rows(
    trial: int, variant: str, seed: int, split: str, hypotheses: list[str], references=REFERENCES
) -> list:
    return [{"trial": trial, "variant": variant, "seed": seed, "split": split, "src_len": len(r.split()),
             "hyp": h, "ref": r} for h, r in zip(hypotheses, references)]  # fmt: skip


def test_paired_tests_pair_seeds_with_the_same_references_and_pool_them():
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
    pooled = paired_bootstrap(BASELINE + SYSTEM, SYSTEM + SYSTEM, REFERENCES + REFERENCES)
    assert test["bleu_baseline"] == pytest.approx(pooled["bleu_baseline"]) and test["p"] == pooled["p"]
    assert test["diff"] == pytest.approx(pooled["bleu"] - pooled["bleu_baseline"])
    assert test["p_seeds"] == [paired_bootstrap(BASELINE, SYSTEM, REFERENCES)["p"], 1.0]
    assert (long["split"], long["seeds"]) == ("test_long", [0])
    assert paired_tests(translations, ["attention"], baseline="attention") == []
    assert paired_tests(pd.DataFrame(), ["attention", "none"], baseline="attention") == []
