"""Text <-> tokens for real corpora: characters, words, or BPE learned on the training split only.

TOKENIZERS, by each kind's name, is the one list of names `task.tokenizer` accepts. Each tokenizer saves to
one JSON file, so a run keeps exactly the segmentation it was trained with."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ablate.models.sequences import UNK


class RuleTokenizer:
    """A tokenizer with nothing learned: training takes nothing from the texts, saving records only its
    kind, and it reads no task.* key beyond task.tokenizer."""

    kind: str
    reads: tuple[str, ...] = ()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> RuleTokenizer:
        return cls()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"kind": self.kind}))


class CharTokenizer(RuleTokenizer):
    kind = "char"

    def tokenize(self, text: str) -> list[str]:
        return list(text)

    def detokenize(self, tokens: Iterable[str]) -> str:
        return "".join(tokens)


class WordTokenizer(RuleTokenizer):
    """Words and runs of punctuation, split the way HF's Whitespace pre-tokenizer splits them."""

    kind = "word"
    pattern = re.compile(r"\w+|[^\w\s]+")

    def tokenize(self, text: str) -> list[str]:
        return self.pattern.findall(text)

    def detokenize(self, tokens: Iterable[str]) -> str:
        return " ".join(tokens)


class BpeTokenizer:
    """Byte-pair encoding over Metaspace words ('▁' marks a word start), so decoding restores the spaces."""

    kind = "bpe"
    reads = ("bpe_vocab_size",)  # the task.* keys it reads beyond task.tokenizer

    def __init__(self, tokenizer: HFTokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
        tokenizer = HFTokenizer(models.BPE(unk_token=UNK))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK], show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    def tokenize(self, text: str) -> list[str]:
        return self.tokenizer.encode(text).tokens

    def detokenize(self, tokens: Iterable[str]) -> str:
        return self.tokenizer.decoder.decode(list(tokens))

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))


Tokenizer = CharTokenizer | WordTokenizer | BpeTokenizer
TOKENIZERS: dict[str, type[Tokenizer]] = {
    cls.kind: cls for cls in (CharTokenizer, WordTokenizer, BpeTokenizer)
}
# Each task.* key a tokenizer reads -> the tokenizers that read it: a corpus task ignores it with any other.
TOKENIZER_KEYS = {key: [name for name, cls in TOKENIZERS.items() if key in cls.reads]
                  for cls in TOKENIZERS.values() for key in cls.reads}  # fmt: skip


def build_tokenizer(kind: str, training_texts: list[str], bpe_vocab_size: int) -> Tokenizer:
    """The tokenizer TOKENIZERS names `kind`, learned on the training texts (BPE: with bpe_vocab_size)."""
    return TOKENIZERS[kind].train(training_texts, bpe_vocab_size)
