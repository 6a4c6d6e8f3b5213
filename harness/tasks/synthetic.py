"""Algorithmic tasks generated from the seed: the same (config, seed) always gives the same data.

Each task draws one example for a given "length" (symbols for copy / reverse / sort, digits of the
longer operand for addition, key-value pairs for recall). Train, valid and test use lengths
[min_len, max_len]; test_long uses (max_len, test_max_len]. Test and valid never repeat a training
source, so exact match measures generalisation."""

from __future__ import annotations

import string
from collections.abc import Callable

import numpy as np

from ablate.harness.tasks.base import Example, TaskData, Vocab, longest_target
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

Sampler = Callable[[np.random.Generator, int], Example]  # one random example of the given length
Transform = Callable[[tuple[str, ...]], tuple[tuple[str, ...], tuple[tuple[int, int], ...]]]

RECALL_KEYS = tuple(string.ascii_lowercase)
# cues: each label's cue words; every other token of a text is a symbol that says nothing of its label.
CUES = {"positive": ("good", "great", "nice"), "negative": ("bad", "awful", "poor")}
# (positive, negative) cue counts a text of at least three tokens may hold: one to three cues, never a tie.
CUE_COUNTS = ((1, 0), (0, 1), (2, 0), (0, 2), (3, 0), (2, 1), (1, 2), (0, 3))
QUERY = "?"
PLUS = "+"
DIGITS = tuple(string.digits)


def copy_transform(src: tuple[str, ...]):
    return src, tuple((i, i) for i in range(len(src)))


def reverse_transform(src: tuple[str, ...]):
    n = len(src)
    return src[::-1], tuple((n - 1 - j, j) for j in range(n))


def sort_transform(src: tuple[str, ...]):
    # A stable sort, so equal symbols keep their order and the alignment is one permutation.
    order = sorted(range(len(src)), key=lambda i: int(src[i]))
    return tuple(src[i] for i in order), tuple((i, j) for j, i in enumerate(order))


def symbol_sampler(symbols: list[str], transform: Transform) -> Sampler:
    def sample(rng: np.random.Generator, length: int) -> Example:
        src = tuple(symbols[i] for i in rng.integers(0, len(symbols), size=length))
        tgt, alignment = transform(src)
        return Example(src, tgt, alignment)

    return sample


def random_number(rng: np.random.Generator, digits: int) -> str:
    """A uniform number of exactly `digits` digits (0 counts as one), drawn digit by digit: any length."""
    first = int(rng.integers(0 if digits == 1 else 1, 10))
    return str(first) + "".join(str(d) for d in rng.integers(0, 10, size=digits - 1))


def addition_sampler(min_digits: int) -> Sampler:
    """'a + b' digit by digit, most significant first; the longer operand has `length` digits and
    stands first or second at random. Uniform digits give carries in about half the columns."""

    def sample(rng: np.random.Generator, length: int) -> Example:
        a = random_number(rng, length)
        b = random_number(rng, int(rng.integers(min_digits, length + 1)))
        if rng.random() < 0.5:
            a, b = b, a
        return Example((*a, PLUS, *b), tuple(str(int(a) + int(b))))

    return sample


def recall_sampler(values: list[str]) -> Sampler:
    """Associative recall: 'k1 v1 k2 v2 ... ? kq' -> the value stored under kq. Keys are distinct;
    the gold alignment points the answer at the queried value."""

    def sample(rng: np.random.Generator, pairs: int) -> Example:
        keys = rng.choice(len(RECALL_KEYS), size=pairs, replace=False)
        vals = rng.integers(0, len(values), size=pairs)
        query = int(rng.integers(0, pairs))
        src = tuple(tok for k, v in zip(keys, vals) for tok in (RECALL_KEYS[k], values[v]))
        return Example((*src, QUERY, RECALL_KEYS[keys[query]]), (values[vals[query]],), ((2 * query + 1, 0),))

    return sample


def cues_sample(symbols: list[str]) -> Sampler:
    """A text of `length` tokens: one to three cue words (CUES) at random places among random symbols; its
    label is the label of most of its cues (CUE_COUNTS: never a tie). Its gold alignment links the label to
    every cue: the rationale, as the hotel review's highlighted phrases."""

    def sample(rng: np.random.Generator, length: int) -> Example:
        counts = CUE_COUNTS[int(rng.integers(0, len(CUE_COUNTS)))]
        cues = [CUES[label][int(rng.integers(0, 3))] for label, n in zip(CUES, counts) for _ in range(n)]
        places = rng.choice(length, size=len(cues), replace=False)
        text = [symbols[i] for i in rng.integers(0, len(symbols), size=length)]
        for place, cue in zip(places, cues):
            text[place] = cue
        label = list(CUES)[int(counts[1] > counts[0])]
        return Example(tuple(text), (label,), tuple((int(p), 0) for p in sorted(places)))

    return sample


def _sample_split(
    rng: np.random.Generator, n: int, lo: int, hi: int, sample: Sampler, exclude: set
) -> list[Example]:
    """Up to n examples with distinct sources outside `exclude` (fewer when the space is small)."""
    examples, seen = [], set(exclude)
    for _ in range(50 * n):
        if len(examples) == n:
            break
        example = sample(rng, int(rng.integers(lo, hi + 1)))
        if example.src not in seen:
            seen.add(example.src)
            examples.append(example)
    return examples


def sample_splits(
    name: str, sample: Sampler | dict[str, Sampler], cfg: TaskConfig, seed: int, shortest: int = 1
) -> dict:
    """Every split of a generated task; `sample`: one sampler for every split, or one each for train, valid and
    test (test_long draws as test does); `shortest` is the least length the task can produce."""
    if cfg.max_len < shortest:
        raise ConfigError(
            f"task.max_len: {name} examples have length at least {shortest} (got {cfg.max_len})"
        )
    samplers = sample if isinstance(sample, dict) else dict.fromkeys(("train", "valid", "test"), sample)
    # One independent stream per split: changing n_train does not change the test set.
    streams = np.random.SeedSequence([seed, sum(map(ord, name))]).spawn(4)
    rngs = [np.random.default_rng(s) for s in streams]
    lo, hi, long_hi = max(cfg.min_len, shortest), cfg.max_len, cfg.long_max_len
    test = _sample_split(rngs[2], cfg.n_test, lo, hi, samplers["test"], set())
    valid = _sample_split(rngs[1], cfg.n_valid, lo, hi, samplers["valid"], {e.src for e in test})
    held_out = {e.src for e in test} | {e.src for e in valid}
    train = _sample_split(rngs[0], cfg.n_train, lo, hi, samplers["train"], held_out)
    has_long = cfg.long_cut is not None  # the one statement of when a task has a test_long split
    test_long = []
    if has_long:
        test_long = _sample_split(rngs[3], cfg.n_test, hi + 1, long_hi, samplers["test"], set())
    return {"train": train, "valid": valid, "test": test, "test_long": test_long}


def symbol_task(name: str, sample: Sampler, tokens: list[str], cfg: TaskConfig, seed: int) -> TaskData:
    splits = sample_splits(name, sample, cfg, seed)
    # The vocabulary is every symbol the task can emit, so longer test inputs never meet <unk>.
    vocab = Vocab(tokens)
    return TaskData(name, splits, vocab, vocab, train_max_len=longest_target(splits["train"]))


def _symbols(cfg: TaskConfig) -> list[str]:
    return [str(i) for i in range(cfg.vocab_size)]


def copy_task(cfg: TaskConfig, seed: int) -> TaskData:
    return symbol_task("copy", symbol_sampler(_symbols(cfg), copy_transform), _symbols(cfg), cfg, seed)


def reverse_task(cfg: TaskConfig, seed: int) -> TaskData:
    return symbol_task("reverse", symbol_sampler(_symbols(cfg), reverse_transform), _symbols(cfg), cfg, seed)


def sort_task(cfg: TaskConfig, seed: int) -> TaskData:
    return symbol_task("sort", symbol_sampler(_symbols(cfg), sort_transform), _symbols(cfg), cfg, seed)


def addition_task(cfg: TaskConfig, seed: int) -> TaskData:
    return symbol_task("addition", addition_sampler(cfg.min_len), [*DIGITS, PLUS], cfg, seed)


def cues_task(cfg: TaskConfig, seed: int) -> TaskData:
    symbols = _symbols(cfg)
    splits = sample_splits("cues", cues_sample(symbols), cfg, seed, shortest=3)
    cues = [cue for words in CUES.values() for cue in words]
    return TaskData("cues", splits, Vocab([*symbols, *cues]), Vocab(CUES), train_max_len=1, target_ends=False)


def recall_task(cfg: TaskConfig, seed: int) -> TaskData:
    if cfg.long_max_len > len(RECALL_KEYS):
        raise ConfigError(
            f"task.test_max_len: recall has {len(RECALL_KEYS)} distinct keys, so at most "
            f"{len(RECALL_KEYS)} pairs (got {cfg.long_max_len}; it defaults to 2 * max_len)"
        )
    values = _symbols(cfg)
    return symbol_task("recall", recall_sampler(values), [*RECALL_KEYS, *values, QUERY], cfg, seed)
