"""bible: cleaning and pairing verses on strings, the task on a tiny SWORD library written here, and on
Debian's two Bibles where they are installed; without them, what needs them skips and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import REPO, ablate
from sword_fixture import DEBIAN_MODULES, NEEDS_DEBIAN, debian_bibles_missing, write_module

from ablate.harness.study.validate import load_study
from ablate.harness.tasks import build_task
from ablate.harness.tasks.bible import aligned_pairs, clean_verse, read_bible, setup_problem
from ablate.harness.tasks.bible import library as library_of
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig


def test_clean_verse_keeps_the_text_and_drops_markup_notes_and_headings():
    web = (
        '<w lemma="strong:H0430">In</w> <w lemma="strong:H7225">beginning</w>, '
        '<w lemma="strong:H0430">God</w>'
        '<note placement="foot"><reference type="annotateRef">1:1 </reference>Hebrew “Elohim”.</note>'
        '<w lemma="strong:H1254">created</w> &amp; <transChange type="added">made</transChange>. '
    )
    assert clean_verse(web) == "In beginning, God created & made."
    psalm = (
        '<div type="x-milestone" subType="x-preverse" sID="pv1"/><title canonical="true" type="psalm">'
        'A Psalm by David.</title> <lg sID="g1"/><l level="1" sID="g2"/>Yahweh, how<note>n</note>!'
        '<l eID="g2"/><lb type="x-p"/>'
    )
    assert clean_verse(psalm) == "A Psalm by David. Yahweh, how!"
    headed = (
        '<title level="1" type="main">Heading</title><speaker>Beloved</speaker> Let him <rdg>x</rdg>kiss me;'
    )
    assert clean_verse(headed) == "Let him kiss me;"
    last = (
        'Amen. <chapter eID="Rev.22"/><div canonical="true" eID="g9" osisID="Rev" type="book"/> <div '
        'sID="g10" type="glossary"/> Abba is a Chaldee word.'
    )
    assert clean_verse(last) == "Amen."
    # The RV1909's drop capitals become capitalised words; other words keep their case.
    assert clean_verse("EN el principio crió Dios") == "En el principio crió Dios"
    assert clean_verse("¿SACARÁS tú al leviathán? Y HABLÓ Jehová á Moisés, I") == (
        "¿Sacarás tú al leviathán? Y Habló Jehová á Moisés, I"
    )


def test_aligned_pairs_drop_empty_lopsided_and_renumbered_verses():
    def chapter(book, number, texts):
        return {(book, number, v): text for v, text in enumerate(texts, 1)}

    en = {**chapter("Gen", 1, ["a b c", "d e", "f g h i"]), **chapter("Gen", 2, ["a b", "c d"]),
          **chapter("Gen", 3, ["a b", "c"]), **chapter("Gen", 4, ["a b c", "d", ""]),
          **chapter("Gen", 5, ["x y"]), **chapter("Exod", 1, ["only here"])}  # fmt: skip
    es = {**chapter("Gen", 1, ["A B C", "D E F G H", "F G H"]), **chapter("Gen", 2, ["A", "C D"]),
          **chapter("Gen", 3, ["", "C"]), **chapter("Gen", 4, ["A B C", "D", ""]),
          **chapter("Gen", 5, ["X Y"])}  # fmt: skip
    pairs, dropped = aligned_pairs(en, es)
    # Gen 1:2 is lopsided (5 words against 2); Gen 3:1 has text on one side: chapters 3 and 4 go; Gen 4:3 is
    # empty on both sides; Exodus is in one module only.
    assert [ref for ref, _, _ in pairs] == [
        ("Gen", 1, 1),
        ("Gen", 1, 3),
        ("Gen", 2, 1),
        ("Gen", 2, 2),
        ("Gen", 5, 1),
    ]
    assert pairs[0] == (("Gen", 1, 1), "a b c", "A B C")
    assert dropped == {"one_sided": 1, "versification": 3, "lopsided": 1}


def fixture_verses(lang: str) -> dict:
    """Genesis 1-22, three verses each, verse v with v - 1 more words; a lopsided Spanish 3:2; no English
    5:3 (where the versifications part)."""
    words = (
        ["lion", "lamb", "dove", "vine", "fig"]
        if lang == "en"
        else ["león", "cordero", "paloma", "vid", "higo"]
    )
    verses = {}
    for c in range(1, 23):
        for v in range(1, 4):
            word = words[(c + v) % len(words)]
            if lang == "en":
                markup = f'<w lemma="strong:H1">The</w> {word} saw {c} and {v}<note>n</note>'
                verses[("Genesis", c, v)] = markup + " again" * (v - 1) + "."
            else:
                verses[("Genesis", c, v)] = (
                    f"{'EL' if v == 1 else 'el'} {word} vió {c} y {v}" + " otra vez" * (v - 1) + "."
                )
    if lang == "es":
        verses[("Genesis", 3, 2)] = "el cordero " * 8 + "vió 3 y 2."
    else:
        del verses[("Genesis", 5, 3)]
    return verses


@pytest.fixture
def library(tmp_path):
    pytest.importorskip("pysword")
    for name, lang in zip(DEBIAN_MODULES, ("en", "es")):
        write_module(tmp_path, name, lang, fixture_verses(lang))
    return tmp_path


def bible(library, **overrides) -> TaskConfig:
    return TaskConfig(name="bible", path=str(library), **overrides)


def texts(data, split: str, side: str = "src") -> list[str]:
    tokenizer = data.src_tokenizer if side == "src" else data.tgt_tokenizer
    return [tokenizer.detokenize(getattr(ex, side)) for ex in data.splits[split]]


def test_the_task_pairs_a_sword_library_by_reference_and_splits_it_by_chapter(library):
    data = build_task(bible(library, tokenizer="char"), 0)
    # 66 verses: 5:3 empty in English drops chapters 5 and 6 (6 verses), 3:2 is lopsided. Chapter i of the
    # versification (Genesis 1 is 0) is valid when i % 20 == 0 (chapters 1, 21), test when it is 10 (11).
    assert data.meta["dropped"] == {"one_sided": 1, "versification": 5, "lopsided": 1}
    assert data.meta["pairs"] == {"train": 50, "valid": 6, "test": 3}
    assert data.sizes() == {"train": 50, "valid": 6, "test": 3, "test_long": 0}
    assert texts(data, "test") == ["The dove saw 11 and 1.", "The vine saw 11 and 2 again.",
                                   "The fig saw 11 and 3 again again."]  # fmt: skip
    assert texts(data, "test", "tgt") == ["El paloma vió 11 y 1.", "el vid vió 11 y 2 otra vez.",
                                          "el higo vió 11 y 3 otra vez otra vez."]  # fmt: skip
    assert data.is_text and data.meta["modules"] == list(DEBIAN_MODULES)
    backwards = build_task(bible(library, tokenizer="char", src_lang="es", tgt_lang="en"), 0)
    assert texts(backwards, "test") == texts(data, "test", "tgt")


def test_splits_are_the_same_for_every_seed_and_samples_are_fixed(library):
    first, second = (
        build_task(bible(library, n_valid=4, n_test=2, max_examples=10), seed) for seed in (0, 1)
    )
    assert first.sizes() == {"train": 10, "valid": 4, "test": 2, "test_long": 0}
    assert first.splits["test"] == second.splits["test"] and first.splits["valid"] == second.splits["valid"]
    assert first.splits["train"] != second.splits["train"]  # the training sample is the trial seed's
    # Verse 1 has 7 words a side (punctuation included), verse 2 has 8 and 9: longer test pairs are test_long.
    long = build_task(bible(library, max_tokens=8), 0)
    assert long.sizes() == {"train": 17, "valid": 2, "test": 1, "test_long": 2}
    assert max(len(ex.src) for ex in long.splits["train"]) == 7


def test_missing_modules_and_pysword_are_one_line_naming_what_to_install(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as error:
        build_task(bible(tmp_path), 0)
    assert str(error.value) == (
        f"task bible: no SWORD module engWEB2015eb, spaRV1909eb in {tmp_path} (apt-get install "
        "sword-text-web sword-text-sparv, or set task.path to the SWORD library that holds them)"
    )
    (tmp_path / "mods.d").mkdir()
    (tmp_path / "mods.d" / "engweb2015eb.conf").write_text("[engWEB2015eb]\nLang=en\n")
    assert setup_problem(bible(tmp_path)) == (
        f"task bible: no SWORD module spaRV1909eb in {tmp_path} (apt-get install sword-text-sparv, or set "
        "task.path to the SWORD library that holds them)"
    )
    (tmp_path / "mods.d" / "sparv1909eb.conf").write_text("[spaRV1909eb]\nLang=es\n")
    monkeypatch.setitem(sys.modules, "pysword", None)
    with pytest.raises(ConfigError) as error:
        build_task(bible(tmp_path), 0)
    assert str(error.value) == (
        "the bible task: the [bible] extra is not installed (no module pysword); "
        "pip install 'attention-ablate[bible]'"
    )


def test_a_study_is_refused_before_it_runs_when_the_modules_are_missing(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(
        f"name: s\nbase: {{task: {{name: bible, path: {tmp_path}}}}}\nvariants: {{a: {{preset: lstm}}}}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_study(study)
    assert str(error.value) == f"{study}: base.task.path: {setup_problem(bible(tmp_path))}"
    assert load_study(study, read_data=False).name == "s"  # the file alone needs no Bible


def test_the_library_is_task_path_else_sword_path_else_debians(tmp_path, monkeypatch):
    monkeypatch.setenv("SWORD_PATH", str(tmp_path / "sword"))
    assert library_of(TaskConfig(name="bible")) == tmp_path / "sword"
    assert library_of(bible(tmp_path / "given")) == tmp_path / "given"
    monkeypatch.delenv("SWORD_PATH")
    assert library_of(TaskConfig(name="bible")) == Path("/usr/share/sword")


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_without_debians_bibles_the_bible_checks_pass_or_skip_saying_what_to_install(tmp_path):
    """A fresh machine, with only what the README installs: the bible study file's checks pass, and what
    reads Debian's Bibles skips with the apt-get line. An empty SWORD_PATH hides any Bibles this machine
    has, in a pytest of its own (the skip conditions are read as the test files load)."""
    (tmp_path / "empty").mkdir()
    report = tmp_path / "report.xml"
    bible_tests = ["tests/test_bundled_claims.py", "tests/test_ablations.py::test_study_runs_one_tiny_trial[bible]",
                   "tests/test_bible.py", "-k", "not without_debians_bibles"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *bible_tests],
        cwd=REPO, env={**os.environ, "SWORD_PATH": str(tmp_path / "empty")}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    outcomes = {f"{case.get('classname')}::{case.get('name')}": outcome(case)
                for case in ET.parse(report).getroot().iter("testcase")}  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    not_passed = {name: why for name, why in outcomes.items() if why != "passed"}
    assert not_passed and all(why.startswith("skipped: ") and NEEDS_DEBIAN in why
                              for why in not_passed.values()), not_passed  # fmt: skip
    assert not any(name.startswith("tests.test_bundled_claims") for name in not_passed)  # they need no data


def outcome(case: ET.Element) -> str:
    """'passed', or what a junit XML test case says instead: the skip's reason, the failure or error."""
    for child in case:
        if child.tag in ("skipped", "failure", "error"):
            return f"{child.tag}: {child.get('message')}"
    return "passed"


@pytest.mark.skipif(debian_bibles_missing() is not None, reason=str(debian_bibles_missing()))
def test_debians_web_and_rv1909_give_thirty_thousand_clean_verse_pairs():
    corpus, dropped = read_bible(library_of(TaskConfig(name="bible")).resolve(), *DEBIAN_MODULES)
    pairs = sum(len(split) for split in corpus.values())
    assert 29_000 <= pairs <= 31_102, (pairs, dropped)  # 31,102 verses in the KJV versification
    assert corpus["valid"][0] == (
        "In the beginning, God created the heavens and the earth.",
        "En el principio crió Dios los cielos y la tierra.",
    )
    assert 0.04 < len(corpus["test"]) / pairs < 0.06 and 0.04 < len(corpus["valid"]) / pairs < 0.06
    assert not any("<" in text or "strong:" in text for pair in corpus["test"] for text in pair)


@pytest.mark.slow
@pytest.mark.skipif(debian_bibles_missing() is not None, reason=str(debian_bibles_missing()))
def test_the_bundled_study_sweeps_and_reports_bleu_by_length_with_paired_tests(tmp_path):
    """`ablate sweep bible` as a user runs it, shrunk with --set to a minute or two on 2 cores."""
    shrink = ["train.max_steps=20", "train.val_every=10", "model.d_model=32", "task.max_examples=500",
              "task.n_valid=60", "task.n_test=120"]  # fmt: skip
    result = ablate("sweep", "bible", "--out", str(tmp_path), "--wandb", "disabled", "--workers", "2",
                    *(arg for pair in (("--set", s) for s in shrink) for arg in pair))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = tmp_path / "bible" / "report"
    assert (report / "bleu_by_length.png").is_file()
    md = (report / "report.md").read_text()
    assert "Corpus BLEU against source sentence length" in md
    table = md[md.index("## BLEU, paired over test sentences") : md.index("## Figures")]
    # Each variant against the baseline RNNsearch-50 on the same verses, whatever length it trained on.
    paired = [line.split("|")[1:4] for line in table.splitlines() if line.startswith("| rnn")]
    assert paired == [[f" {variant} ", f" {split} ", " 0, 1, 2 "] for variant in ("rnnencdec-50", "rnnsearch-30")
                      for split in ("test", "test_long")]  # fmt: skip
    claims = md[md.index("## Claims") : md.index("## BLEU, paired")]
    assert claims.count("Bahdanau et al. 2015, Sec. 5.1") == 3
