"""Relative positions checked inside attention, against the papers' formulas written out by hand.

RoPE (Su et al. 2021): q_m and k_n are rotated pair by pair, pair i = (x_i, x_{i+d/2}) read as the complex
number x_i + j x_{i+d/2}, by the angles m theta_i and n theta_i, theta_i = base^(-2i/d), d the head
dimension; the score is Re sum_i q~_m,i conj(k~_n,i) / sqrt(d), which depends on m - n only.
ALiBi (Press et al. 2022): score = q_m . k_n / sqrt(d) - slope_h |m - n| (encoder) or - slope_h (m - n)
for n <= m (causal decoder), slopes 2^(-8h/H) for h = 1..H.
T5 (Raffel et al. 2020, Sec. 2.1): score = q_m . k_n / sqrt(d) + b_h[bucket(n - m)], one learned scalar per
head and bucket; the buckets of T5's code, written out below for the distances used (32 buckets, max
distance 128; bidirectional in the encoder, causal in the decoder).

Softmax fixes scores only up to a constant per query, so the tests compare what the returned weights
determine exactly: log w_mn - log w_m0 = s_mn - s_m0. Tolerances: ALiBi and T5 1e-10 (float64 throughout);
RoPE 1e-5, because its angles are computed in float32 on purpose (models/positional.py) and a float32
angle of position p is off by about p * 6e-8 radians.

The attention layer alone (the end of the file): Vaswani et al.'s multi-head formula, its mask of padded
and later keys, a score bias meeting those masks, Henry et al.'s cosine score (QKNorm) with the masks and
with RoPE and ALiBi, its dropout on the weights and relative positions under a key-value cache, written
out the same way, on both of its paths; then the recurrent family's `ScoreAttention` with Luong's general
and location scores.
"""

from __future__ import annotations

import math

import pytest
import torch

from ablate.models import build_model
from ablate.models.attention import (
    AdditiveScore,
    GeneralScore,
    LocationScore,
    MultiHeadAttention,
    QKNorm,
    ScaledDotProduct,
    ScoreAttention,
)
from ablate.models.config import ModelConfig
from ablate.models.positional_layers import ALiBi, Rotary, T5Bias
from ablate.models.transformer import Transformer

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, VOCAB, D = 0, 11, 8
SRC = torch.tensor([[4, 5, 6, 7, 8, 9]])
TGT_IN = torch.tensor([[1, 10, 4, 5, 6]])


def affine(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x W^T + b, the projection written out."""
    return x @ linear.weight.T + linear.bias


def self_attention(
    pos_encoding: str, heads: int, side: str, src=SRC, tgt_in=TGT_IN, seed: int = 0, prepare=None, **model
):
    """The first layer's self-attention on `side` of a one-layer float64 Transformer, reached through the
    model's forward: weights (H, L, L) of the first sentence and the layer's unrotated per-head queries
    and keys q, k (H, L, Dh), computed from its input and projection parameters. `prepare(net)`, if given,
    sets parameters of the built model first.

    (The one place that knows how the model is built and where its attention lives.)"""
    cfg = ModelConfig(d_model=D, heads=heads, layers=1, d_ff=8, dropout=0.0, norm="post",
                      pos_encoding=pos_encoding, **model)  # fmt: skip
    torch.manual_seed(seed)
    net = build_model(cfg, VOCAB, VOCAB, PAD).double().eval()
    with torch.no_grad():
        if prepare is not None:
            prepare(net)
        _, weights = net(src, tgt_in, need_weights=True)
        tokens, embed, layer = (src, net.src_embed, net.encoder[0]) if side == "encoder" else (
            tgt_in, net.tgt_embed, net.decoder[0])  # fmt: skip
        x = embed.weight[tokens[0]] * D**0.5  # post-norm: the layer's attention reads the scaled embeddings
        attn = layer.self_attn.fn.attn
        per_head = lambda proj: affine(proj, x).view(len(x), heads, -1).transpose(0, 1)  # noqa: E731
        return weights[side][0][0], per_head(attn.q_proj), per_head(attn.k_proj)


def score_differences(weights: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """log w_mn - log w_m0 where allowed (key 0 is allowed for every query), 0 elsewhere."""
    logs = weights.clamp_min(1e-300).log()
    return torch.where(allowed, logs - logs[..., :1], 0.0)


def rope_scores(q: torch.Tensor, k: torch.Tensor, base: float = 10000.0, offset: int = 0) -> torch.Tensor:
    """(H, L, Dh) unrotated q, k at positions offset.. -> (H, L, L) RoPE scores, from the complex form."""
    d = q.size(-1)
    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    positions = torch.arange(offset, offset + q.size(1), dtype=torch.float64)
    rotation = torch.polar(
        torch.ones(len(positions), d // 2, dtype=torch.float64), positions[:, None] * theta
    )
    as_complex = lambda x: torch.complex(x[..., : d // 2], x[..., d // 2 :]) * rotation  # noqa: E731
    return (as_complex(q) @ as_complex(k).conj().transpose(-2, -1)).real / d**0.5


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_rope_scores_inside_attention_equal_the_rotation_formula(side):
    weights, q, k = self_attention("rope", heads=1, side=side)  # one head of 8: four frequencies
    length = weights.size(-1)
    allowed = torch.ones(length, length, dtype=torch.bool)
    if side == "decoder":
        allowed = allowed.tril()
    assert torch.all(weights[..., ~allowed] == 0)
    expected = score_differences(
        torch.softmax(rope_scores(q, k).masked_fill(~allowed, -torch.inf), -1), allowed
    )
    torch.testing.assert_close(score_differences(weights, allowed), expected, atol=1e-5, rtol=0)
    # Not the unrotated scores: positions matter.
    plain = score_differences(torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1), allowed)
    assert (score_differences(weights, allowed) - plain).abs().max() > 1e-2


def test_rope_scores_depend_on_relative_position_for_a_shift_that_turns_every_frequency():
    # Leading padding moves the same tokens 37 positions on (no absolute positions are added with RoPE):
    # angles 37 theta_i = 37, 3.7, 0.37, 0.037 rad, so every pair of the head is rotated by the shift.
    shift = 37
    plain, _, _ = self_attention("rope", heads=1, side="encoder")
    shifted_src = torch.cat([torch.full((1, shift), PAD), SRC], dim=1)
    shifted, _, _ = self_attention("rope", heads=1, side="encoder", src=shifted_src)
    torch.testing.assert_close(shifted[..., shift:, shift:], plain, atol=1e-5, rtol=0)
    # Every pair is turned by the shift (by at least 0.03 rad away from a full turn), so a pair rotated
    # wrongly, or for q only, would change the shifted scores.
    theta = 10000.0 ** (-2 * torch.arange(4, dtype=torch.float64) / 8)
    turn = torch.remainder(shift * theta, 2 * torch.pi)
    assert torch.all(torch.minimum(turn, 2 * torch.pi - turn) > 0.03)


def test_rope_uses_pos_base_for_its_frequencies():
    weights, q, k = self_attention("rope", heads=1, side="encoder")
    allowed = torch.ones_like(weights, dtype=torch.bool)
    for base in (10000.0, 100.0):
        expected = score_differences(torch.softmax(rope_scores(q, k, base=base), -1), allowed)
        close = torch.allclose(score_differences(weights, allowed), expected, atol=1e-5, rtol=0)
        assert close == (base == 10000.0)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_alibi_scores_inside_attention_are_scaled_dot_minus_slope_times_distance(side):
    heads = 4
    weights, q, k = self_attention("alibi", heads=heads, side=side)
    length = weights.size(-1)
    slopes = torch.tensor([2 ** (-8 * h / heads) for h in range(1, heads + 1)], dtype=torch.float64)
    m, n = torch.arange(length)[:, None], torch.arange(length)[None, :]
    if side == "encoder":
        distance, allowed = (m - n).abs(), torch.ones(length, length, dtype=torch.bool)
    else:  # the paper's causal form
        distance, allowed = m - n, n <= m
    scores = q @ k.transpose(-2, -1) / (D // heads) ** 0.5 - slopes[:, None, None] * distance
    expected = score_differences(torch.softmax(scores.masked_fill(~allowed, -torch.inf), -1), allowed)
    torch.testing.assert_close(score_differences(weights, allowed), expected, atol=1e-10, rtol=0)
    assert torch.all(weights[..., ~allowed] == 0)


# T5's bucket of a key `distance` positions before the query, distances 0..15, 32 buckets, max distance 128.
# Bidirectional: 16 a direction, 0..7 exact, then 8 + floor(8 ln(d / 8) / ln 16): 8 for d = 8..11 (d = 11:
# 8 + floor(0.92)), 9 for d = 12..15 (d = 12: 8 + floor(1.17)); a later key 16 on. Causal: 32 for earlier
# keys, 0..15 exact; a later key (masked) 0.
T5_BUCKETS = {True: [*range(8), 8, 8, 8, 8, 9, 9, 9, 9], False: list(range(16))}


def t5_buckets(length: int, bidirectional: bool) -> torch.Tensor:
    """(L, L) bucket of key n for query m, from T5_BUCKETS (L <= 16)."""
    table = torch.tensor(T5_BUCKETS[bidirectional])
    m, n = torch.arange(length)[:, None], torch.arange(length)[None, :]
    later = 16 + table[(n - m).clamp(min=0)] if bidirectional else torch.zeros_like(m - n)
    return torch.where(n > m, later, table[(m - n).clamp(min=0)])


def given_t5_table(sign: float) -> torch.Tensor:
    """A T5 bias table (32 buckets, 2 heads): b[bucket, 0] = sign (bucket - 8) / 4, b[bucket, 1] = -sign
    bucket / 8."""
    bucket = torch.arange(32, dtype=torch.float64)
    return sign * torch.stack([(bucket - 8) / 4, -bucket / 8], dim=1)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_t5_scores_inside_attention_are_scaled_dot_plus_the_table_at_each_bucket(side):
    """Given tables, the encoder's and (negated) the decoder's: score = q_m . k_n / sqrt(d_k) + b_h[bucket(n -
    m)]. Twelve positions a side, so that the encoder's keys 8..11 positions away share bucket 8 while the
    decoder's causal buckets keep them apart; each stack reads its own table."""
    tables = {"src": given_t5_table(1.0), "tgt": given_t5_table(-1.0)}

    def give_tables(net):
        for stack, table in tables.items():
            net.positions.score_bias[stack].weight.copy_(table)

    tokens = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 4, 5, 6, 7, 8]])
    weights, q, k = self_attention("t5", heads=2, side=side, src=tokens, tgt_in=tokens, prepare=give_tables)
    length, bidirectional = weights.size(-1), side == "encoder"
    allowed = torch.ones(length, length, dtype=torch.bool)
    if not bidirectional:
        allowed = allowed.tril()
    bias = tables["src" if bidirectional else "tgt"][t5_buckets(length, bidirectional)]  # (L, L, H)
    scores = q @ k.transpose(-2, -1) / (D // 2) ** 0.5 + bias.permute(2, 0, 1)
    expected = score_differences(torch.softmax(scores.masked_fill(~allowed, -torch.inf), -1), allowed)
    torch.testing.assert_close(score_differences(weights, allowed), expected, atol=1e-10, rtol=0)
    assert torch.all(weights[..., ~allowed] == 0)


@pytest.mark.parametrize("scale, factor", [("sqrt", D**-0.5), ("none", 1.0), (0.3, 0.3)])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_scale_switch_multiplies_q_dot_k_inside_the_model(side, scale, factor):
    weights, q, k = self_attention("none", heads=1, side=side, scale=scale)
    length = weights.size(-1)
    allowed = torch.ones(length, length, dtype=torch.bool)
    if side == "decoder":
        allowed = allowed.tril()
    expected = torch.softmax((q @ k.transpose(-2, -1) * factor).masked_fill(~allowed, -torch.inf), -1)
    torch.testing.assert_close(weights, expected, atol=1e-10, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("need_weights", [True, False])
def test_causal_and_padding_masks_combine(need_weights):
    """Parameter-free attention (weights softmax_j(x_i . x_j), outputs sum_j w_ij x_j) over 4 positions
    whose first is padding: query i sees keys 1..i. (Query 0 sees no key at all; it is padding, and its
    row is left out.) float64, 1e-12."""
    attn = MultiHeadAttention(4, 1, qkv_projections=False, score=ScaledDotProduct(1.0))
    x = torch.randn(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    padding = torch.tensor([[False, True, True, True]] * 2)
    out, weights = attn(x, x, key_padding=padding, causal=True, need_weights=need_weights)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    allowed = (j <= i) & (j >= 1)
    expected = torch.softmax((x @ x.transpose(1, 2)).masked_fill(~allowed, -torch.inf), -1)[:, 1:]
    torch.testing.assert_close(out[:, 1:], expected @ x, atol=1e-12, rtol=0)
    if need_weights:
        torch.testing.assert_close(weights[:, 0, 1:], expected, atol=1e-12, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_dropout_drops_weights_in_training_only(need_weights):
    """Keys and values are the one-hot rows of I_6 and there are no projections, so the output rows are
    the weights after dropout: each w_ij is dropped (0) or kept and scaled by 1 / (1 - p) = 2. Without
    dropout w_ii = e / (e + 5) and w_ij = 1 / (e + 5). In eval mode nothing is dropped."""
    attn = MultiHeadAttention(6, 1, dropout=0.5, qkv_projections=False, score=ScaledDotProduct(1.0))
    x = torch.eye(6, dtype=torch.float64).expand(40, 6, 6)
    w = torch.full((6, 6), 1 / (math.e + 5), dtype=torch.float64).fill_diagonal_(math.e / (math.e + 5))
    attn.eval()
    torch.testing.assert_close(
        attn(x, x, need_weights=need_weights)[0], w.expand(40, 6, 6), atol=1e-12, rtol=0
    )
    attn.train()
    torch.manual_seed(0)
    out = attn(x, x, need_weights=need_weights)[0]
    dropped = out == 0
    torch.testing.assert_close(out[~dropped], 2 * w.expand(40, 6, 6)[~dropped], atol=1e-12, rtol=0)
    assert 0.4 < dropped.double().mean() < 0.6  # 1440 draws of p = 0.5


@torch.no_grad()
def test_attention_masks_are_made_on_the_inputs_device():
    # The meta device stands in for an accelerator: a mask made on the CPU could not meet the scores.
    attn = MultiHeadAttention(8, 2).to("meta")
    x = torch.empty(1, 3, 8, device="meta")
    for need_weights in (True, False):
        assert attn(x, x, causal=True, need_weights=need_weights)[0].device.type == "meta"


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="heads=3 must divide d_model=10"):
        MultiHeadAttention(10, 3)


def test_tanh_score_v_starts_uniform_within_one_over_sqrt_head_dim():
    # v ~ U(-a, a), a = 16^-1/2 = 0.25 per head of 16 features: 64 draws reach past +-0.15 on both sides
    # (each side fails with probability 0.8^64 < 1e-6; seeded).
    torch.manual_seed(0)
    v = AdditiveScore(64, 4).v
    assert v.abs().max() <= 0.25 and v.min() < -0.15 and v.max() > 0.15


def scaled_dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Vaswani et al. 2017: q_t . k_s / sqrt(d_k) for one head's (B, T, d_k) queries and (B, S, d_k) keys."""
    return q @ k.transpose(1, 2) / q.size(-1) ** 0.5


def cosine(g: float):
    """Henry et al. 2020 (QKNorm): g cos(q_t, k_s) = g q_t . k_s / (|q_t| |k_s|), for one head."""
    return lambda q, k: (
        g * (q @ k.transpose(1, 2)) / (q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :])
    )


def multi_head_by_hand(
    attn: MultiHeadAttention, query, key, allowed=None, bias=None, score=scaled_dot
) -> tuple:
    """Vaswani et al. 2017, Sec. 3.2.2: Concat(head_1, ..., head_h) W^O, head_i = softmax(score(Q W_i^Q,
    K W_i^K) + bias_i) V W_i^V, head i reading features i d_k .. (i + 1) d_k of the query and key
    projections and i d_v .. (i + 1) d_v of the value projection; keys where `allowed` (B, T, S) is False
    get weight 0. Returns the output and the weights (B, H, T, S)."""
    q, k, v = affine(attn.q_proj, query), affine(attn.k_proj, key), affine(attn.v_proj, key)
    dk, dv = q.size(-1) // attn.heads, v.size(-1) // attn.heads
    outputs, weights = [], []
    for i in range(attn.heads):
        f, fv = slice(i * dk, (i + 1) * dk), slice(i * dv, (i + 1) * dv)
        scores = score(q[..., f], k[..., f])  # (B, T, S)
        if bias is not None:
            scores = scores + bias[i]
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -torch.inf)
        weights.append(scores.softmax(-1))
        outputs.append(weights[-1] @ v[..., fv])
    return affine(attn.out_proj, torch.cat(outputs, -1)), torch.stack(weights, 1)


@torch.no_grad()
@pytest.mark.parametrize("padded", [True, False])
def test_multi_head_attention_is_the_concatenated_heads_times_w_o(padded):
    """Two heads of 4 features, 3 queries over 5 keys (the second sentence's last two padded, or no
    padding and so no mask at all), float64, 1e-12. `attend`, the entry cross-attention uses, is not
    causal unless asked; weights come back only when asked."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2).double()
    query, key = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]) if padded else None
    allowed = padding[:, None, :].expand(2, 3, 5) if padded else None
    expected, expected_weights = multi_head_by_hand(attn, query, key, allowed)
    out, weights = attn(query, key, key_padding=padding, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    for out, weights in (
        attn(query, key, key_padding=padding),
        attn.attend(query, *attn.keys_values(key), padding),
    ):
        assert weights is None
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("causal", [True, False])
def test_a_key_width_of_its_own_projects_queries_and_keys_to_it_and_scales_by_it(causal):
    """Vaswani et al.'s Table 3 (B) varies d_k alone: two heads of d_k = 3 query and key features and
    d_v = 4 value features (d_model 8), scores q.k / sqrt(3); both paths as the formula, float64, 1e-12."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, key_dim=3).double()
    assert attn.q_proj.weight.shape == attn.k_proj.weight.shape == (6, 8)
    assert attn.v_proj.weight.shape == attn.out_proj.weight.shape == (8, 8)
    x, padding, allowed = five_positions(padded=True, causal=causal)
    expected, expected_weights = multi_head_by_hand(attn, x, x, allowed)
    out, weights = attn(x, x, key_padding=padding, causal=causal, need_weights=True)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    fused, _ = attn(x, x, key_padding=padding, causal=causal)  # scaled_dot_product_attention's path
    torch.testing.assert_close(fused, expected, atol=1e-12, rtol=0)


def test_a_key_width_reaches_every_attention_of_the_transformer_and_its_scale():
    cfg = ModelConfig(d_model=16, heads=2, key_dim=4, layers=1, pos_encoding="rope")
    model = Transformer(cfg, 11, 11)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 3  # encoder self, decoder self, cross
    for attn in layers:
        assert attn.key_dim == 4 and attn.score.scale == 0.5 and attn.q_proj.weight.shape == (8, 16)
    assert model.positions.rotary.head_dim == 4  # rotary turns the query and key pairs
    unset = Transformer(ModelConfig(d_model=16, heads=2, layers=1), 11, 11)
    drop = sum(p.numel() for p in unset.parameters()) - sum(p.numel() for p in model.parameters())
    assert drop == 3 * 2 * ((16 * 16 + 16) - (16 * 8 + 8))  # Q and K of three attentions: 2 x 8 outputs to 2 x 4


def five_positions(padded: bool, causal: bool) -> tuple:
    """Self-attention inputs x (2, 5, 8) in float64, the key padding (the second sentence's last two, or
    None) and which keys each query may see (2, 5, 5): the real ones, and with `causal` the earlier ones."""
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]) if padded else None
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    allowed = torch.ones(2, 5, 5, dtype=torch.bool)
    if padded:
        allowed = allowed & padding[:, None, :]
    if causal:
        allowed = allowed & (j <= i)
    return x, padding, allowed


@torch.no_grad()
@pytest.mark.parametrize("padded, causal", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_a_score_bias_meets_the_masks_on_both_paths(padded, causal, need_weights):
    """ALiBi's bias -m_h |i - j| (m_1 = 2^-4, m_2 = 2^-8 for two heads) is added to q.k / sqrt(d_k), and
    padded (the second sentence's last two) and later keys still get weight 0; the fused path turns both
    into one additive mask, the explicit one adds and masks. Self-attention over 5 positions, float64."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, score_bias=ALiBi(2).double()).double()
    x, padding, allowed = five_positions(padded, causal)
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    bias = torch.stack([-(2.0**-4) * (i - j).abs(), -(2.0**-8) * (i - j).abs()]).double()
    expected, _ = multi_head_by_hand(attn, x, x, allowed, bias)
    out, _ = attn(x, x, key_padding=padding, causal=causal, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("padded, causal", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_a_t5_table_meets_the_masks_on_both_paths(padded, causal, need_weights):
    """A given table b (given_t5_table) adds b_h[bucket(j - i)] to q.k / sqrt(d_k): over 5 positions the
    buckets are the distances i - j of earlier keys and, bidirectional (no causal mask), 16 + (j - i) of
    later ones. Padded and later keys still get weight 0. float64, 1e-12."""
    torch.manual_seed(0)
    bias = T5Bias(2, 8, bidirectional=not causal).double()
    bias.weight.copy_(given_t5_table(1.0))
    attn = MultiHeadAttention(8, 2, score_bias=bias).double()
    x, padding, allowed = five_positions(padded, causal)
    by_hand = given_t5_table(1.0)[t5_buckets(5, bidirectional=not causal)].permute(2, 0, 1)  # (H, 5, 5)
    expected, expected_weights = multi_head_by_hand(attn, x, x, allowed, by_hand)
    out, weights = attn(x, x, key_padding=padding, causal=causal, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("padded, causal", [(True, True), (True, False), (False, True), (False, False)])
def test_cosine_weights_are_softmax_of_g_times_the_cosine_on_both_paths(padded, causal):
    """Henry et al. 2020: w_ts = softmax_s(g cos(q_t, k_s)) per head over the projected queries and keys,
    padded (the second sentence's last two) and later keys weight 0; g = 2.5 (so not 1/sqrt(d_k) = 0.5 by
    chance). Both paths, self-attention over 5 positions, float64, 1e-12."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, score=QKNorm(2.5)).double()
    x, padding, allowed = five_positions(padded, causal)
    expected, expected_weights = multi_head_by_hand(attn, x, x, allowed, score=cosine(2.5))
    out, weights = attn(x, x, key_padding=padding, causal=causal, need_weights=True)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        attn(x, x, key_padding=padding, causal=causal)[0], expected, atol=1e-12, rtol=0
    )
    # Not the scaled dot product: the score is another function of q and k.
    assert (expected_weights - multi_head_by_hand(attn, x, x, allowed)[1]).abs().max() > 1e-2


@pytest.mark.parametrize("pos", ["rope", "alibi"])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_cosine_score_keeps_rope_and_alibi_inside_the_model(pos, side):
    """model.score: cosine with model.scale: 2.5 (g's start) and relative positions, through the model.
    RoPE rotates q and k before the cosine; a rotation keeps each norm, so the score is g times the RoPE dot
    product (rope_scores, times sqrt(d)) over |q_m| |k_n|. ALiBi adds -slope_h |m - n| (encoder) or
    -slope_h (m - n) (causal decoder) to g cos(q_m, k_n). Two heads of 4; tolerances as above."""
    heads = 2
    weights, q, k = self_attention(pos, heads=heads, side=side, score="cosine", scale=2.5)
    length = weights.size(-1)
    m, n = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = torch.ones(length, length, dtype=torch.bool) if side == "encoder" else n <= m
    norms = q.norm(dim=-1)[..., :, None] * k.norm(dim=-1)[..., None, :]  # (H, L, L)
    if pos == "rope":
        scores, atol = 2.5 * rope_scores(q, k) * (D // heads) ** 0.5 / norms, 1e-5
    else:
        slopes = torch.tensor([2 ** (-8 * h / heads) for h in range(1, heads + 1)], dtype=torch.float64)
        distance = (m - n).abs() if side == "encoder" else m - n
        scores, atol = 2.5 * (q @ k.transpose(-2, -1)) / norms - slopes[:, None, None] * distance, 1e-10
    expected = score_differences(torch.softmax(scores.masked_fill(~allowed, -torch.inf), -1), allowed)
    torch.testing.assert_close(score_differences(weights, allowed), expected, atol=atol, rtol=0)
    assert torch.all(weights[..., ~allowed] == 0)


@torch.no_grad()
def test_alibi_attention_keeps_bfloat16_on_both_paths():
    # A model cast to bf16 (train.precision: bf16-true) keeps ALiBi's slopes, bias, weights and output in
    # bf16 on both paths, within bf16's precision of the float32 result.
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, score_bias=ALiBi(2))
    x = torch.randn(2, 5, 8)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    reference = attn(x, x, key_padding=padding, causal=True)[0]
    attn.to(torch.bfloat16)
    for need_weights in (True, False):
        out = attn(x.bfloat16(), x.bfloat16(), key_padding=padding, causal=True, need_weights=need_weights)[0]
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), reference, atol=0.05, rtol=0.05)


@torch.no_grad()
@pytest.mark.parametrize("kind", ["rope", "alibi", "t5"])
def test_relative_positions_hold_under_a_key_value_cache(kind):
    """Decoding one position at a time, each new key rotated at its own position (`offset`) and appended
    to the cache, the query at the last position, gives the outputs of causal attention over the whole
    sequence at once; 20 positions, so that T5's causal buckets reach past the exact ones. float64, 1e-12."""
    torch.manual_seed(0)
    slots = {
        "rope": {"rotary": Rotary(4)},
        "alibi": {"score_bias": ALiBi(2).double()},
        "t5": {"score_bias": T5Bias(2, 8, bidirectional=False).double()},
    }[kind]
    attn = MultiHeadAttention(8, 2, **slots).double()
    x = torch.randn(1, 20, 8, dtype=torch.float64)
    full = attn(x, x, causal=True)[0]
    keys, values = [], []
    for t in range(20):
        k, v = attn.keys_values(x[:, t : t + 1], offset=t)
        keys.append(k)
        values.append(v)
        out, _ = attn.attend(x[:, t : t + 1], torch.cat(keys, 2), torch.cat(values, 2), causal=True)
        torch.testing.assert_close(out, full[:, t : t + 1], atol=1e-12, rtol=0)


# --- The recurrent family's ScoreAttention ------------------------------------------------------------------


@torch.no_grad()
def test_score_attention_weighs_the_real_source_positions_by_the_prepared_keys():
    """Luong's general score s^T W_a h: weights = softmax over the real source positions, context =
    sum_j w_j h_j. `prepared` (W_a h, which a decoder keeps across steps) is what gets scored when given,
    and is computed from the keys when not: zeros given there score every position alike."""
    torch.manual_seed(0)
    attn = ScoreAttention(GeneralScore(8, 1), heads=1).double()
    query, keys = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    scores = query @ (keys @ attn.score.w.weight.T).transpose(1, 2)
    expected = scores.masked_fill(~padding[:, None, :], -torch.inf).softmax(-1)
    for prepared in (None, attn.prepare(keys)):
        context, weights = attn(query, keys, padding, prepared=prepared)
        torch.testing.assert_close(weights[:, 0], expected, atol=1e-12, rtol=0)
        torch.testing.assert_close(context, expected @ keys, atol=1e-12, rtol=0)
    _, weights = attn(query, keys, padding, prepared=torch.zeros_like(keys))
    uniform = padding[:, None, :].double().expand(2, 3, 5) / padding.sum(1)[:, None, None]
    torch.testing.assert_close(weights[:, 0], uniform, atol=1e-12, rtol=0)


def test_general_score_is_bilinear_without_a_bias():
    # s^T (W h + b) = s^T W h + s^T b: a bias would add a per-query constant that the softmax removes,
    # parameters that could never learn anything; Luong's general score has none.
    score = GeneralScore(8, 2)
    assert score.w.bias is None
    assert sum(p.numel() for p in score.parameters()) == 8 * 8


@torch.no_grad()
def test_location_score_has_one_output_per_source_position_up_to_max_positions():
    """Luong's location score a_t = W_a h_t has max_positions outputs: a source of S positions reads the
    first S (S = 3 and S = 6 = max_positions, with d_model 8 unequal to both); one more is an error naming
    the key."""
    torch.manual_seed(0)
    score = LocationScore(8, 1, max_positions=6).double()
    query = torch.randn(2, 3, 8, dtype=torch.float64)
    for length in (3, 6):
        expected = affine(score.w, query)[..., :length]
        got = score(query, torch.randn(2, length, 8, dtype=torch.float64))
        torch.testing.assert_close(got, expected[:, None], atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"^source length 7 exceeds model\.max_positions=6$"):
        score(query, torch.randn(2, 7, 8, dtype=torch.float64))
