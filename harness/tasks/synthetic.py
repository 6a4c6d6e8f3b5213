"""Algorithmic tasks generated from the seed: the same (config, seed) always gives the same data.

Test and test_long never repeat a training source, so exact match measures generalisation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.tasks.base import Example, TaskData, Vocab

Transform = Callable[[tuple[str, ...]], tuple[tuple[str, ...], tuple[tuple[int, int], ...]]]


def copy_transform(src: tuple[str, ...]):
    return src, tuple((i, i) for i in range(len(src)))


def reverse_transform(src: tuple[str, ...]):
    n = len(src)
    return src[::-1], tuple((n - 1 - j, j) for j in range(n))


def _sample_split(
    rng: np.random.Generator, n: int, lo: int, hi: int, symbols: list[str], transform: Transform, exclude: set
) -> list[Example]:
    examples, seen = [], set(exclude)
    attempts = 0
    while len(examples) < n and attempts < 50 * n:
        attempts += 1
        length = int(rng.integers(lo, hi + 1))
        src = tuple(symbols[i] for i in rng.integers(0, len(symbols), size=length))
        if src in seen:
            continue
        seen.add(src)
        tgt, alignment = transform(src)
        examples.append(Example(src, tgt, alignment))
    return examples


def sequence_task(name: str, transform: Transform, cfg, seed: int) -> TaskData:
    """Random symbol strings of length [min_len, max_len] mapped by `transform`; test_long uses
    lengths (max_len, test_max_len]."""
    symbols = [str(i) for i in range(cfg.vocab_size)]
    # One independent stream per split: changing n_train does not change the test set.
    streams = np.random.SeedSequence([seed, sum(map(ord, name))]).spawn(4)
    rngs = [np.random.default_rng(s) for s in streams]
    lo, hi, long_hi = cfg.min_len, cfg.max_len, cfg.long_max_len
    test = _sample_split(rngs[2], cfg.n_test, lo, hi, symbols, transform, set())
    valid = _sample_split(rngs[1], cfg.n_valid, lo, hi, symbols, transform, {e.src for e in test})
    held_out = {e.src for e in test} | {e.src for e in valid}
    train = _sample_split(rngs[0], cfg.n_train, lo, hi, symbols, transform, held_out)
    test_long = (
        _sample_split(rngs[3], cfg.n_test, hi + 1, long_hi, symbols, transform, set()) if long_hi > hi else []
    )
    splits = {"train": train, "valid": valid, "test": test, "test_long": test_long}
    vocab = Vocab(symbols)
    return TaskData(name, splits, vocab, vocab, train_max_len=hi)


def copy_task(cfg, seed: int) -> TaskData:
    return sequence_task("copy", copy_transform, cfg, seed)


def reverse_task(cfg, seed: int) -> TaskData:
    return sequence_task("reverse", reverse_transform, cfg, seed)
