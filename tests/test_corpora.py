"""parallel: each corpus format from a small file written here, tokenizers, filters and bad data."""

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from ablate.harness.tasks import build_task
from ablate.harness.tasks.tokenizers import BpeTokenizer
from ablate.schema.config import config_from_tree
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

WORDS = ["cat", "dog", "bird", "fish", "horse"]
FRENCH = {"cat": "chat", "dog": "chien", "bird": "oiseau", "fish": "poisson", "horse": "cheval"}


def sentence_pairs(n: int = 60) -> list[tuple[str, str]]:
    """English -> French pairs whose length grows with i: 'I see 3 big cat .' -> 'Je vois 3 grand chat .'"""
    pairs = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        extra = i // 20  # 0, 1 or 2 more adjectives
        pairs.append(
            (
                f"I see {i} " + "big " * extra + f"{word} .",
                f"Je vois {i} {FRENCH[word]} " + "grand " * extra + ".",
            )
        )
    return pairs


def parallel(path, **overrides) -> TaskConfig:
    return TaskConfig(name="parallel", path=str(path), **overrides)


def write_tsv(path, pairs, attribution=True):
    suffix = "\tCC-BY 2.0 (France) Attribution: tatoeba.org" if attribution else ""
    path.write_text("".join(f"{s}\t{t}{suffix}\n" for s, t in pairs), encoding="utf-8")
    return path


def texts(data, split, side="src"):
    tokenizer = data.src_tokenizer if side == "src" else data.tgt_tokenizer
    return [tokenizer.detokenize(getattr(ex, side)) for ex in data.splits[split]]


def test_tsv_anki_style_with_a_seeded_split(tmp_path):
    path = write_tsv(tmp_path / "fra.txt", sentence_pairs())
    data = build_task(parallel(path), 0)
    assert data.sizes() == {"train": 48, "valid": 6, "test": 6, "test_long": 0}
    assert build_task(parallel(path), 0).splits == data.splits
    assert build_task(parallel(path), 1).splits["test"] != data.splits["test"]
    everything = {ex.src: ex.tgt for examples in data.splits.values() for ex in examples}
    assert everything[("I", "see", "0", "cat", ".")] == (
        "Je",
        "vois",
        "0",
        "chat",
        ".",
    )  # attribution ignored
    assert len(everything) == 60 and data.is_text and data.meta["format"] == "tsv"
    # The vocabulary comes from the training split only: held-out numbers are unknown words.
    assert set(data.src_vocab.itos) >= {"I", "see", "cat", "."}
    assert not {ex.src[2] for ex in data.splits["test"]} & set(data.src_vocab.itos)


def test_moses_prefix_uses_the_split_files_beside_it(tmp_path):
    pairs = sentence_pairs()
    for name, part in (("train", pairs[:40]), ("dev", pairs[40:50]), ("test", pairs[50:])):
        (tmp_path / f"{name}.en").write_text("".join(s + "\n" for s, _ in part), encoding="utf-8")
        (tmp_path / f"{name}.fr").write_text("".join(t + "\n" for _, t in part), encoding="utf-8")
    data = build_task(parallel(tmp_path / "train", tokenizer="char"), 0)
    assert data.sizes() == {"train": 40, "valid": 10, "test": 10, "test_long": 0}
    assert texts(data, "test") == [s for s, _ in pairs[50:]]  # en -> fr, the sorted suffixes
    assert texts(data, "valid", "tgt") == [t for _, t in pairs[40:50]]
    backwards = build_task(parallel(tmp_path / "train", src_lang="fr", tgt_lang="en", tokenizer="char"), 0)
    assert texts(backwards, "test") == [t for _, t in pairs[50:]]


def test_jsonl_with_src_tgt_translation_dicts_or_named_fields(tmp_path):
    pairs = sentence_pairs(30)
    shapes = {
        "plain.jsonl": lambda s, t: {"src": s, "tgt": t, "id": 1},
        "translation.jsonl": lambda s, t: {"translation": {"en": s, "fr": t}},
        "named.jsonl": lambda s, t: {"english": s, "french": t, "source": "tatoeba"},
    }
    for name, record in shapes.items():
        (tmp_path / name).write_text("\n".join(json.dumps(record(s, t)) for s, t in pairs) + "\n")
    for name in ("plain.jsonl", "translation.jsonl"):
        data = build_task(parallel(tmp_path / name), 0)
        assert data.sizes() == {"train": 24, "valid": 3, "test": 3, "test_long": 0}
        assert sorted(texts(data, "train") + texts(data, "valid") + texts(data, "test")) == sorted(
            s for s, _ in pairs
        )
    named = build_task(parallel(tmp_path / "named.jsonl", src_lang="english", tgt_lang="french"), 0)
    assert named.splits["train"][0].tgt[:2] == ("Je", "vois")
    with pytest.raises(ConfigError, match=r"named.jsonl:1: cannot tell source from target"):
        build_task(parallel(tmp_path / "named.jsonl"), 0)


def test_hf_save_to_disk_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    pairs = sentence_pairs(40)
    rows = {"translation": [{"en": s, "fr": t} for s, t in pairs]}
    whole = datasets.Dataset.from_dict(rows)
    whole.save_to_disk(str(tmp_path / "single"))
    data = build_task(parallel(tmp_path / "single"), 0)
    assert (
        data.sizes() == {"train": 32, "valid": 4, "test": 4, "test_long": 0}
        and data.meta["format"] == "hf_disk"
    )
    splits = datasets.DatasetDict(
        {
            "train": whole.select(range(30)),
            "validation": whole.select(range(30, 35)),
            "test": whole.select(range(35, 40)),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    data = build_task(parallel(tmp_path / "dict", tokenizer="char"), 0)
    assert data.sizes() == {"train": 30, "valid": 5, "test": 5, "test_long": 0}
    assert texts(data, "test", "tgt") == [t for _, t in pairs[35:]]
    (tmp_path / "plain_folder").mkdir()
    with pytest.raises(
        ConfigError, match=r"^task.path: .*plain_folder is a folder but not one written by datasets"
    ):
        build_task(parallel(tmp_path / "plain_folder"), 0)


def test_bpe_round_trips_text_and_is_saved_with_the_run(tmp_path):
    texts_fr = ["Ça va ? Très bien, merci.", "Je vais à l'école demain matin.", "Où est la gare ?"] * 10
    bpe = BpeTokenizer.train(texts_fr, vocab_size=120)
    for text in texts_fr[:3] + ["Très bien, la gare."]:
        tokens = bpe.tokenize(text)
        assert bpe.detokenize(tokens) == text
    assert len(bpe.tokenize("Très bien")) < len("Très bien")  # merges were learned

    path = write_tsv(tmp_path / "corpus.tsv", sentence_pairs(), attribution=False)
    data = build_task(parallel(path, tokenizer="bpe", bpe_vocab_size=80), 0)
    originals = {s for s, _ in sentence_pairs()}
    assert set(texts(data, "train") + texts(data, "test")) <= originals
    data.save(tmp_path / "run")
    for side, tokenizer in (("src", data.src_tokenizer), ("tgt", data.tgt_tokenizer)):
        saved = HFTokenizer.from_file(str(tmp_path / "run" / f"{side}_tokenizer.json"))
        assert saved.encode("Je vois 12 chat grand .").tokens == tokenizer.tokenize("Je vois 12 chat grand .")
    word = build_task(parallel(path, tokenizer="word"), 0)
    word.save(tmp_path / "word_run")
    assert json.loads((tmp_path / "word_run" / "tgt_tokenizer.json").read_text()) == {"kind": "word"}


def test_length_filters_send_long_test_pairs_to_test_long_and_the_cap_samples_train(tmp_path):
    path = write_tsv(tmp_path / "corpus.tsv", sentence_pairs(), attribution=False)
    everything = build_task(parallel(path), 0)
    data = build_task(parallel(path, min_tokens=5, max_tokens=6), 0)
    for split in ("train", "valid", "test"):
        assert all(
            5 <= min(len(ex.src), len(ex.tgt)) and max(len(ex.src), len(ex.tgt)) <= 6
            for ex in data.splits[split]
        )
    assert data.splits["test"] + data.splits["test_long"] == [
        ex for ex in everything.splits["test"] if len(ex.src) >= 5
    ]
    assert data.splits["test_long"] and all(len(ex.src) > 6 for ex in data.splits["test_long"])
    capped = build_task(parallel(path, max_tokens=6, max_examples=10), 0)
    assert len(capped.splits["train"]) == 10 and set(capped.splits["train"]) <= set(data.splits["train"])
    assert capped.splits["test"] == data.splits["test"]


def test_long_after_tests_trials_trained_on_different_lengths_on_the_same_pairs(tmp_path):
    path = write_tsv(tmp_path / "corpus.tsv", sentence_pairs(200), attribution=False)  # 6 to 15 words

    def lengths(data, split):
        return {max(len(ex.src), len(ex.tgt)) for ex in data.splits[split]}

    short, long = (build_task(parallel(path, max_tokens=n, long_after=8), 0) for n in (6, 8))
    assert max(lengths(short, "train")) == 6 and max(lengths(long, "train")) == 8
    for split in ("test", "test_long"):
        assert short.splits[split] == long.splits[split] and short.splits[split]
    assert max(lengths(short, "test")) == 8 and min(lengths(short, "test_long")) > 8
    # Without max_tokens training keeps every length, and long_after alone splits the test pairs.
    every = build_task(parallel(path, long_after=8), 0)
    assert every.splits["test"] == long.splits["test"] and max(lengths(every, "train")) > 8
    for key in ("max_tokens", "long_after"):
        with pytest.raises(ConfigError) as e:
            config_from_tree({"task": {"name": "parallel", "path": str(path), "min_tokens": 5, key: 3}}, {})
        assert e.value.problems == [("task.min_tokens", f"must not exceed {key}=3 (got 5)")]


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_bad_data_gives_one_line_naming_file_and_line(tmp_path):
    good = "".join(f"{s}\t{t}\n" for s, t in sentence_pairs(5))
    (tmp_path / "no_tab.tsv").write_text(good + "just one column\n" + good, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "no_tab.tsv"), 0)
    assert one_line(e) == f"{tmp_path / 'no_tab.tsv'}:6: expected source<TAB>target, found no tab"

    (tmp_path / "latin1.tsv").write_bytes(good.encode() + "caf\xe9\tcaf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "latin1.tsv"), 0)
    assert one_line(e).startswith(f"{tmp_path / 'latin1.tsv'}:6: not UTF-8 text")

    (tmp_path / "empty.tsv").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "empty.tsv"), 0)
    assert one_line(e) == f"{tmp_path / 'empty.tsv'}: empty corpus (no source/target pairs)"

    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "missing.tsv"), 0)
    assert (
        one_line(e) == f"task.path: {tmp_path / 'missing.tsv'}: no such file, Moses prefix or dataset folder"
    )

    (tmp_path / "broken.jsonl").write_text(
        '{"src": "a", "tgt": "b"}\n{"src": "a", "tgt": \n', encoding="utf-8"
    )
    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "broken.jsonl"), 0)
    assert one_line(e).startswith(f"{tmp_path / 'broken.jsonl'}:2: not valid JSON")

    (tmp_path / "train.en").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "train.fr").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        build_task(parallel(tmp_path / "train"), 0)
    assert (
        one_line(e)
        == f"{tmp_path / 'train.fr'}: 2 lines, but {tmp_path / 'train.en'} has 3; Moses files pair line by line"
    )
