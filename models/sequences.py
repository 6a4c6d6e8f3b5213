"""Token sequences as every model, task and metric reads them: the special tokens' ids, and scoring.

A sequence is its ids through its first EOS, without padding or BOS (all of them if it never emits EOS).
Token accuracy compares the reference's positions through EOS (those the training loss averages over) with
the prediction's: one that stops early gets the rest wrong; tokens past the reference's EOS do not count.
Exact match: equal through EOS. Plain Python, so reports and configs can use it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0-3 in this order, in every vocabulary
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
# An image task's source (schema/tasks.py Task.image): its pixels as tokens, column by column from the left,
# each column top to bottom, this many a column; then EOS.
IMAGE_ROWS = 8


def through_eos(ids: Iterable[int]) -> list[int]:
    """The ids up to and including the first EOS, without padding or BOS."""
    out = []
    for i in ids:
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
            if i == EOS_ID:
                break
    return out


@dataclass(frozen=True)
class SequenceScore:
    length: int  # reference tokens without EOS: what accuracy-by-length tables bucket on
    exact: bool
    correct: int  # reference positions (through EOS) where the prediction has the reference's token
    counted: int  # reference positions through EOS


def score(pred: Iterable[int], ref: Iterable[int]) -> SequenceScore:
    pred, ref = through_eos(pred), through_eos(ref)
    length = len(ref) - (ref[-1:] == [EOS_ID])
    return SequenceScore(length, pred == ref, sum(p == r for p, r in zip(pred, ref)), len(ref))


def summarise(scores: Sequence[SequenceScore]) -> dict[str, float]:
    """{n, seq_acc, tok_acc, tokens}: exact match over examples, token accuracy over counted positions."""
    tokens = sum(s.counted for s in scores)
    return {
        "n": len(scores),
        "seq_acc": sum(s.exact for s in scores) / len(scores) if scores else math.nan,
        "tok_acc": sum(s.correct for s in scores) / tokens if tokens else math.nan,
        "tokens": tokens,
    }
