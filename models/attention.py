"""Attention, in one place for both model families.

`MultiHeadAttention` is the Transformer's (and the RNN's multi-head scaled-dot) attention with two paths:
fused `scaled_dot_product_attention` when weights are not needed, and an explicit path that returns them.
Both take the same mask and bias, so they agree by construction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.positional import ALiBi, Rotary


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim where `mask` is True; masked entries are exactly 0, rows sum to 1."""
    if mask is None:
        return scores.softmax(-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    # A row with nothing to attend to (never produced by valid inputs) would be NaN; make it 0.
    return weights.masked_fill(~mask, 0.0)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, D/H): each head sees its own slice of the features."""
    b, length, d = x.shape
    return x.view(b, length, heads, d // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, Dh) -> (B, L, H * Dh), the inverse of split_heads."""
    b, h, length, dh = x.shape
    return x.transpose(1, 2).reshape(b, length, h * dh)


def build_mask(
    key_padding: torch.Tensor | None, q_len: int, k_len: int, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """Boolean (B or 1, 1, q_len, k_len) mask, True where a query may attend to a key."""
    mask = None
    if key_padding is not None:
        mask = key_padding[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        tri = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
        mask = tri[None, None] if mask is None else mask & tri
    return mask


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over `heads` heads.

    scale: factor on q·k; None means 1/sqrt(d_k). qkv_projections=False gives the parameter-free
    self-attention of the lectures: weights from x_i·x_j, values are the inputs themselves.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float = 0.0,
        scale: float | None = None,
        qkv_projections: bool = True,
        rotary: Rotary | None = None,
        alibi: ALiBi | None = None,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"heads={heads} must divide d_model={d_model}")
        self.heads, self.head_dim = heads, d_model // heads
        self.scale = scale if scale is not None else self.head_dim**-0.5
        self.dropout = dropout
        project = (lambda: nn.Linear(d_model, d_model)) if qkv_projections else nn.Identity
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = project(), project(), project(), project()
        self.rotary = rotary
        self.alibi = alibi

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return split_heads(x, self.heads)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, D), key = value (B, S, D), key_padding (B, S) True for real tokens.

        Returns the output (B, T, D) and, if asked, the weights (B, H, T, S)."""
        q, k, v = (
            self._split(self.q_proj(query)),
            self._split(self.k_proj(key)),
            self._split(self.v_proj(key)),
        )
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        mask = build_mask(key_padding, q.size(2), k.size(2), causal, q.device)
        bias = self.alibi(q.size(2), k.size(2)).unsqueeze(0) if self.alibi is not None else None
        dropout = self.dropout if self.training else 0.0

        if need_weights:
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, S)
            if bias is not None:
                scores = scores + bias
            weights = masked_softmax(scores, mask)
            out = F.dropout(weights, dropout, self.training) @ v
        else:
            attn_mask = mask
            if bias is not None:
                attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=self.scale
            )
            weights = None
        return self.out_proj(merge_heads(out)), weights
