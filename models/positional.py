"""Positional information: none / sinusoidal / learned (added to embeddings), rope (rotates q and k),
alibi (a per-head linear bias on attention scores)."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)); shape (positions, dim)."""
    pos = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)[:, : dim // 2]
    return table.float()


class SinusoidalEncoding(nn.Module):
    """Adds the fixed sinusoid of Vaswani et al. 2017 to (B, T, D) embeddings."""

    def __init__(self, dim: int, max_positions: int, base: float = 10000.0):
        super().__init__()
        self.base = base
        self.register_buffer("table", sinusoidal_table(max_positions, dim, base), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.size(1)
        if offset + length > self.table.size(0):
            self.table = sinusoidal_table(2 * (offset + length), self.table.size(1), self.base).to(self.table)
        return x + self.table[offset : offset + length]


class LearnedEncoding(nn.Module):
    """A trained vector per absolute position; cannot represent positions it never saw."""

    def __init__(self, dim: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, dim)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        length = x.size(1)
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"learned positions cover {self.embedding.num_embeddings} positions, got a sequence of {offset + length}"
            )
        return x + self.embedding.weight[offset : offset + length]


class NoEncoding(nn.Module):
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x


class Rotary(nn.Module):
    """RoPE (Su et al. 2021): rotates each pair (x_i, x_{i+d/2}) of q and k by position * theta_i."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, H, T, Dh)
        t = torch.arange(x.size(-2), device=x.device, dtype=torch.float32)
        angles = torch.outer(t, self.inv_freq)  # (T, Dh/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class ALiBi(nn.Module):
    """Press et al. 2022: score bias -m_h * |i - j| with geometric head slopes; no embedding at all."""

    def __init__(self, heads: int):
        super().__init__()
        self.register_buffer("slopes", self._slopes(heads), persistent=False)

    @staticmethod
    def _slopes(heads: int) -> torch.Tensor:
        def power_of_two(n: int) -> list[float]:
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start ** (i + 1) for i in range(n)]

        if math.log2(heads).is_integer():
            return torch.tensor(power_of_two(heads))
        closest = 2 ** math.floor(math.log2(heads))
        extra = power_of_two(2 * closest)[0::2][: heads - closest]
        return torch.tensor(power_of_two(closest) + extra)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        """(H, q_len, k_len) additive bias; symmetric distance so it serves encoders and decoders."""
        i = torch.arange(q_len, device=self.slopes.device).unsqueeze(1)
        j = torch.arange(k_len, device=self.slopes.device).unsqueeze(0)
        distance = (i - j).abs().float()
        return -self.slopes.view(-1, 1, 1) * distance


def additive_encoding(kind: str, dim: int, max_positions: int, base: float) -> nn.Module:
    """The module that adds absolute positions to embeddings (identity for none / rope / alibi)."""
    if kind == "sinusoidal":
        return SinusoidalEncoding(dim, max_positions, base)
    if kind == "learned":
        return LearnedEncoding(dim, max_positions)
    return NoEncoding()
