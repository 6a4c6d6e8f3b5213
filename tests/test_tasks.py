"""Synthetic tasks, synth_mt, the task registry and the DataModule's batching."""

import json

import numpy as np
import pytest

from ablate.harness.tasks import build_task, builder
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.harness.tasks.synth_mt import (
    ADJECTIVES,
    DETERMINERS,
    NOUNS,
    OBJECT,
    PAST,
    PREPOSITIONS,
    SUBJECT,
    VERBS,
)
from ablate.schema.config import build_config
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig
from ablate.schema.tasks import TASKS

GENERATED = ["copy", "reverse", "sort", "addition", "recall", "synth_mt"]


def small(name: str, **overrides) -> TaskConfig:
    fields = {"name": name, "min_len": 1, "max_len": 8, "test_max_len": 12, "n_train": 300, "n_valid": 40,
              "n_test": 60, **overrides}  # fmt: skip
    return TaskConfig(**fields)


def every_example(data):
    return [ex for examples in data.splits.values() for ex in examples]


@pytest.mark.parametrize("name", GENERATED)
def test_same_seed_same_data_and_other_seed_other_data(name):
    first, again, other = (build_task(small(name), seed) for seed in (3, 3, 4))
    assert first.splits == again.splits
    assert first.splits["train"] != other.splits["train"]
    assert first.sizes() == {"train": 300, "valid": 40, "test": 60, "test_long": 60}


@pytest.mark.parametrize("name", GENERATED)
def test_held_out_sources_never_seen_in_training_and_test_long_is_longer(name):
    data = build_task(small(name), 0)
    train = {ex.src for ex in data.splits["train"]}
    assert not train & {ex.src for ex in data.splits["test"] + data.splits["valid"]}
    length = {"addition": lambda src: max(len(op) for op in "".join(src).split("+")),
              "recall": lambda src: (len(src) - 2) // 2}.get(name, len)  # fmt: skip
    lo = 5 if name == "synth_mt" else 1
    assert all(lo <= length(ex.src) <= 8 for ex in data.splits["train"])
    assert all(8 < length(ex.src) <= 12 for ex in data.splits["test_long"])


@pytest.mark.parametrize("name", GENERATED)
def test_gold_alignments_index_real_tokens(name):
    data = build_task(small(name), 0)
    for ex in every_example(data):
        if name == "addition":
            assert ex.alignment is None
            continue
        assert ex.alignment
        assert all(0 <= s < len(ex.src) and 0 <= t < len(ex.tgt) for s, t in ex.alignment)
        if name != "synth_mt":  # these tasks move tokens: aligned positions hold the same symbol
            assert all(ex.src[s] == ex.tgt[t] for s, t in ex.alignment)


def test_copy_reverse_sort_outputs():
    for name, expected in (("copy", lambda s: s), ("reverse", lambda s: s[::-1]),
                           ("sort", lambda s: tuple(sorted(s, key=int)))):  # fmt: skip
        data = build_task(small(name, vocab_size=12), 1)
        for ex in every_example(data):
            assert ex.tgt == expected(ex.src)
    sort = build_task(small("sort", vocab_size=12), 1)
    # "10" < "2" as text: the sort is numeric, and each source position is used exactly once.
    assert any({"2", "10"} <= set(ex.src) for ex in sort.splits["train"])
    assert all(sorted(s for s, _ in ex.alignment) == list(range(len(ex.src))) for ex in sort.splits["train"])


def test_addition_sums_with_carries_and_no_leading_zeros():
    data = build_task(small("addition", max_len=5, test_max_len=25), 0)  # past int64 too
    carries = 0
    for ex in every_example(data):
        a, b = "".join(ex.src).split("+")
        assert int("".join(ex.tgt)) == int(a) + int(b)
        assert all(op == "0" or not op.startswith("0") for op in (a, b))
        carries += any(int(x) + int(y) >= 10 for x, y in zip(a[::-1], b[::-1]))
    assert carries > len(every_example(data)) / 2
    assert max(len(ex.src) for ex in data.splits["test_long"]) > 2 * 5 + 1


def test_recall_answers_the_queried_keys_value():
    data = build_task(small("recall"), 0)
    for ex in every_example(data):
        *pairs, query, key = ex.src
        assert query == "?"
        memory = dict(zip(pairs[::2], pairs[1::2]))
        assert len(memory) == len(pairs) // 2  # keys are distinct
        assert ex.tgt == (memory[key],)
        assert ex.alignment == ((pairs.index(key) + 1, 0),)


def test_recall_has_26_keys():
    with pytest.raises(ConfigError, match=r"^task.test_max_len: recall has 26 distinct keys"):
        build_task(small("recall", max_len=20, test_max_len=30), 0)


def test_synth_mt_reorders_and_aligns_by_its_grammar():
    data = build_task(small("synth_mt", max_len=12, test_max_len=16), 0)
    translation = {**{w: t for words, t in NOUNS.items() for w in words}, **ADJECTIVES, **PREPOSITIONS,
                   **{form: stem for forms, stem in VERBS.items() for form in forms}}  # fmt: skip
    past_forms = {past for _, past in VERBS}
    seen = {"one_to_many": 0, "many_to_one": 0}
    for ex in every_example(data):
        links = set(ex.alignment)
        aligned_src = {s for s, _ in links}
        aligned_tgt = {t for _, t in links}
        for s, word in enumerate(ex.src):  # determiners alone have no translation
            assert (s in aligned_src) == (word not in DETERMINERS)
        for t, word in enumerate(ex.tgt):  # case markers alone have no source
            assert (t in aligned_tgt) == (word not in (SUBJECT, OBJECT))
        for s, t in links:
            assert ex.tgt[t] == (PAST if ex.tgt[t] == PAST else translation[ex.src[s]])
        # SVO -> SOV: the verb (and its tense word) ends the target; ga precedes wo.
        verb = next(s for s, w in enumerate(ex.src) if w in translation and translation[w] in VERBS.values())
        verb_targets = sorted(t for s, t in links if s == verb)
        assert verb_targets[-1] == len(ex.tgt) - 1
        assert ex.tgt.index(SUBJECT) < ex.tgt.index(OBJECT) < verb_targets[0]
        seen["one_to_many"] += ex.src[verb] in past_forms and len(verb_targets) == 2
        seen["many_to_one"] += any(len([s for s, u in links if u == t]) == 2 for t in aligned_tgt)
    assert seen["one_to_many"] > 50 and seen["many_to_one"] > 20
    assert data.is_text and len(data.src_vocab) != len(data.tgt_vocab)


def test_synth_mt_needs_five_words():
    with pytest.raises(ConfigError, match=r"^task.max_len: synth_mt examples have length at least 5"):
        build_task(small("synth_mt", max_len=4), 0)


def test_registry_is_the_list_of_task_names_the_config_accepts(monkeypatch):
    for name, task in TASKS.items():
        needed = {key: 8 for key in task.needs}  # every key a task needs so far is a length
        model = {"arch": "classifier"} if task.labelled else {}  # a label is a classifier's target
        assert build_config({"task": {"name": name, **needed}, "model": model}).task.name == name
        for key in task.needs:
            with pytest.raises(ConfigError, match=rf"^task.{key}: must be set for task {name}$"):
                build_config({"task": {"name": name}, "model": model})
    with pytest.raises(ConfigError, match=rf"^task.name: unknown task 'juggle'; known: {', '.join(TASKS)}$"):
        build_config({"task": {"name": "juggle"}})
    monkeypatch.setitem(TASKS, "echo", TASKS["copy"])  # a task added to the registry needs nothing else
    assert build_task(small("echo"), 0).splits["train"] == build_task(small("copy"), 0).splits["train"]
    assert all(callable(builder(name)) and task.about and "\n" not in task.doc for name, task in TASKS.items())
    with pytest.raises(ConfigError, match=r"^task.path: the parallel task needs a corpus"):
        build_task(TaskConfig(name="parallel"), 0)


def test_save_writes_each_vocabularys_tokens_by_id(tmp_path):
    data = build_task(small("synth_mt"), 0)
    data.save(tmp_path / "data")
    for side, vocab in (("src", data.src_vocab), ("tgt", data.tgt_vocab)):
        saved = json.loads((tmp_path / "data" / f"{side}_vocab.json").read_text(encoding="utf-8"))
        assert saved == vocab.itos and [vocab.stoi[token] for token in saved] == list(range(len(vocab)))
    assert json.loads((tmp_path / "data" / "task.json").read_text())["sizes"]["train"] == 300


def batches_of(dm, epoch=0):
    sampler = dm.train_dataloader().batch_sampler
    sampler.set_epoch(epoch)
    return list(sampler)


def test_token_budget_batches_cover_the_split_within_budget_and_bucket_lengths():
    data = build_task(small("reverse", max_len=40, test_max_len=40, n_train=600), 0)
    dm = Seq2SeqDataModule(data, 32, 0, batch_tokens=300)
    src, tgt = dm.encoded["train"].lengths()
    size = np.maximum(src, tgt)
    batches = batches_of(dm)
    assert sorted(i for b in batches for i in b) == list(range(600))
    assert all(len(b) * size[b].max() <= 300 for b in batches)
    assert len(dm.train_dataloader()) == len(batches)
    fixed = Seq2SeqDataModule(data, 32, 0)
    assert dm.padding_fraction() < 0.05 < fixed.padding_fraction()
    batch = next(iter(dm.train_dataloader()))
    assert batch["src"].numel() <= 300 and batch["tgt_in"].shape == batch["tgt_out"].shape


@pytest.mark.parametrize("batch_tokens", [None, 300])
def test_training_order_depends_on_seed_and_epoch_only(batch_tokens):
    data = build_task(small("reverse", max_len=40, test_max_len=40, n_train=600), 0)
    dm, same, other = (Seq2SeqDataModule(data, 32, seed, batch_tokens=batch_tokens) for seed in (0, 0, 1))
    assert batches_of(dm) == batches_of(same) != batches_of(other)
    assert batches_of(dm, epoch=1) != batches_of(dm, epoch=0)


def test_evaluation_batches_keep_the_split_order():
    data = build_task(small("reverse", max_len=40, test_max_len=50), 0)
    for dm in (
        Seq2SeqDataModule(data, 32, 0, eval_batch_size=7),
        Seq2SeqDataModule(data, 32, 0, batch_tokens=200),
    ):
        order = [i for b in dm.test_dataloader()[0].batch_sampler for i in b]
        assert order == list(range(len(data.splits["test"])))
        assert dm.eval_splits == ["test", "test_long"]
