"""Diagnostics of a layer's outputs (`Transformer.record_states`), as plain functions of tensors.

Rank collapse (Dong et al. 2021, "Attention is not all you need: pure attention loses rank doubly
exponentially with depth"): res(X) = X - 1 xᵀ, the distance from the nearest rank-1 matrix 1 xᵀ (every
token the same vector), relative to ||X||. The Frobenius norm, whose minimiser x is the mean token, stands
in for the paper's composite l1,inf norm (no closed form); both are 0 exactly when all tokens are equal.
"""

from __future__ import annotations

import torch


def rank_collapse(hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """hidden (B, L, D) -> ||X - 1 x̄ᵀ||_F / ||X||_F per sequence (B,), over the tokens where mask (B, L)
    is True; x̄ is the mean real token. 0 means every token has collapsed to the same vector."""
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    m = mask[..., None].to(hidden.dtype)  # (B, L, 1)
    x = hidden * m
    mean = x.sum(1, keepdim=True) / m.sum(1, keepdim=True)  # (B, 1, D)
    residual = (x - mean) * m
    return residual.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1)

