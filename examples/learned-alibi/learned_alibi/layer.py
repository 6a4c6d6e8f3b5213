"""The layer of learned-alibi, imported only when a model is built (torch loads slowly; config checks and
reports import the plug-in's entry without it)."""

from __future__ import annotations

import torch
from torch import nn


class LearnedALiBi(nn.Module):
    def __init__(self, heads: int, start: str):
        super().__init__()
        if start == "alibi":
            slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
        else:
            slopes = torch.full((heads,), 2**-4)
        self.raw = nn.Parameter(torch.log(torch.expm1(slopes)))  # softplus(raw) = the starting slopes

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        """(H, q_len, k_len), or (K, H, q_len, k_len) with fused seeds (raw is then (K, H)); the queries are
        the last q_len of the k_len positions."""
        i = torch.arange(k_len - q_len, k_len, device=self.raw.device).unsqueeze(1)
        j = torch.arange(k_len, device=self.raw.device).unsqueeze(0)
        distance = (i - j).abs().to(self.raw.dtype)  # (q_len, k_len)
        return -nn.functional.softplus(self.raw)[..., :, None, None] * distance


def reference(part: LearnedALiBi, cfg, q_len: int, k_len: int) -> torch.Tensor:
    """-m_h·|i - j| with m_h = softplus(w_h), entry by entry: what `ablate check` compares in float64."""
    m = nn.functional.softplus(part.raw)  # (H,)
    rows = [torch.stack([-m * abs(i - j) for j in range(k_len)], -1) for i in range(k_len - q_len, k_len)]
    return torch.stack(rows, -2)  # (H, q_len, k_len)
