"""Tensors and batches for a TaskData: src = tokens + EOS, tgt_in = BOS + tokens, tgt_out = tokens + EOS."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from harness.tasks.base import BOS_ID, EOS_ID, PAD_ID, Example, TaskData

EVAL_SPLITS = ("test", "test_long")


class EncodedSplit(Dataset):
    def __init__(self, examples: list[Example], data: TaskData):
        self.items = [
            (data.src_vocab.encode(ex.src) + [EOS_ID], [BOS_ID] + data.tgt_vocab.encode(ex.tgt) + [EOS_ID])
            for ex in examples
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.items[i]


def pad(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


def collate(batch: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    src, tgt = zip(*batch)
    tgt = pad(list(tgt))  # (B, T+1): BOS ... EOS
    return {"src": pad(list(src)), "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


class Seq2SeqDataModule(L.LightningDataModule):
    def __init__(self, data: TaskData, batch_size: int, seed: int, eval_batch_size: int = 256):
        super().__init__()
        self.data, self.batch_size, self.seed, self.eval_batch_size = data, batch_size, seed, eval_batch_size
        self.encoded = {name: EncodedSplit(ex, data) for name, ex in data.splits.items()}
        # The evaluation splits in dataloader order; empty ones (no test_long) are left out.
        self.eval_splits = [s for s in EVAL_SPLITS if len(self.encoded.get(s, ()))]

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        size = self.batch_size if shuffle else self.eval_batch_size
        return DataLoader(self.encoded[split], size, shuffle=shuffle, collate_fn=collate, generator=generator)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(split, shuffle=False) for split in self.eval_splits]
