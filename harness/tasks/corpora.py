"""parallel: a user's sentence pairs -> tokenized train / valid / test / test_long.

What task.path names decides the format:
- a .jsonl / .json file: one JSON object a line, with fields src / tgt, source / target, the fields
  task.src_lang / task.tgt_lang, or a `translation` dict {language: text};
- any other file: TSV, source<TAB>target, further columns ignored (Tatoeba / Anki exports);
- a Moses prefix: `data/train` for data/train.en + data/train.fr, languages task.src_lang / tgt_lang (or
  the two suffixes, sorted); for a `train` prefix, valid.* (or dev.*) and test.* beside it are those splits;
- a folder written by datasets' `save_to_disk` (a Dataset, or a DatasetDict with its splits);
- anything else: a Hugging Face hub dataset (task.hf_config its configuration), when online.

Where the corpus has no valid / test split, a seeded sample of min(task.n_valid / n_test, a tenth of
the pairs) is held out of train. The tokenizers (task.tokenizer) learn from the training split only.
Pairs with a side shorter than task.min_tokens are dropped; with task.max_tokens, longer train / valid
pairs are dropped and longer test pairs become test_long (task.long_after moves that boundary, so that
trials trained on different lengths are tested on the same pairs). task.max_examples then caps train."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np

from ablate.harness.extras import require
from ablate.harness.tasks.base import SPLITS, Example, TaskData, Vocab, longest_target
from ablate.harness.tasks.reading import read_lines, require_file
from ablate.harness.tasks.tokenizers import build_tokenizer
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

RawPair = tuple[str, str]
Corpus = dict[str, list[RawPair]]  # split name -> (source text, target text)
# Split names corpora use -> ours; splits by any other name are left out.
SPLIT_NAMES = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}
JSON_SUFFIXES = (".jsonl", ".json")


def field_names(fields: dict, cfg: TaskConfig) -> tuple[str, str]:
    if cfg.src_lang is not None and cfg.tgt_lang is not None:
        return cfg.src_lang, cfg.tgt_lang
    for names in (("src", "tgt"), ("source", "target")):
        if all(name in fields for name in names):
            return names
    if len(fields) == 2:  # a translation dict {language: text}, taken in its own order
        src, tgt = fields
        return src, tgt
    raise ValueError(
        "cannot tell source from target: use fields src / tgt or source / target, "
        "or set task.src_lang and task.tgt_lang"
    )


def record_pair(record: object, cfg: TaskConfig) -> RawPair:
    """The (source, target) texts of one JSON / dataset record; ValueError says what is wrong."""
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    fields = record["translation"] if isinstance(record.get("translation"), dict) else record
    src, tgt = field_names(fields, cfg)
    if not isinstance(fields.get(src), str) or not isinstance(fields.get(tgt), str):
        raise ValueError(f"expected text in fields {src!r} and {tgt!r}")
    return fields[src], fields[tgt]


def read_tsv(path: Path) -> list[RawPair]:
    pairs = []
    for number, line in read_lines(path):
        columns = line.split("\t")
        if len(columns) < 2:
            raise ConfigError(f"{path}:{number}: expected source<TAB>target, found no tab")
        pairs.append((columns[0].strip(), columns[1].strip()))
    return pairs


def read_jsonl(path: Path, cfg: TaskConfig) -> list[RawPair]:
    pairs = []
    for number, line in read_lines(path):
        try:
            pairs.append(record_pair(json.loads(line), cfg))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None
        except ValueError as e:
            raise ConfigError(f"{path}:{number}: {e}") from None
    return pairs


def moses_languages(prefix: Path, cfg: TaskConfig) -> tuple[str, str] | None:
    """The (source, target) suffixes of a Moses prefix, or None when no `prefix.*` file exists."""
    suffixes = sorted(
        p.name[len(prefix.name) + 1 :]
        for p in prefix.parent.glob(glob.escape(prefix.name) + ".*")
        if p.is_file() and "." not in p.name[len(prefix.name) + 1 :]
    )
    if not suffixes:
        return None
    if cfg.src_lang is not None and cfg.tgt_lang is not None:
        return cfg.src_lang, cfg.tgt_lang
    if len(suffixes) != 2:
        raise ConfigError(
            f"task.path: {prefix}.* has {len(suffixes)} language files ({', '.join(suffixes)}); "
            "set task.src_lang and task.tgt_lang"
        )
    return suffixes[0], suffixes[1]


def read_moses_pair(prefix: Path, languages: tuple[str, str]) -> list[RawPair]:
    """Line i of prefix.src translates line i of prefix.tgt, so blank lines count too."""
    src_path, tgt_path = (require_file(prefix.with_name(f"{prefix.name}.{lang}")) for lang in languages)
    src = [line.strip() for _, line in read_lines(src_path, skip_blank=False)]
    tgt = [line.strip() for _, line in read_lines(tgt_path, skip_blank=False)]
    if len(src) != len(tgt):
        raise ConfigError(
            f"{tgt_path}: {len(tgt)} lines, but {src_path} has {len(src)}; Moses files pair line by line"
        )
    return list(zip(src, tgt))


def read_moses(prefix: Path, languages: tuple[str, str]) -> Corpus:
    corpus = {"train": read_moses_pair(prefix, languages)}
    if prefix.name == "train":
        for split, names in (("valid", ("valid", "dev")), ("test", ("test",))):
            for name in names:
                sibling = prefix.with_name(name)
                if all(sibling.with_name(f"{name}.{lang}").is_file() for lang in languages):
                    corpus[split] = read_moses_pair(sibling, languages)
                    break
    return corpus


def read_hf(dataset, cfg: TaskConfig, where: str) -> Corpus:
    """A datasets Dataset (all of it is train) or DatasetDict (its train / validation / test)."""
    parts = dataset.items() if hasattr(dataset, "keys") else [("train", dataset)]
    corpus: Corpus = {}
    for name, part in parts:
        if name not in SPLIT_NAMES:
            continue
        pairs = corpus.setdefault(SPLIT_NAMES[name], [])
        for row, record in enumerate(part):
            try:
                pairs.append(record_pair(record, cfg))
            except ValueError as e:
                raise ConfigError(f"{where} [{name}] row {row}: {e}") from None
    if "train" not in corpus:
        raise ConfigError(f"{where}: no train split (found {', '.join(dataset.keys())})")
    return corpus


def looks_local(path: str) -> bool:
    """Whether a missing path was meant as a file here, not as a hub dataset name like 'org/name'."""
    p = Path(path).expanduser()
    return path.startswith(("/", ".", "~")) or bool(p.suffix) or (p.parent != Path(".") and p.parent.is_dir())


def read_corpus(cfg: TaskConfig) -> tuple[str, Corpus]:
    """(format name, pairs per split) for task.path."""
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        if not any(
            (path / name).is_file() for name in ("dataset_dict.json", "dataset_info.json", "state.json")
        ):
            raise ConfigError(f"task.path: {path} is a folder but not one written by datasets' save_to_disk")
        datasets = require("datasets", extra="hf", feature="Hugging Face dataset folders")
        return "hf_disk", read_hf(datasets.load_from_disk(str(path)), cfg, str(path))
    if path.is_file():
        if path.suffix in JSON_SUFFIXES:
            return "jsonl", {"train": read_jsonl(path, cfg)}
        return "tsv", {"train": read_tsv(path)}
    languages = moses_languages(path, cfg)
    if languages is not None:
        return "moses", read_moses(path, languages)
    if looks_local(cfg.path):
        raise ConfigError(f"task.path: {path}: no such file, Moses prefix or dataset folder")
    return "hf_hub", read_hub(cfg)


def read_hub(cfg: TaskConfig) -> Corpus:
    datasets = require("datasets", extra="hf", feature="Hugging Face Hub datasets")
    try:
        dataset = datasets.load_dataset(cfg.path, cfg.hf_config)
    except Exception as e:  # offline, unknown name, missing configuration: all one bad-input line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"task.path: {cfg.path!r} is no local corpus and not loadable from the hub ({reason})"
        ) from None
    return read_hf(dataset, cfg, f"hub:{cfg.path}")


def hold_out(corpus: Corpus, cfg: TaskConfig, seed: int) -> Corpus:
    """Carves the missing valid / test splits out of train by a seeded shuffle, corpus order kept in each."""
    train = corpus["train"]
    missing = [split for split in ("test", "valid") if not corpus.get(split)]
    order = np.random.default_rng([seed, 11]).permutation(len(train))
    out, start = dict(corpus), 0
    for split in missing:
        size = min(getattr(cfg, f"n_{split}"), len(train) // 10)
        out[split] = [train[i] for i in sorted(order[start : start + size])]
        start += size
    out["train"] = [train[i] for i in sorted(order[start:])]
    return out


def length_filter(splits: dict[str, list[Example]], cfg: TaskConfig) -> dict[str, list[Example]]:
    """train / valid within [min_tokens, max_tokens] tokens a side; test up to long_cut, test_long beyond."""
    lo = cfg.min_tokens
    hi = {"train": cfg.max_tokens, "valid": cfg.max_tokens, "test": cfg.long_cut}

    def shortest(ex: Example) -> int:
        return min(len(ex.src), len(ex.tgt))

    def longest(ex: Example) -> int:
        return max(len(ex.src), len(ex.tgt))

    def within(ex: Example, name: str) -> bool:
        return lo <= shortest(ex) and (hi[name] is None or longest(ex) <= hi[name])

    kept = {name: [ex for ex in splits[name] if within(ex, name)] for name in SPLITS[:3]}
    kept["test_long"] = [ex for ex in splits["test"] if lo <= shortest(ex) and not within(ex, "test")]
    return kept


TRAIN_CAP = 13  # with the trial's seed, the stream that draws task.max_examples' training pairs


def sample(items: list, size: int | None, entropy: int | list[int]) -> list:
    """At most `size` of `items` (None: all), drawn by numpy seeded with `entropy`, in their order."""
    if size is None or len(items) <= size:
        return items
    picked = np.random.default_rng(entropy).choice(len(items), size=size, replace=False)
    return [items[i] for i in sorted(picked)]


def parallel_task(cfg: TaskConfig, seed: int) -> TaskData:
    if not cfg.path:
        raise ConfigError(
            "task.path: the parallel task needs a corpus (TSV, JSONL, Moses prefix or HF dataset)"
        )
    fmt, corpus = read_corpus(cfg)
    if not any(corpus.values()):
        raise ConfigError(f"{cfg.path}: empty corpus (no source/target pairs)")
    return corpus_task("parallel", hold_out(corpus, cfg, seed), cfg, seed, {"format": fmt, "path": cfg.path})


def corpus_task(name: str, corpus: Corpus, cfg: TaskConfig, seed: int, meta: dict) -> TaskData:
    """A text task (parallel, bible) from raw train / valid / test pairs: tokenizers learned on train, the
    length filter (longer test pairs become test_long), then task.max_examples' seeded cap on train."""
    src_tokenizer, tgt_tokenizer = (
        build_tokenizer(cfg.tokenizer, [pair[side] for pair in corpus["train"]], cfg.bpe_vocab_size)
        for side in (0, 1)
    )
    tokenized = {
        split: [Example(tuple(src_tokenizer.tokenize(s)), tuple(tgt_tokenizer.tokenize(t))) for s, t in pairs]
        for split, pairs in corpus.items()
    }
    splits = length_filter(tokenized, cfg)
    splits["train"] = sample(splits["train"], cfg.max_examples, [seed, TRAIN_CAP])
    return TaskData(
        name, splits,
        Vocab.from_examples(splits["train"], "src"), Vocab.from_examples(splits["train"], "tgt"),
        train_max_len=longest_target(splits["train"]), meta=meta, is_text=True,
        src_tokenizer=src_tokenizer, tgt_tokenizer=tgt_tokenizer,
    )  # fmt: skip
