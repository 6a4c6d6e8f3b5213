"""What the figures time: the sizes of a bench run, synthetic batches of random tokens, a closure of
training steps on one batch, and the model configs compared."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ablate.bench.timing import autocast
from ablate.models.config import ModelConfig
from ablate.models.sequences import BOS_ID, PAD_ID
from ablate.models.steps import token_cross_entropy


@dataclass(frozen=True)
class Sizes:
    """Model and batch sizes of one bench run; the CPU ones are small enough for a shared laptop-class CPU."""

    d_model: int
    heads: int
    d_ff: int
    layers: int
    batch: int
    length: int  # longest source / target in the synthetic batches; lengths are drawn in [length/2, length]
    vocab: int
    steps: int  # training steps per timed repeat
    repeats: int
    warmup: int = 1
    budget_s: float = 60.0  # no new repeat after this long (timing.interleaved): each figure ends in bounded time

    def recurrent(self) -> Sizes:
        """The LSTM family's sizes: at most 2 layers of length 64, whose step loop runs a kernel per layer
        and position (6 layers at length 128 did not finish in minutes on an H100)."""
        return replace(self, layers=min(self.layers, 2), length=min(self.length, 64))


def bench_sizes(device: torch.device, quick: bool) -> Sizes:
    if device.type == "cuda":
        if quick:
            return Sizes(256, 4, 1024, 2, 32, 64, 1000, steps=3, repeats=3)
        return Sizes(512, 8, 2048, 6, 64, 128, 8000, steps=10, repeats=7, warmup=3)
    if quick:
        return Sizes(32, 2, 64, 1, 8, 12, 32, steps=1, repeats=1)
    return Sizes(128, 4, 512, 2, 32, 32, 64, steps=3, repeats=5)


# Synthetic batches and training steps ------------------------------------------------------------------


def random_batch(
    sizes: Sizes, device: torch.device, seed: int = 0, padded: bool = True
) -> dict[str, torch.Tensor]:
    """src (B, S), tgt_in / tgt_out (B, T) of random tokens; with `padded`, lengths vary in [S/2, S]."""
    g = torch.Generator().manual_seed(seed)
    b, n = sizes.batch, sizes.length
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g) if padded else torch.full((b,), n)
    positions = torch.arange(n + 1)[None]
    src = torch.randint(4, sizes.vocab, (b, n), generator=g).masked_fill(
        positions[:, :n] >= lengths[:, None], PAD_ID
    )
    tgt = torch.randint(4, sizes.vocab, (b, n + 1), generator=g).masked_fill(
        positions > lengths[:, None], PAD_ID
    )
    tgt[:, 0] = BOS_ID
    batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
    return {k: v.to(device) for k, v in batch.items()}


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Source plus target tokens without padding: what the harness's tokens/s counts."""
    return int((batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum())


def training_steps(model: nn.Module, batch: dict[str, torch.Tensor], steps: int, device: torch.device):
    """A closure running `steps` AdamW steps of teacher-forced cross entropy on one batch, in train mode."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            with autocast(device):
                loss = token_cross_entropy(model(batch["src"], batch["tgt_in"]), batch["tgt_out"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return run


# Model configs compared --------------------------------------------------------------------------------


def transformer_config(sizes: Sizes, dropout: float = 0.1) -> ModelConfig:
    return ModelConfig(
        arch="transformer", d_model=sizes.d_model, heads=sizes.heads, d_ff=sizes.d_ff, layers=sizes.layers,
        dropout=dropout, norm="post", pos_encoding="sinusoidal",
    )  # fmt: skip


def lstm_configs(sizes: Sizes) -> dict[str, ModelConfig]:
    common = dict(arch="lstm", d_model=sizes.d_model, layers=sizes.layers, dropout=0.1)
    return {
        "lstm": ModelConfig(**common, attention="none"),
        "lstm-bahdanau": ModelConfig(**common, attention="additive", attention_query="previous"),
        # Luong's dot score with h_t, no input feeding: nothing from step t-1 enters step t.
        "luong-parallel": ModelConfig(
            **common, attention="dot", attention_query="current", input_feeding=False
        ),
    }
