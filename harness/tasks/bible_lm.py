"""bible_lm: one Bible's running text for a causal language model, as Press et al. 2022 (ALiBi) test
extrapolation: train on windows of L = task.max_tokens tokens, test on windows of L, 2L and 4L of the same
text, so that only the length changes.

The verses are bible.py's: task.src_lang's module (`en`, the World English Bible, by default; `es`, or any
SWORD module's name) in task.path's library, cleaned and split by chapter as `bible` does, so no test
chapter is trained on. Each split's non-empty verses, in canonical order joined by spaces, become one token
stream (task.tokenizer, learned on the train verses alone), cut into consecutive non-overlapping windows (a
shorter remainder is left out):
- train: every window of L tokens, capped by task.max_examples with the trial's seed;
- valid: task.n_valid windows of L, drawn with bible's SAMPLE_SEED whatever the trial's seed;
  with task.train_factor k, train and valid windows are of kL tokens instead (the test splits unchanged);
- test, test_x2, test_x4: task.n_test // 4 windows of 4L drawn with SAMPLE_SEED, each cut into four windows
  of L (test), two of 2L (test_x2) or kept whole (test_x4): every test split scores the same tokens, only
  the context before each token changes.

An Example's target is a window, its source empty: the model reads EOS alone, which a decoder-only model
(model.cross_attention false) does not read at all. A window does not end in EOS (TaskData.target_ends says
why). Not a text task: no BLEU; perplexity over the window's tokens is the measure."""

from __future__ import annotations

import functools
from pathlib import Path

from ablate.harness.tasks.base import Example, TaskData, Vocab
from ablate.harness.tasks.bible import (
    DEFAULT_LANGS,
    SAMPLE_SEED,
    library,
    module_name,
    read_module,
    setup_problem,
    shared_chapters,
    split_by_chapter,
)
from ablate.harness.tasks.corpora import TRAIN_CAP, sample
from ablate.harness.tasks.tokenizers import build_tokenizer
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig
from ablate.schema.tasks import WINDOW_SPLITS

# Each test split -> its window length in training lengths.
TEST_WINDOWS = {"test": 1, **WINDOW_SPLITS}


@functools.lru_cache(maxsize=2)
def read_verses(folder: Path, name: str) -> dict[str, list[tuple[str, str]]]:
    """A module's non-empty verses as (book, text) split by chapter, canonical order kept; read once per
    process."""
    verses = read_module(folder, name)
    chapters = shared_chapters(verses, verses)  # every chapter of the versification
    return split_by_chapter(((ref, (ref[0], text)) for ref, text in verses.items() if text), chapters)


def windows(tokens: list[str], length: int) -> list[tuple[str, ...]]:
    """Consecutive windows of `length` tokens that do not overlap; a shorter remainder is left out."""
    return [tuple(tokens[i : i + length]) for i in range(0, len(tokens) - length + 1, length)]


def bible_lm_task(cfg: TaskConfig, seed: int) -> TaskData:
    name = module_name(cfg.src_lang or DEFAULT_LANGS[0])
    problem = setup_problem(cfg, (name,))
    if problem:
        raise ConfigError(problem)
    folder, length = library(cfg), cfg.max_tokens
    verses = {split: [text for _, text in items] for split, items in read_verses(folder.resolve(), name).items()}
    tokenizer = build_tokenizer(cfg.tokenizer, verses["train"], cfg.bpe_vocab_size)
    stream = {split: tokenizer.tokenize(" ".join(texts)) for split, texts in verses.items()}
    longest = max(TEST_WINDOWS.values())
    spans = sample(windows(stream["test"], longest * length), cfg.n_test // longest, SAMPLE_SEED)
    if not spans:
        raise ConfigError(
            f"task.n_test: {cfg.n_test} windows of {length} tokens hold no test window of {longest} x "
            f"max_tokens (the test text has {len(stream['test'])} tokens); give n_test at least {longest}, or a shorter max_tokens"
        )
    trained = cfg.train_factor * length
    valid = sample(windows(stream["valid"], trained), cfg.n_valid, SAMPLE_SEED)
    cut = {"train": windows(stream["train"], trained), "valid": valid,
           **{split: [w for span in spans for w in windows(list(span), factor * length)]
              for split, factor in TEST_WINDOWS.items()}}  # fmt: skip
    splits = {split: [Example((), window) for window in cut_windows] for split, cut_windows in cut.items()}
    splits["train"] = sample(splits["train"], cfg.max_examples, [seed, TRAIN_CAP])
    meta = {"path": str(folder), "module": name, "tokens": {split: len(tokens) for split, tokens in stream.items()}}
    return TaskData(
        "bible_lm", splits, Vocab(()), Vocab.from_examples(splits["train"], "tgt"), train_max_len=trained,
        meta=meta, tgt_tokenizer=tokenizer, target_ends=False,
    )  # fmt: skip
