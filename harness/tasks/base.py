"""What every task produces: token sequences with optional gold alignments, and vocabularies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)

# The split names every task provides; test_long holds lengths beyond training.
SPLITS = ("train", "valid", "test", "test_long")


@dataclass(frozen=True)
class Example:
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    # Gold word alignment as (source index, target index) pairs, where the task knows it.
    alignment: tuple[tuple[int, int], ...] | None = None


class Vocab:
    """Token <-> id, with the four specials first so ids 0-3 mean the same in every vocabulary."""

    def __init__(self, tokens: Iterable[str]):
        self.itos = list(SPECIALS) + sorted(set(tokens) - set(SPECIALS))
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def from_examples(cls, examples: Iterable[Example], side: str) -> Vocab:
        return cls(tok for ex in examples for tok in getattr(ex, side))

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.stoi.get(t, UNK_ID) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids to tokens, stopping at EOS and dropping padding and BOS."""
        out = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(self.itos[i])
        return out


@dataclass
class TaskData:
    name: str
    splits: dict[str, list[Example]]
    src_vocab: Vocab
    tgt_vocab: Vocab
    # Longest training source / target: the line between "seen" and "longer than training".
    train_max_len: int = 0
    meta: dict = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {name: len(examples) for name, examples in self.splits.items()}
