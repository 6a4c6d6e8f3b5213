"""Tensors and batches for a TaskData: src = tokens + EOS, tgt_in = BOS + tokens, tgt_out = tokens + EOS.

Batches hold a fixed number of examples (train.batch_size) or, with train.batch_tokens, as many as fit a
token budget, similar lengths bucketed so little is padding. Training order depends on (seed, epoch) alone;
evaluation keeps the split's order, so a test stream's i-th example is data.splits[split][i]."""

from __future__ import annotations

from functools import partial

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ablate.harness.tasks.base import Example, TaskData
from ablate.models.sequences import BOS_ID, EOS_ID, PAD_ID
from ablate.models.steps import padded_length
from ablate.schema.tasks import TEST_SPLITS


class EncodedSplit(Dataset):
    def __init__(self, examples: list[Example], data: TaskData):
        end = [EOS_ID] if data.target_ends else []
        self.items = [
            (data.src_vocab.encode(ex.src) + [EOS_ID], [BOS_ID] + data.tgt_vocab.encode(ex.tgt) + end)
            for ex in examples
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.items[i]

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Per example: source length (with EOS) and decoder length (target + 1, as tgt_in / tgt_out)."""
        src = np.array([len(s) for s, _ in self.items], dtype=np.int64)
        tgt = np.array([len(t) - 1 for _, t in self.items], dtype=np.int64)
        return src, tgt


def pad(seqs: list[list[int]], width: int | None = None) -> torch.Tensor:
    """(B, width) ids, PAD after each sequence; width: the longest by default."""
    out = torch.full((len(seqs), width or max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


def collate(
    batch: list[tuple[list[int], list[int]]], caps: tuple[int, int] | None = None
) -> dict[str, torch.Tensor]:
    """caps: the split's longest source and decoder input (tgt_in), for a compiled step's bounded set of
    lengths (models/steps.py padded_length); None pads to the batch's own longest."""
    src, tgt = zip(*batch)
    src_width = tgt_width = None
    if caps is not None:
        src_width = padded_length(max(map(len, src)), caps[0])
        tgt_width = padded_length(max(map(len, tgt)) - 1, caps[1]) + 1
    tgt = pad(list(tgt), tgt_width)  # (B, T+1): BOS ... EOS
    return {"src": pad(list(src), src_width), "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def pack(order: np.ndarray, lengths: np.ndarray, batch_tokens: int) -> list[list[int]]:
    """Consecutive runs of `order` whose padded size (examples x longest) stays within the budget;
    an example longer than the budget gets a batch of its own."""
    batches, current, longest = [], [], 0
    for i in order.tolist():
        grown = max(longest, int(lengths[i]))
        if current and (len(current) + 1) * grown > batch_tokens:
            batches.append(current)
            current, grown = [], int(lengths[i])
        current.append(i)
        longest = grown
    return batches + [current] if current else batches


class BatchSampler(Sampler[list[int]]):
    """Index batches of one split, by count (batch_size) or token budget (batch_tokens). shuffle (training):
    a seeded order per epoch; with a budget, examples sorted by length (ties in that random order), packed,
    and the batches shuffled, so each batch is one length bucket. Else (evaluation): the split's order."""

    def __init__(
        self, lengths: np.ndarray, seed: int, shuffle: bool, batch_size: int | None = None,
        batch_tokens: int | None = None,
    ):  # fmt: skip
        if (batch_size is None) == (batch_tokens is None):
            raise ValueError("give exactly one of batch_size and batch_tokens")
        self.lengths, self.seed, self.shuffle = lengths, seed, shuffle
        self.batch_size, self.batch_tokens = batch_size, batch_tokens
        self.epoch = 0
        self.skip = 0
        # The number of batches is the same every epoch: packing sorted lengths does not see tie order.
        self.num_batches = len(self.batches(0))

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before each epoch; without it each pass over the sampler is the next epoch."""
        self.epoch = epoch

    def batches(self, epoch: int) -> list[list[int]]:
        n = len(self.lengths)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.batch_tokens is None:
            return [order[i : i + self.batch_size].tolist() for i in range(0, n, self.batch_size)]
        if self.shuffle:
            order = order[np.argsort(self.lengths[order], kind="stable")]
        batches = pack(order, self.lengths, self.batch_tokens)
        return [batches[i] for i in rng.permutation(len(batches))] if self.shuffle else batches

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """The next pass is `epoch`'s, from its batch `batches_done` on (a run resumed mid-epoch)."""
        self.epoch, self.skip = epoch, batches_done

    def __iter__(self):
        batches = self.batches(self.epoch)[self.skip :]
        self.epoch, self.skip = self.epoch + 1, 0
        yield from batches

    def __len__(self) -> int:
        return self.num_batches


class Seq2SeqDataModule(L.LightningDataModule):
    """Loaders for a TaskData. `batch_tokens`: every batch sized by a token budget (batch_size and
    eval_batch_size unused). `bounded_lengths` (a compiled step): lengths rounded up to `collate`'s caps."""

    def __init__(
        self, data: TaskData, batch_size: int, seed: int, eval_batch_size: int = 256, *,
        batch_tokens: int | None = None, bounded_lengths: bool = False,
    ):  # fmt: skip
        super().__init__()
        self.data, self.batch_size, self.seed, self.eval_batch_size = data, batch_size, seed, eval_batch_size
        self.batch_tokens, self.bounded_lengths = batch_tokens, bounded_lengths
        self.encoded = {name: EncodedSplit(ex, data) for name, ex in data.splits.items()}
        # The evaluation splits in dataloader order; empty ones (no test_long) are left out.
        self.eval_splits = [s for s in TEST_SPLITS if len(self.encoded.get(s, ()))]
        # Each split's longest source and decoder input: what its bounded lengths stop at.
        self.caps: dict[str, tuple[int, int]] = {}
        for split, encoded in self.encoded.items():
            if bounded_lengths and len(encoded):
                src, tgt = encoded.lengths()
                self.caps[split] = (int(src.max()), int(tgt.max()))

    def sampler(self, split: str, shuffle: bool) -> BatchSampler:
        src, tgt = self.encoded[split].lengths()
        if self.batch_tokens is not None:
            return BatchSampler(np.maximum(src, tgt), self.seed, shuffle, batch_tokens=self.batch_tokens)
        size = self.batch_size if shuffle else self.eval_batch_size
        return BatchSampler(src, self.seed, shuffle, batch_size=size)

    def collate(self, split: str, batch: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """A batch of `split` as its loader gives it."""
        return collate(batch, self.caps.get(split))

    def padding_fraction(self, split: str = "train") -> float:
        """Share of padding among the src and tgt_in positions of one epoch's batches of `split`."""
        src, tgt = self.encoded[split].lengths()
        padded = real = 0
        for batch in self.sampler(split, shuffle=split == "train").batches(0):
            padded += len(batch) * (src[batch].max() + tgt[batch].max())
            real += src[batch].sum() + tgt[batch].sum()
        return float(1 - real / padded) if padded else 0.0

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # Pinned host memory lets Lightning's non-blocking copy overlap the transfer with GPU work. Each
        # iterator draws a base seed; from its own generator, so the global RNG (dropout) is the same
        # whenever a loader starts, and a resumed run continues its stream (harness.checkpoints).
        return DataLoader(
            self.encoded[split], batch_sampler=self.sampler(split, shuffle), collate_fn=partial(self.collate, split),
            pin_memory=torch.cuda.is_available(), generator=torch.Generator().manual_seed(self.seed),
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", shuffle=False)

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(split, shuffle=False) for split in self.eval_splits]
