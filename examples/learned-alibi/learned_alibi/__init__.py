"""ALiBi (Press et al. 2022) with its slopes learned: a bias -softplus(w_h)·|i - j| per head, the w_h
started at ALiBi's geometric slopes (so the model starts as ALiBi and may move away). Close to KERPLE's
power kernel at p = 1 (Chi et al. 2022), which learns the slope too."""

from __future__ import annotations

import torch
from torch import nn

from ablate.models.positional import PositionalKind


class LearnedALiBi(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
        self.raw = nn.Parameter(torch.log(torch.expm1(slopes)))  # softplus(raw) = ALiBi's slopes

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        """(H, q_len, k_len), or (K, H, q_len, k_len) with fused seeds (raw is then (K, H)); the queries are
        the last q_len of the k_len positions."""
        i = torch.arange(k_len - q_len, k_len, device=self.raw.device).unsqueeze(1)
        j = torch.arange(k_len, device=self.raw.device).unsqueeze(0)
        distance = (i - j).abs().to(self.raw.dtype)  # (q_len, k_len)
        return -nn.functional.softplus(self.raw)[..., :, None, None] * distance


LEARNED_ALIBI = PositionalKind(score_bias=lambda layers, cfg, bidirectional: LearnedALiBi(cfg.heads))
