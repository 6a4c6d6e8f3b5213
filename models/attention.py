"""Attention for both model families, which share `masked_softmax` and `split_heads`.

`MultiHeadAttention` (Transformer) has a fused path and an explicit one that returns the weights; both take
the same mask and bias, so they agree by construction, and its score (models/transformer_scores.py) serves
both. The recurrent family's scores (models/scores.py) sit behind `ScoreAttention`, whose window says which
source positions a query attends to (global, or Luong et al.'s local windows). With K fused seeds
(models/ensemble.py) the batch axis is K·B and scores read K off their parameters' shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.models.ensemble import Ensemble, linear, per_row, per_seed


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


class ScaledDotProduct(nn.Module):
    """Vaswani et al. 2017: q·k times a fixed `scale` (theirs 1/sqrt(d_k)). The interface of a Transformer
    score: `query` and `key` prepare the per-head (B, H, L, Dh) queries and keys (after rotary); `scale` is
    the float factor on q·k that both attention paths take."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def query(self, q: torch.Tensor) -> torch.Tensor:
        return q

    def key(self, k: torch.Tensor) -> torch.Tensor:
        return k


class QKNorm(nn.Module):
    """Henry et al. 2020, "Query-Key Normalization for Transformers": score g · cos(q, k) per head, g one
    learned scalar per layer starting at `start` (as CyndxAI/QKNorm layers.py ScaleUp; x-transformers'
    qk_norm keeps a fixed factor instead, qk_norm_scale = 10)."""

    scale = 1.0  # g multiplies the query instead: the fused path's `scale` is a float and could not train g

    def __init__(self, start: float):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(float(start)))

    def query(self, q: torch.Tensor) -> torch.Tensor:
        g = self.g.view(-1, 1, 1, 1, 1)  # (K, 1, 1, 1, 1): each seed's own g (K = 1 in a plain model)
        return (per_seed(F.normalize(q, dim=-1), g.size(0)) * g).flatten(0, 1)

    def key(self, k: torch.Tensor) -> torch.Tensor:
        return F.normalize(k, dim=-1)  # after rotary, which turns pairs of features and keeps the norm


class MultiHeadAttention(nn.Module):
    """Multi-head attention with a switchable score over `heads` heads.

    score: see ScaledDotProduct (None: Vaswani's 1/sqrt(d_k)). qkv_projections=False with
    ScaledDotProduct(1.0) is the lectures' parameter-free self-attention, w_ij = softmax_j(x_i·x_j),
    out_i = sum_j w_ij x_j, each head on its slice of the features.
    rotary / score_bias: self-attention's relative-position slots (models/positional.py): rotary(x (B, H,
    L, Dh), offset); score_bias(q_len, k_len) -> (H, q_len, k_len), or (K, H, q_len, k_len) per fused seed.
    ensemble: the model's (None: plain); sides: ('src', 'tgt') of the queries and keys, whose lengths bound
    each seed's dropout mask on the weights. key_dim: d_k, each head's query and key width (None: d_model /
    heads, the values' width Dh). Dropout drawn per seed takes the explicit path: the fused kernel draws
    its own mask and takes no generator.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float = 0.0,
        qkv_projections: bool = True,
        rotary: nn.Module | None = None,
        score_bias: nn.Module | None = None,
        score: nn.Module | None = None,
        ensemble: Ensemble | None = None,
        sides: tuple[str | None, str | None] = (None, None),
        key_dim: int | None = None,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"heads={heads} must divide d_model={d_model}")
        if key_dim is not None and not qkv_projections:
            raise ValueError("key_dim needs qkv_projections: without them a head's keys are its slice of d_model")
        ensemble = ensemble or Ensemble()
        self.heads, self.head_dim = heads, d_model // heads
        self.key_dim = key_dim or self.head_dim
        self.score = score if score is not None else ScaledDotProduct(self.key_dim**-0.5)
        self.dropout = ensemble.dropout(dropout, None, *sides)  # on the weights (B, H, T, S)
        if qkv_projections:
            self.q_proj, self.k_proj = (ensemble.linear(d_model, heads * self.key_dim) for _ in range(2))
            self.v_proj, self.out_proj = ensemble.linear(d_model, d_model), ensemble.linear(d_model, d_model)
        else:
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Identity() for _ in range(4))
        self.rotary, self.score_bias = rotary, score_bias

    def keys_values(self, key: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """key (B, S, D) at positions offset.. -> k (B, H, S, d_k), v (B, H, S, Dh); what a decoding cache
        keeps."""
        k = split_heads(self.k_proj(key), self.heads)
        if self.rotary is not None:
            k = self.rotary(k, offset)
        return self.score.key(k), split_heads(self.v_proj(key), self.heads)

    def attend(
        self,
        query: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, D) over k, v from `keys_values`; in self-attention the T queries are the last T of
        the S key positions (T < S when earlier keys come from a cache)."""
        q = split_heads(self.q_proj(query), self.heads)
        q_len, k_len = q.size(2), k.size(2)
        if self.rotary is not None:
            q = self.rotary(q, offset=k_len - q_len)
        q = self.score.query(q)
        mask = build_mask(key_padding, q_len, k_len, causal, q.device)
        bias = None
        if self.score_bias is not None:
            bias = self.score_bias(q_len, k_len).to(q.dtype)  # (H, T, S), or (K, H, T, S): one per seed
            bias = per_row(bias.view(-1, *bias.shape[-3:]), q.size(0))  # (1 or K·B, H, T, S)

        if need_weights or self.dropout.draws_per_seed():
            scores = (q @ k.transpose(-2, -1)) * self.score.scale  # (B, H, T, S)
            if bias is not None:
                scores = scores + bias
            weights = masked_softmax(scores, mask)
            out = self.dropout(weights) @ v
        else:
            attn_mask = mask
            if bias is not None:  # one additive mask: the bias where allowed, -inf elsewhere
                attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            dropout = self.dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=self.score.scale
            )
            weights = None
        return self.out_proj(merge_heads(out)), weights

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, D), key = value (B, S, D), key_padding (B, S) True for real tokens -> the output
        (B, T, D) and, if asked, the weights (B, H, T, S)."""
        return self.attend(query, *self.keys_values(key), key_padding, causal, need_weights)


# Score functions of the recurrent family: score(query (B, T, D), keys (B, S, D)) -> (B, H, T, S).
# Each head scores its own slice of the features, split as in MultiHeadAttention.


class Score(nn.Module):
    """A score function: `forward(query (B, T, D), prepare(keys))` -> scores (B, H, T, S). `prepare` holds
    what depends on the keys alone (U h, W h), so a decoder computes it once per source, not every step."""

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return keys


class DotScore(Score):
    """Luong's dot: s·h per head, times `scale` (Dh^-1/2 gives the Transformer's scaled dot product)."""

    def __init__(self, heads: int, scale: float = 1.0):
        super().__init__()
        self.heads, self.scale = heads, scale

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        q, k = split_heads(query, self.heads), split_heads(keys, self.heads)
        return (q @ k.transpose(-2, -1)) * self.scale


class GeneralScore(Score):
    """Luong's general: sᵀ W h, i.e. the dot score of s with W h."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.w = nn.Linear(d_model, d_model, bias=False)
        self.dot = DotScore(heads)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.w(keys)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.dot(query, keys)


class TanhScore(Score):
    """vᵀ tanh(query part + key part), one v per head; subclasses say how the parts are projected."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        head_dim = d_model // heads
        self.v = nn.Parameter(torch.empty(heads, head_dim).uniform_(-(head_dim**-0.5), head_dim**-0.5))

    def combine(self, query_part: torch.Tensor, key_part: torch.Tensor) -> torch.Tensor:
        q, k = split_heads(query_part, self.heads), split_heads(key_part, self.heads)
        v = self.v.view(-1, *self.v.shape[-2:])  # (K, H, Dh): each seed's own (K = 1 in a plain model)
        hidden = per_seed(torch.tanh(q[:, :, :, None] + k[:, :, None]), v.size(0))  # (K, B, H, T, S, Dh)
        return torch.einsum("kbhtsd,khd->kbhts", hidden, v).flatten(0, 1)


class AdditiveScore(TanhScore):
    """Bahdanau's additive: vᵀ tanh(W s + U h)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__(d_model, heads)
        self.w = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Linear(d_model, d_model)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.u(keys)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.combine(self.w(query), keys)


class ConcatScore(TanhScore):
    """Luong's concat: vᵀ tanh(W [s; h]). One matrix on the concatenation, applied as its two halves
    so the (B, T, S, 2D) concatenation is never built; the same function family as additive."""

    def __init__(self, d_model: int, heads: int):
        super().__init__(d_model, heads)
        self.w = nn.Linear(2 * d_model, d_model)

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return linear(keys, self.w.weight.chunk(2, dim=-1)[1])

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return self.combine(linear(query, self.w.weight.chunk(2, dim=-1)[0], self.w.bias), keys)


class LocationScore(Score):
    """Luong's location: softmax(W s) over source positions, from the decoder state alone."""

    def __init__(self, d_model: int, heads: int, max_positions: int):
        super().__init__()
        self.heads, self.max_positions = heads, max_positions
        self.w = nn.Linear(d_model // heads, max_positions)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if keys.size(1) > self.max_positions:
            raise ValueError(f"source length {keys.size(1)} exceeds model.max_positions={self.max_positions}")
        return self.w(split_heads(query, self.heads))[..., : keys.size(1)]  # (B, H, T, S)


class UniformScore(Score):
    """No score: every real position alike, so the context is the mean of the values (Wiegreffe & Pinter
    2019's uniform baseline; a captioner fed the mean of its regions at every step)."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return query.new_zeros(query.size(0), self.heads, query.size(1), keys.size(1))


class CosineScore(Score):
    """Graves et al. 2014 content addressing: β · cos(k, h), key k = W s and strength β = 1 + softplus(w·s)
    both emitted from the decoder state, one β per head."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.key = nn.Linear(d_model, d_model)
        self.strength = nn.Linear(d_model, heads)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        k = F.normalize(split_heads(self.key(query), self.heads), dim=-1)
        h = F.normalize(split_heads(keys, self.heads), dim=-1)
        beta = 1 + F.softplus(self.strength(query)).transpose(1, 2)[..., None]  # (B, H, T, 1)
        return beta * (k @ h.transpose(-2, -1))


# Windows of the recurrent family: window(scores (B, H, T, S), query (B, T, D), steps (B or 1, T),
# padding (B, S)) -> weights (B, H, T, S) over the source positions each query may attend to.


class GlobalWindow(nn.Module):
    """Global attention (Bahdanau et al. 2015; Luong et al. 2015, Sec. 3.1): the softmax of the scores over
    every real source position."""

    def forward(
        self, scores: torch.Tensor, query: torch.Tensor, steps: torch.Tensor, padding: torch.Tensor | None
    ) -> torch.Tensor:
        mask = build_mask(padding, scores.size(2), scores.size(3), causal=False, device=scores.device)
        return masked_softmax(scores, mask)


class LocalWindow(nn.Module):
    """Luong et al. 2015, Sec. 3.2: the softmax of the scores (eq. 7) over the 2D + 1 positions ⌊p_t⌋ - D ..
    ⌊p_t⌋ + D around an aligned source position p_t (the paper's a_t ∈ R^{2D+1}, as OpenNMT's CenteredWindow),
    clipped to the real source, exactly 0 elsewhere; positions count from 0. `centre` says where p_t is,
    `favour` what the weights become around it."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width  # D

    def centre(self, query: torch.Tensor, steps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """p_t (B, 1 or H, T) of each query; lengths (B,): each source's real length S."""
        raise NotImplementedError

    def favour(self, weights: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        """The weights given each position's distance s - p_t: local-m keeps the window's softmax."""
        return weights

    def forward(
        self, scores: torch.Tensor, query: torch.Tensor, steps: torch.Tensor, padding: torch.Tensor | None
    ) -> torch.Tensor:
        real = torch.ones_like(scores[:, 0, 0], dtype=torch.bool) if padding is None else padding  # (B, S)
        # S, padding trailing; in float32 at least, where positions past 256 stay whole (not so in bf16).
        lengths = real.sum(-1).to(torch.promote_types(scores.dtype, torch.float32))
        p = self.centre(query, steps, lengths)  # (B, 1 or H, T)
        positions = torch.arange(scores.size(-1), device=scores.device)
        near = (positions - p.floor()[..., None]).abs() <= self.width  # (B, 1 or H, T, S)
        weights = masked_softmax(scores, near & real[:, None, None])
        return self.favour(weights, positions - p[..., None])


class MonotonicWindow(LocalWindow):
    """local-m: p_t = t, the query's decoder step. Past the source's end the paper's window would hold no
    position and the step no context: there p_t stops at the last position, S - 1."""

    def centre(self, query: torch.Tensor, steps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.minimum(steps, lengths[:, None] - 1)[:, None]  # (B, 1, T), all heads


class PredictiveWindow(LocalWindow):
    """local-p (eq. 9-10): p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) in [0, S], one v_p per head, and a_t(s) =
    align(h_t, h_s) · exp(-(s - p_t)² / (2σ²)), σ = D / 2, not renormalised (rows sum to less than 1). p_t
    learns through the Gaussian alone: the window's edges (⌊p_t⌋) carry no gradient."""

    def __init__(self, d_model: int, heads: int, width: int):
        super().__init__(width)
        self.w = nn.Linear(d_model, d_model, bias=False)  # W_p
        self.v = nn.Linear(d_model, heads, bias=False)  # v_p, one row per head

    def centre(self, query: torch.Tensor, steps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        aligned = torch.sigmoid(self.v(torch.tanh(self.w(query))))  # (B, T, H)
        return lengths[:, None, None] * aligned.transpose(1, 2)  # (B, H, T)

    def favour(self, weights: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        sigma = self.width / 2
        return weights * torch.exp(-(distance**2) / (2 * sigma**2)).to(weights.dtype)


class ScoreAttention(nn.Module):
    """Attention over encoder states with a pluggable score and window, each head over its slice of the
    states. With `scaled_dot` and the global window: MultiHeadAttention with qkv_projections=False."""

    def __init__(self, score: nn.Module, heads: int, window: nn.Module | None = None):
        super().__init__()
        self.score, self.heads = score, heads
        self.window = window if window is not None else GlobalWindow()

    def prepare(self, keys: torch.Tensor) -> torch.Tensor:
        return self.score.prepare(keys)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        key_padding: torch.Tensor | None = None,
        prepared: torch.Tensor | None = None,
        steps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, T, D), keys = values (B, S, D), key_padding (B, S) True for real tokens; prepared:
        `prepare(keys)` kept across decoder steps; steps (B, T): each query's decoder step, which local-m
        centres on (None: 0..T-1) -> the context (B, T, D) and the weights (B, H, T, S)."""
        if steps is None:  # a call outside a decoder: its queries are steps 0..T-1
            steps = torch.arange(query.size(1), device=query.device)[None]
        scores = self.score(query, self.prepare(keys) if prepared is None else prepared)
        weights = self.window(scores, query, steps, key_padding)
        return merge_heads(weights @ split_heads(keys, self.heads)), weights
