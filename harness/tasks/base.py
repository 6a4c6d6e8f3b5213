"""What every task produces: token sequences with optional gold alignments, and vocabularies."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.models.sequences import EOS_ID, SPECIALS, UNK_ID, through_eos
from ablate.schema.tasks import TEST_SPLITS

if TYPE_CHECKING:
    from ablate.harness.tasks.tokenizers import Tokenizer

# The split names a task may provide; the test splits are schema/tasks.py's.
SPLITS = ("train", "valid", *TEST_SPLITS)


@dataclass(frozen=True)
class Example:
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    # Gold word alignment as (source index, target index) pairs, where the task knows it: the sure links.
    alignment: tuple[tuple[int, int], ...] | None = None
    # Och & Ney's possible links beside them, which an alignment may hold or lack unpenalised (an image's
    # digit: any of its pixels is a right place to look, none the one right place).
    possible: tuple[tuple[int, int], ...] = ()


class Vocab:
    """Token <-> id, with the four specials first so ids 0-3 mean the same in every vocabulary."""

    def __init__(self, tokens: Iterable[str]):
        self.itos = list(SPECIALS) + sorted(set(tokens) - set(SPECIALS))
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def from_examples(cls, examples: Iterable[Example], side: str) -> Vocab:
        return cls(tok for ex in examples for tok in getattr(ex, side))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.itos, ensure_ascii=False), encoding="utf-8")

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        return [self.stoi.get(t, UNK_ID) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids to tokens, stopping at EOS and dropping padding and BOS."""
        return [self.itos[i] for i in self.strip_ids(ids)]

    @staticmethod
    def strip_ids(ids: Iterable[int]) -> list[int]:
        """The ids that are tokens: up to the first EOS, without padding or BOS."""
        return [int(i) for i in through_eos(ids) if i != EOS_ID]


@dataclass
class TaskData:
    name: str
    splits: dict[str, list[Example]]
    src_vocab: Vocab
    tgt_vocab: Vocab
    # Longest training target in tokens: the line between "seen" and "longer than training" lengths.
    train_max_len: int = 0
    meta: dict = field(default_factory=dict)
    # Text tasks are scored with BLEU / chrF on detokenized output as well as exact match.
    is_text: bool = False
    # Whether a target ends in EOS. A window of running text does not end: trained to close every window
    # with EOS after L tokens, a language model learns where L is, and every longer window leaves what it
    # was trained on at L + 1, whatever its positions.
    target_ends: bool = True
    # How corpus text became tokens (parallel corpora); None means tokens joined by spaces.
    src_tokenizer: Tokenizer | None = None
    tgt_tokenizer: Tokenizer | None = None

    def sizes(self) -> dict[str, int]:
        return {name: len(examples) for name, examples in self.splits.items()}

    def target_text(self, tokens: Sequence[str]) -> str:
        return self.tgt_tokenizer.detokenize(tokens) if self.tgt_tokenizer else " ".join(tokens)

    def save(self, directory: str | Path) -> None:
        """What encodes new inputs and reads outputs as this run did: src_vocab.json / tgt_vocab.json (id ->
        token lists), src_tokenizer.json / tgt_tokenizer.json for tokenized text (a Hugging Face tokenizers
        file for BPE, {"kind": ...} for char and word), and task.json (name, split sizes, meta)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.src_vocab.save(out / "src_vocab.json")
        self.tgt_vocab.save(out / "tgt_vocab.json")
        for side, tokenizer in (("src", self.src_tokenizer), ("tgt", self.tgt_tokenizer)):
            if tokenizer is not None:
                tokenizer.save(out / f"{side}_tokenizer.json")
        summary = {"name": self.name, "sizes": self.sizes(), "train_max_len": self.train_max_len, **self.meta}
        (out / "task.json").write_text(json.dumps(summary, indent=2))


def longest_target(examples: Iterable[Example]) -> int:
    return max((len(ex.tgt) for ex in examples), default=0)
