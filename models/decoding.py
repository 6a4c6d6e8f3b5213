"""Decoding over the incremental interface every model family has:
`init_state(src) -> dict of batch-first tensors` and `step(state, prev (B,)) -> (logits (B, V), state)`."""

from __future__ import annotations

import torch
from torch import nn


def max_target_length(src: torch.Tensor, pad_id: int, ratio: float = 2.0, extra: int = 10) -> int:
    """Longest output worth generating, derived from the longest source in the batch."""
    return int((src != pad_id).sum(1).max().item() * ratio) + extra


@torch.no_grad()
def greedy_decode(
    model: nn.Module, src: torch.Tensor, bos_id: int, eos_id: int, pad_id: int, max_len: int | None = None
) -> torch.Tensor:
    """Batched greedy search: (B, S) -> (B, L) token ids without BOS, EOS kept, padded with pad_id."""
    max_len = max_len or max_target_length(src, pad_id)
    state = model.init_state(src)
    prev = torch.full((src.size(0),), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    out = []
    for _ in range(max_len):
        logits, state = model.step(state, prev)
        prev = logits.argmax(-1).masked_fill(finished, pad_id)
        out.append(prev)
        finished |= prev == eos_id
        if finished.all():
            break
    return torch.stack(out, dim=1)
