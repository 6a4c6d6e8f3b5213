"""Text <-> tokens for real corpora: characters, words, or BPE learned on the training split only.

TOKENIZER_CLASSES holds each by its name in schema/tasks.py's TOKENIZERS (with the keys it reads). Each
saves to one JSON file, so a run keeps exactly the segmentation it was trained with."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ablate.models.sequences import UNK


class RuleTokenizer:
    """A tokenizer with nothing learned: training reads no text, and saving records only its kind."""

    kind: str

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
TOKENIZER_CLASSES: dict[str, type[Tokenizer]] = {
    cls.kind: cls for cls in (CharTokenizer, WordTokenizer, BpeTokenizer)
}


def build_tokenizer(kind: str, training_texts: list[str], bpe_vocab_size: int) -> Tokenizer:
    """TOKENIZER_CLASSES[kind] learned on the training texts (BPE: with bpe_vocab_size)."""
    return TOKENIZER_CLASSES[kind].train(training_texts, bpe_vocab_size)
