"""bible_lm: one Bible's running text cut into windows of L, 2L and 4L tokens, on a tiny SWORD library
written here (tests/sword_fixture.py); a tiny model trained on it reports perplexity at each length."""

from __future__ import annotations

import pytest
from conftest import TINY_MODEL, TINY_TRAIN
from sword_fixture import write_module

from ablate.harness.metrics import produced_metrics
from ablate.harness.tasks import build_task
from ablate.harness.trial import run_trial
from ablate.schema.config import config_from_tree
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

CHAPTERS, VERSES, WORDS = 50, 4, 5  # Genesis 1-50: chapter c is index c - 1 (11 and 31 test, 1, 21, 41 valid)
TEST_CHAPTERS, VALID_CHAPTERS = {11, 31}, {1, 21, 41}
L = 2


def word(c: int, v: int, k: int) -> str:
    return f"g{c}v{v}w{k}"  # one word token, telling where it comes from


@pytest.fixture
def library(tmp_path):
    """Genesis 1-50 in one module, WORDS words a verse, each word naming its chapter, verse and place; 3:2
    empty (a verse the module lacks is skipped)."""
    pytest.importorskip("pysword")
    verses = {("Genesis", c, v): " ".join(word(c, v, k) for k in range(WORDS))
              for c in range(1, CHAPTERS + 1) for v in range(1, VERSES + 1) if (c, v) != (3, 2)}  # fmt: skip
    write_module(tmp_path, "tinyen", "en", verses)
    return tmp_path


def bible_lm(library, **overrides) -> TaskConfig:
    keys = {"tokenizer": "word", "max_tokens": L, "n_valid": 1000, "n_test": 1000, **overrides}
    return TaskConfig(name="bible_lm", path=str(library), src_lang="tinyen", **keys)


def chapter(token: str) -> int:
    return int(token[1:].partition("v")[0])


def flat(examples) -> list[str]:
    return [token for ex in examples for token in ex.tgt]


def test_windows_are_l_2l_and_4l_tokens_of_the_chapters_of_their_split(library):
    data = build_task(bible_lm(library), 0)
    lengths = {"train": L, "valid": L, "test": L, "test_x2": 2 * L, "test_x4": 4 * L}
    assert set(data.splits) == set(lengths)
    for split, length in lengths.items():
        assert data.splits[split] and all(len(ex.tgt) == length and ex.src == () for ex in data.splits[split])
    # Running text within each split: its chapters' verses in canonical order, across chapters.
    test_text = [word(c, v, k) for c in sorted(TEST_CHAPTERS) for v in range(1, VERSES + 1) for k in range(WORDS)]
    assert flat(data.splits["test"]) == test_text  # 40 tokens: five windows of 4L, all drawn
    assert {chapter(t) for t in flat(data.splits["valid"])} == VALID_CHAPTERS
    train = flat(data.splits["train"])
    assert not {chapter(t) for t in train} & (TEST_CHAPTERS | VALID_CHAPTERS) and not set(train) & set(test_text)
    train_text = [word(c, v, k) for c in range(1, CHAPTERS + 1) if c not in TEST_CHAPTERS | VALID_CHAPTERS
                  for v in range(1, VERSES + 1) if (c, v) != (3, 2) for k in range(WORDS)]  # fmt: skip
    assert train == train_text[: len(train_text) // L * L]  # every window, the odd token at the end left out
    assert not data.is_text and data.train_max_len == L and len(data.src_vocab) == 4  # the specials alone


def test_the_longer_windows_hold_the_same_test_text_as_the_short_ones(library):
    data = build_task(bible_lm(library, n_test=8), 0)  # two windows of 4L drawn out of five
    assert [len(data.splits[s]) for s in ("test", "test_x2", "test_x4")] == [8, 4, 2]
    assert flat(data.splits["test"]) == flat(data.splits["test_x2"]) == flat(data.splits["test_x4"])
    assert build_task(bible_lm(library, n_test=8), 1).splits["test_x4"] == data.splits["test_x4"]  # fixed
    assert all(chapter(t) in TEST_CHAPTERS for t in flat(data.splits["test_x4"]))


def test_a_train_factor_lengthens_the_training_windows_and_leaves_the_tests_as_they_are(library):
    """Press et al.'s baseline trained on 2L, judged at 2L (test_x2) on the very windows a model trained on L
    is judged on there."""
    short, long = build_task(bible_lm(library), 0), build_task(bible_lm(library, train_factor=2), 0)
    assert {len(ex.tgt) for split in ("train", "valid") for ex in long.splits[split]} == {2 * L}
    assert long.train_max_len == 2 * L
    assert flat(long.splits["train"]) == flat(short.splits["train"])[: len(flat(long.splits["train"]))]
    for split in ("test", "test_x2", "test_x4"):
        assert long.splits[split] == short.splits[split], split


def test_the_windows_past_the_training_length_follow_the_train_factor():
    from ablate.harness.lengths import beyond_training

    for factor, beyond in [(1, {"test_x2", "test_x4"}), (2, {"test_x4"}), (4, set())]:
        task = TaskConfig(name="bible_lm", max_tokens=L, train_factor=factor)
        assert {s for s in ("test", "test_x2", "test_x4") if beyond_training(task, s)} == beyond, factor


def test_train_is_capped_by_max_examples_with_the_seed(library):
    whole = build_task(bible_lm(library), 0).splits["train"]
    first, second = (build_task(bible_lm(library, max_examples=10), seed).splits["train"] for seed in (0, 1))
    assert len(first) == len(second) == 10 and first != second
    assert set(first) <= set(whole) and set(second) <= set(whole)
    assert build_task(bible_lm(library, max_examples=10), 0).splits["train"] == first


def test_too_few_test_windows_and_no_window_length_are_refused(library):
    with pytest.raises(ConfigError, match=r"^task.n_test: 3 windows of 2 tokens hold no test window"):
        build_task(bible_lm(library, n_test=3), 0)
    # Without a window length nothing runs: the config is refused, as `ablate train` and a study's
    # validation build it, before any trial.
    with pytest.raises(ConfigError, match=r"^task.max_tokens: must be set for task bible_lm$"):
        config_from_tree({"task": {"name": "bible_lm"}, "model": {"cross_attention": False}}, {})


@pytest.mark.parametrize(
    "key, value, readers",
    [("tgt_lang", "es", "tasks parallel, bible"), ("min_len", 2, "tasks copy, reverse, sort, addition, recall, "
                                                                   "cues, digits, synth_mt"),
     ("min_tokens", 2, "tasks parallel, bible"), ("long_after", 8, "tasks parallel, bible")],
)  # fmt: skip
def test_a_key_the_task_ignores_is_refused(key, value, readers):
    with pytest.raises(ConfigError) as e:
        config_from_tree({"task": {"name": "bible_lm", "src_lang": "en", "max_tokens": 32, key: value}}, {})
    assert e.value.problems == [(f"task.{key}", f"has no effect (a setting of {readers}; task.name is bible_lm)")]


def test_produced_metrics_name_the_longer_windows_for_bible_lm_alone():
    lm = config_from_tree({"preset": "transformer", "model": {"cross_attention": False},
                           "task": {"name": "bible_lm", "max_tokens": 32}}, {})  # fmt: skip
    produced = produced_metrics(lm)
    assert {"test/ppl", "test_x2/ppl", "test_x4/ppl", "test_x2/loss", "test_x4/loss", "val/ppl"} <= produced
    assert not any(m.startswith("test_long/") or m.endswith(("/bleu", "/chrf")) for m in produced)
    assert {m.partition("/")[2] for m in produced if m.startswith("test_x4/")} == {
        m.partition("/")[2] for m in produced if m.startswith("test/")
    }
    reverse = produced_metrics(config_from_tree({"preset": "transformer", "task": {"name": "reverse"}}, {}))
    assert "test_long/ppl" in reverse and not any(m.startswith(("test_x2/", "test_x4/")) for m in reverse)


def test_a_decoder_only_model_trained_a_few_steps_reports_perplexity_at_each_length(library, tmp_path):
    cfg = config_from_tree(
        {"preset": "transformer", "model": {**TINY_MODEL, "cross_attention": False, "pos_encoding": "alibi"},
         "train": TINY_TRAIN, "task": {"name": "bible_lm", "path": str(library), "src_lang": "tinyen",
                                       "tokenizer": "word", "max_tokens": 4, "n_test": 8}},
        {},
    )  # fmt: skip
    result = run_trial(cfg, tmp_path / "trial")
    for split in ("test", "test_x2", "test_x4"):
        assert result.metrics[f"{split}/ppl"] > 1.0, split
    assert produced_metrics(cfg) <= set(result.metrics)
    assert not any(name.startswith("test_long/") for name in result.metrics)


def test_a_window_is_not_closed_with_eos_where_every_other_target_is(library):
    """Running text goes on past a window: trained to end every window in EOS, a model would learn where L
    is and leave what it was trained on at L + 1 of any longer window, whatever its positions. Teacher
    forcing reads BOS and the window's first L - 1 tokens and predicts its L tokens."""
    from ablate.harness.tasks.datamodule import EncodedSplit, collate
    from ablate.models.sequences import BOS_ID, EOS_ID

    data = build_task(bible_lm(library), 0)
    assert not data.target_ends
    for split in ("train", "test", "test_x4"):
        encoded = EncodedSplit(data.splits[split], data)
        ids = data.tgt_vocab.encode(data.splits[split][0].tgt)
        assert encoded[0][1] == [BOS_ID, *ids]
        batch = collate([encoded[0]])
        assert batch["tgt_in"][0].tolist() == [BOS_ID, *ids[:-1]] and batch["tgt_out"][0].tolist() == ids
    reverse = build_task(TaskConfig(name="reverse", max_len=4, n_train=8, n_valid=4, n_test=4), 0)
    assert reverse.target_ends and EncodedSplit(reverse.splits["test"], reverse)[0][1][-1] == EOS_ID
