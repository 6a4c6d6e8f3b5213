"""The layers of the positional kinds (models/positional.py names them), and `Positions`, one Transformer's.

Every layer takes `offset`, the absolute position of the first element, so incremental decoding sees
exactly the positions full decoding does. Sinusoidal, rope, alibi and t5 extend to any length (t5's
distances past its max share its last bucket). Learned positions stop at `model.max_positions`: rows the
training data never reached keep their random start (what test_long measures), and a position past the
table is an error naming the key, not a silent reuse of another position's vector.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ablate.models.ensemble import per_seed, seed_axis


def sinusoidal_table(positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)); shape (positions, dim)."""
    pos = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)[:, : dim // 2]  # an odd dim has one sine more than cosines
    return table.float()


class SinusoidalEncoding(nn.Module):
    """Adds the fixed sinusoid of Vaswani et al. 2017 to (B, T, D) embeddings; the table grows on demand."""

    def __init__(self, dim: int, max_positions: int, base: float = 10000.0):
        super().__init__()
        self.base = base
        self.register_buffer("table", sinusoidal_table(max_positions, dim, base), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        end = offset + x.size(1)
        if end > self.table.size(0):
            self.table = sinusoidal_table(2 * end, self.table.size(1), self.base).to(self.table)
        return x + self.table[offset:end]


class LearnedEncoding(nn.Module):
    """A trained vector per absolute position, up to max_positions (see the module docstring); a table per
    seed in a model of fused seeds, whose batch axis is K·B."""

    def __init__(self, dim: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, dim)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def redraw(self, stds: list[float]) -> None:
        """Each seed's table drawn again, N(0, std²) with seed k's std (model.pos_init: embedding)."""
        for table, std in zip(seed_axis(self.embedding.weight, len(stds)), stds):
            nn.init.normal_(table, std=std)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        end = offset + x.size(1)
        if end > self.embedding.num_embeddings:
            raise ValueError(
                f"model.max_positions: learned positions cover {self.embedding.num_embeddings} positions, "
                f"a sequence reached position {end}; raise model.max_positions"
            )
        weight = self.embedding.weight  # (P, D); (K, P, D) with fused seeds
        table = weight.view(-1, *weight.shape[-2:])[:, offset:end]  # (K, L, D)
        return (per_seed(x, table.size(0)) + table[:, None]).flatten(0, 1)


class NoEncoding(nn.Module):
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x


class Rotary(nn.Module):
    """RoPE (Su et al. 2021): rotates each pair (x_i, x_{i+d/2}) of q and k by position * theta_i,
    theta_i = base^(-2i/d), so q_m·k_n depends on m - n only."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, H, T, Dh) whose first position is `offset`."""
        # Angles in float32 whatever x's dtype: a bf16 frequency is off by tenths of a radian by position 100.
        exponents = torch.arange(0, self.head_dim, 2, device=x.device, dtype=torch.float32) / self.head_dim
        t = torch.arange(offset, offset + x.size(-2), device=x.device, dtype=torch.float32)
        angles = torch.outer(t, self.base**-exponents)  # (T, Dh/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class ALiBi(nn.Module):
    """Press et al. 2022: score bias -m_h * |i - j| with geometric head slopes. Symmetric, so it serves the
    bidirectional encoder too; under a causal mask it is the paper's -m_h * (i - j)."""

    def __init__(self, heads: int):
        super().__init__()
        self.register_buffer("slopes", self.slopes_for(heads), persistent=False)

    @staticmethod
    def slopes_for(heads: int) -> torch.Tensor:
        """2^(-8/n), 2^(-16/n), ... for n a power of two; otherwise the nearest lower power of two's
        slopes, then every other slope of the next power of two (the paper's recipe)."""

        def power_of_two(n: int) -> list[float]:
            start = 2 ** (-8 / n)
            return [start ** (i + 1) for i in range(n)]

        closest = 2 ** math.floor(math.log2(heads))
        extra = power_of_two(2 * closest)[0::2][: heads - closest]
        return torch.tensor(power_of_two(closest) + extra)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        """(H, q_len, k_len) additive bias; the queries are the last q_len of the k_len positions."""
        i = torch.arange(k_len - q_len, k_len, device=self.slopes.device).unsqueeze(1)
        j = torch.arange(k_len, device=self.slopes.device).unsqueeze(0)
        distance = (i - j).abs().to(self.slopes.dtype)
        return -self.slopes.view(-1, 1, 1) * distance


def t5_bucket(
    relative: torch.Tensor, bidirectional: bool, buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position key - query (Raffel et al. 2020; `_relative_position_bucket`).
    Bidirectional: half the buckets for keys at or before the query, half for keys after; causal: all for
    keys at or before it (a later, masked key is bucket 0). Of a direction's n buckets, distances below n/2
    have one each, the rest grow logarithmically up to max_distance; distances beyond share the last."""
    if bidirectional:
        buckets //= 2
        offset = (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        offset, distance = 0, (-relative).clamp(min=0)
    exact = buckets // 2
    # In float32 as T5's code computes it, so a distance falls in T5's bucket; the clamp keeps log(0) out of
    # the distances below `exact`, which take their own bucket.
    ratio = distance.clamp(min=exact).float() / exact
    logarithmic = exact + (ratio.log() / math.log(max_distance / exact) * (buckets - exact)).long()
    return offset + torch.where(distance < exact, distance, logarithmic.clamp(max=buckets - 1))


def t5_untrained(
    trained: int, tested: int, bidirectional: bool, buckets: int = 32, max_distance: int = 128
) -> list[int]:
    """The buckets that sequences of up to `tested` positions read and no training sequence of up to `trained`
    positions reaches: their bias stays at its initial value, so what a model reads there was never learned
    (T5's own L = 512 puts every distance past 128 in its last, trained, bucket)."""

    def reached(length: int) -> set[int]:
        relative = torch.arange(-(length - 1), length if bidirectional else 1)
        return set(t5_bucket(relative, bidirectional, buckets, max_distance).tolist())

    return sorted(reached(tested) - reached(trained))


class T5Bias(nn.Module):
    """Raffel et al. 2020, Sec. 2.1: a learned scalar per (bucket of relative position, head) added to the
    attention logits, buckets as `t5_bucket` (32 up to distance 128, T5's). One per stack, shared by its
    layers as in T5; `bidirectional`: whether its attention sees later keys. T5 scales no q·k; here the bias
    adds to whatever the model's score gives. Weight (buckets, H), or (K, buckets, H) with fused seeds,
    initialised N(0, d_model^-1) as Hugging Face's T5 does."""

    def __init__(
        self, heads: int, d_model: int, bidirectional: bool, buckets: int = 32, max_distance: int = 128
    ):
        super().__init__()
        self.bidirectional, self.buckets, self.max_distance = bidirectional, buckets, max_distance
        self.weight = nn.Parameter(torch.empty(buckets, heads).normal_(std=d_model**-0.5))

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        """(H, q_len, k_len), or (K, H, q_len, k_len) with fused seeds; the queries are the last q_len of
        the k_len positions."""
        i = torch.arange(k_len - q_len, k_len, device=self.weight.device).unsqueeze(1)
        j = torch.arange(k_len, device=self.weight.device).unsqueeze(0)
        bucket = t5_bucket(j - i, self.bidirectional, self.buckets, self.max_distance)  # (q_len, k_len)
        return self.weight[..., bucket, :].movedim(-1, -3)  # (..., q_len, k_len, H) -> (..., H, q_len, k_len)


class Positions(nn.Module):
    """One Transformer's positional parts (models/positional.build_positions): embed(x (B, L, D), offset)
    adds absolute positions (x itself without any); `rotary` and `score_bias[side]` ('src' the encoder's,
    'tgt' the decoder's) fill self-attention's slots (MultiHeadAttention), None when absent."""

    def __init__(
        self, embedding: nn.Module | None, rotary: nn.Module | None, score_bias: dict[str, nn.Module] | None
    ):
        super().__init__()
        self.embedding = embedding if embedding is not None else NoEncoding()
        self.rotary = rotary
        self.score_bias = nn.ModuleDict(score_bias) if score_bias is not None else None

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.embedding(x, offset)

    def slots(self, side: str) -> tuple[nn.Module | None, nn.Module | None]:
        """The rotary and score-bias slots of self-attention on `side`."""
        return self.rotary, self.score_bias[side] if self.score_bias is not None else None
