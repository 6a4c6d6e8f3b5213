"""Text <-> tokens for real corpora: characters, words, or BPE learned on the training split only.

Each tokenizer saves to one JSON file, so a run keeps exactly the segmentation it was trained with."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ablate.models.sequences import UNK


class RuleTokenizer:
    """A tokenizer with nothing learned: saving it records only its kind."""

    kind: str

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
RULE_TOKENIZERS: dict[str, type[RuleTokenizer]] = {"char": CharTokenizer, "word": WordTokenizer}


def build_tokenizer(kind: str, training_texts: list[str], bpe_vocab_size: int) -> Tokenizer:
    if kind == "bpe":
        return BpeTokenizer.train(training_texts, bpe_vocab_size)
    return RULE_TOKENIZERS[kind]()


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Reads back what `save` wrote: a {'kind': ...} stub for char / word, an HF tokenizer file for BPE."""
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    if saved.get("kind") in RULE_TOKENIZERS:
        return RULE_TOKENIZERS[saved["kind"]]()
    return BpeTokenizer(HFTokenizer.from_file(str(path)))
