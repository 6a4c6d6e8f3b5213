"""Positional encodings against their definitions: the lectures' sinusoid table, RoPE's relative
property, ALiBi's slopes, T5's buckets and bias table, what each does past the positions it was built or
trained for, where learned positions start, ALiBi's blindness to mirror images, and the registry of kinds."""

import math
import re

import pytest
import torch

from ablate.models.config import ModelConfig
from ablate.models.decoding import greedy_decode
from ablate.models.positional import POSITIONAL, PositionalKind
from ablate.models.positional_layers import (
    ALiBi,
    LearnedEncoding,
    Positions,
    Rotary,
    SinusoidalEncoding,
    T5Bias,
    sinusoidal_table,
    t5_bucket,
    t5_untrained,
)
from ablate.models.sequences import BOS_ID, EOS_ID
from ablate.models.transformer import Transformer


def test_sinusoidal_table_matches_the_lectures():
    # d = 4, n = 100: PE(p, 2i) = sin(p / n^(2i/d)), PE(p, 2i+1) = cos(p / n^(2i/d)).
    expected = torch.tensor(
        [[0, 1, 0, 1], [0.84, 0.54, 0.10, 1.00], [0.91, -0.42, 0.20, 0.98], [0.14, -0.99, 0.30, 0.96]]
    )
    table = sinusoidal_table(4, 4, base=100.0)
    torch.testing.assert_close(table.round(decimals=2), expected)


def test_pos_base_reaches_the_model_table():
    model = Transformer(ModelConfig(d_model=4, heads=2, pos_base=100.0), 8, 8)
    torch.testing.assert_close(model.positions.embedding.table[:4], sinusoidal_table(4, 4, base=100.0))


def test_sinusoidal_odd_dimension_and_growth_past_the_table():
    table = sinusoidal_table(6, 5)
    assert table.shape == (6, 5)
    torch.testing.assert_close(table[3, 4], torch.tensor(math.sin(3 / 10000 ** (4 / 5))))
    encoding = SinusoidalEncoding(8, max_positions=4)
    x = torch.zeros(2, 10, 8)
    torch.testing.assert_close(encoding(x), sinusoidal_table(10, 8).expand(2, 10, 8))


def sinusoid(positions: range, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The table's rows for `positions`, written out in float64 from the formula."""
    angle = lambda p, i: p / base ** (2 * (i // 2) / dim)  # noqa: E731
    return torch.tensor(
        [
            [math.sin(angle(p, i)) if i % 2 == 0 else math.cos(angle(p, i)) for i in range(dim)]
            for p in positions
        ],
        dtype=torch.float64,
    )


def test_sinusoidal_table_is_float32_rounding_of_the_float64_formula_far_out():
    # At position 2000 a frequency rounded to float32 (relative 6e-8) moves the angle by about 1e-5 rad;
    # the table must differ from the exact values by float32 rounding of the result only.
    table = sinusoidal_table(2048, 8)
    torch.testing.assert_close(table[2000:].double(), sinusoid(range(2000, 2048), 8), atol=2e-7, rtol=0)


def test_grown_table_keeps_the_base_and_serves_more_positions_than_features():
    # 3 positions built, 16 features: a sequence of 10 (offset 2, through Positions.embed) needs the table
    # grown past its length, not past its width, with the configured base. Tolerance: float32 rounding.
    positions = Positions(SinusoidalEncoding(16, max_positions=3, base=100.0), None, None)
    x = torch.randn(2, 8, 16)
    expected = x.double() + sinusoid(range(2, 10), 16, base=100.0)
    torch.testing.assert_close(positions.embed(x, offset=2).double(), expected, atol=1e-6, rtol=0)


def test_positional_layers_work_on_the_device_of_their_inputs():
    # The meta device stands in for an accelerator: anything made on the CPU could not meet the inputs.
    meta = torch.device("meta")
    assert SinusoidalEncoding(8, 4).to(meta)(torch.empty(1, 6, 8, device=meta)).device == meta  # grows
    assert Rotary(8)(torch.empty(1, 2, 5, 8, device=meta), offset=3).device == meta
    assert ALiBi(4).to(meta)(3, 5).device == meta


def test_fixed_position_buffers_stay_out_of_checkpoints():
    """Sinusoid table and ALiBi slopes are functions of the config: a checkpoint holds none, so one saved
    after the table grew loads into a fresh model."""
    cfg = ModelConfig(d_model=8, heads=2, layers=1, pos_encoding="alibi+sinusoidal", max_positions=4)
    grown = Transformer(cfg, 9, 9)
    grown(torch.randint(4, 9, (1, 12)), torch.randint(4, 9, (1, 3)))
    state = grown.state_dict()
    assert not [key for key in state if key.endswith(("table", "slopes"))]
    Transformer(cfg, 9, 9).load_state_dict(state)


def test_learned_positions_start_small():
    # N(0, 0.02^2) per entry; 64 x 256 draws put the sample std within 0.0005 of 0.02 (> 4 standard errors).
    torch.manual_seed(0)
    std = LearnedEncoding(64, 256).embedding.weight.std().item()
    assert abs(std - 0.02) < 5e-4


@pytest.mark.parametrize("embed_scale", [True, False])
@pytest.mark.parametrize("vocabs", [(40, 40), (1000, 20)])
def test_learned_positions_start_on_the_token_embeddings_scale_when_asked(vocabs, embed_scale):
    """model.pos_init: embedding draws the table N(0, σ²), σ the std of the token embeddings the positions
    are added to, times embed_scale's sqrt(d): the two sides' variances over their real rows, averaged.
    Xavier gives a side of V tokens the variance 2 / (V + d); d = 64: 40 tokens a side, σ = sqrt(2 / 104)
    = 0.139 (1.11 scaled); 1000 and 20, σ = sqrt((2 / 1064 + 2 / 84) / 2) = 0.114 (0.91 scaled), where
    pooling the rows would give 0.045. The table's 512 x 64 draws put its std within 1.5 % of σ (5
    standard errors); the rows' own sample std is what σ is, and xavier's values hold it to 5 %."""
    src_vocab, tgt_vocab = vocabs
    cfg = ModelConfig(
        d_model=64, heads=4, pos_encoding="learned", pos_init="embedding", embed_scale=embed_scale
    )
    torch.manual_seed(0)
    model = Transformer(cfg, src_vocab, tgt_vocab)
    scale = 8.0 if embed_scale else 1.0
    table = model.positions.embedding.embedding.weight
    variances = [embed.weight[1:].var().item() for embed in (model.src_embed, model.tgt_embed)]  # 0: padding
    sigma = math.sqrt(sum(variances) / 2) * scale
    assert abs(table.std().item() / sigma - 1) < 0.015
    xavier = math.sqrt((2 / (src_vocab + 64) + 2 / (tgt_vocab + 64)) / 2) * scale
    assert abs(sigma / xavier - 1) < 0.05
    # The default keeps the small start; the rest of the model is initialised as it was.
    torch.manual_seed(0)
    small = Transformer(cfg.model_copy(update={"pos_init": "small"}), src_vocab, tgt_vocab)
    assert abs(small.positions.embedding.embedding.weight.std().item() / 0.02 - 1) < 0.015
    others = {name: p for name, p in small.named_parameters() if not name.startswith("positions.")}
    assert all(torch.equal(p, dict(model.named_parameters())[name]) for name, p in others.items())


def test_learned_positions_without_an_encoder_take_the_target_embeddings_scale():
    # No encoder (cross_attention: false): the positions meet target tokens only, 20 of them: σ = sqrt(2 /
    # 84) = 0.154, not the 0.044 of the 1000-token source's table, which no layer reads.
    cfg = ModelConfig(
        d_model=64, heads=4, pos_encoding="learned", pos_init="embedding", cross_attention=False
    )
    torch.manual_seed(0)
    model = Transformer(cfg, 1000, 20)
    sigma = model.tgt_embed.weight[1:].std().item() * 8.0
    assert abs(model.positions.embedding.embedding.weight.std().item() / sigma - 1) < 0.015


@pytest.mark.parametrize("make", [lambda: SinusoidalEncoding(8, 16), lambda: LearnedEncoding(8, 16)])
def test_offset_gives_the_same_positions_as_the_full_sequence(make):
    encoding = make()
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(encoding(x[:, 4:], offset=4), encoding(x)[:, 4:])


def test_learned_positions_past_training_lengths_but_inside_the_table_work():
    encoding = LearnedEncoding(8, max_positions=16)
    out = encoding(torch.zeros(1, 16, 8))
    torch.testing.assert_close(out[0], encoding.embedding.weight)


def test_learned_positions_past_max_positions_fail_naming_the_key():
    encoding = LearnedEncoding(8, max_positions=16)
    with pytest.raises(ValueError, match=r"model\.max_positions: .*16 positions.*position 17"):
        encoding(torch.zeros(1, 17, 8))
    with pytest.raises(ValueError, match=r"model\.max_positions"):
        encoding(torch.zeros(1, 1, 8), offset=16)
    model = Transformer(ModelConfig(d_model=8, heads=2, pos_encoding="learned", max_positions=6), 9, 9)
    with pytest.raises(ValueError, match=r"model\.max_positions"):
        model(torch.randint(4, 9, (1, 7)), torch.randint(4, 9, (1, 3)))


def test_rope_scores_depend_only_on_relative_position():
    rotary = Rotary(head_dim=8, base=100.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        return (rotary(q, offset=m) * rotary(k, offset=n)).sum()

    torch.testing.assert_close(score(5, 2), score(3, 0))
    torch.testing.assert_close(score(40, 41), score(0, 1))
    assert not torch.allclose(score(5, 2), score(5, 3))
    # A rotation: norms are kept, and position 0 is the identity.
    x = torch.randn(2, 3, 6, 8)
    torch.testing.assert_close(rotary(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotary(x)[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(rotary(x[:, :, 2:], offset=2), rotary(x)[:, :, 2:])


def test_rope_rotates_pair_i_with_i_plus_half_by_position_times_theta():
    rotary = Rotary(head_dim=4, base=100.0)
    x = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4)
    out = rotary(x, offset=3)[0, 0, 0]
    # Pair (x_0, x_2) turns by 3 * theta_0 = 3 rad.
    torch.testing.assert_close(out, torch.tensor([math.cos(3.0), 0.0, math.sin(3.0), 0.0]))


def test_rope_default_base_and_low_precision_inputs():
    # Pair (x_1, x_3) of a 4-wide head turns by p * 10000^(-2/4) = 10 rad at p = 1000.
    x = torch.tensor([0.0, 1.0, 0.0, 0.0]).view(1, 1, 1, 4)
    out = Rotary(head_dim=4)(x, offset=1000)[0, 0, 0]
    torch.testing.assert_close(
        out, torch.tensor([0.0, math.cos(10.0), 0.0, math.sin(10.0)]), atol=1e-5, rtol=0
    )
    # bfloat16 in, bfloat16 out (angles in float32, then rounded): 8 bits of mantissa, tolerance 1e-2.
    low = Rotary(head_dim=4)(x.bfloat16(), offset=1000)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low[0, 0, 0].float(), out, atol=1e-2, rtol=0)


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(ALiBi.slopes_for(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    torch.testing.assert_close(ALiBi.slopes_for(4), torch.tensor([2.0**-i for i in (2, 4, 6, 8)]))
    # Not a power of two: the 4-head slopes, then every other slope of the 8-head set.
    torch.testing.assert_close(ALiBi.slopes_for(6), torch.tensor([2.0**-i for i in (2, 4, 6, 8, 1, 3)]))


def test_alibi_bias_is_minus_slope_times_distance_with_queries_last():
    alibi = ALiBi(2)
    bias = alibi(4, 4)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    torch.testing.assert_close(bias[0], -(2.0**-4) * (i - j).abs().float())  # 2 heads: 2^-4, 2^-8
    # One query after three cached keys is position 3: the last row of the full bias.
    torch.testing.assert_close(alibi(1, 4), bias[:, 3:])


# --- T5's relative position bias --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bidirectional, expected",
    [
        # 16 buckets a direction, the first 8 exact; a key after the query adds 16. Distance 20: 8 +
        # floor(8 ln(20 / 8) / ln(128 / 8)) = 8 + floor(2.64) = 10; 200: 8 + floor(9.29) = 17, past the
        # direction's last bucket, so 15.
        (True, [1, 0, 16 + 3, 16 + 10, 16 + 15, 10, 15]),
        # 32 buckets for keys at or before the query, the first 16 exact; a later key is bucket 0. Distance
        # 20: 16 + floor(16 ln(20 / 16) / ln(128 / 16)) = 16 + floor(1.72) = 17; 200: 16 + floor(19.43) = 35,
        # so 31.
        (False, [1, 0, 0, 0, 0, 17, 31]),
    ],
    ids=["bidirectional", "causal"],
)
def test_t5_buckets_by_hand(bidirectional, expected):
    relative = torch.tensor([-1, 0, 3, 20, 200, -20, -200])  # key position - query position
    assert t5_bucket(relative, bidirectional, buckets=32, max_distance=128).tolist() == expected
    assert t5_bucket(relative, bidirectional).tolist() == expected  # T5's 32 and 128 are the defaults


@pytest.mark.parametrize(
    "bidirectional, bucket_of",
    [
        # 8 + 8 ln(d / 8) / ln 16 at d = 11, 12: 8.92, 9.17; 22, 23: 10.92, 11.05; 45, 46: 12.98, 13.05;
        # 90, 91: 14.98, 15.02; 127: 15.98; 128: 16, the last bucket, 15.
        (True, {11: 8, 12: 9, 22: 10, 23: 11, 45: 12, 46: 13, 90: 14, 91: 15, 127: 15, 128: 15}),
        # 16 + 16 ln(d / 16) / ln 8 at d = 18, 19: 16.91, 17.32; 112, 113: 30.97, 31.04.
        (False, {18: 16, 19: 17, 112: 30, 113: 31, 128: 31}),
    ],
    ids=["bidirectional", "causal"],
)
def test_t5_buckets_change_at_the_distances_the_logarithm_gives(bidirectional, bucket_of):
    """Each pair is the last distance of a logarithmic bucket and the first of the next, so a base or a
    rounding other than T5's moves one of them."""
    distances = torch.tensor(list(bucket_of))
    assert t5_bucket(-distances, bidirectional).tolist() == list(bucket_of.values())


@pytest.mark.parametrize("bidirectional, per_direction", [(True, 16), (False, 32)])
def test_t5_buckets_grow_with_distance_and_reach_each_bucket_before_max_distance(
    bidirectional, per_direction
):
    distance = torch.arange(400)
    earlier = t5_bucket(-distance, bidirectional)
    assert (earlier.diff() >= 0).all() and earlier[: per_direction // 2].tolist() == list(
        range(per_direction // 2)
    )
    assert (
        set(earlier[:128].tolist()) == set(range(per_direction))
        and (earlier[128:] == per_direction - 1).all()
    )
    if bidirectional:  # later keys: the same buckets, 16 on
        assert torch.equal(t5_bucket(distance[1:], True), earlier[1:] + 16)


def test_t5_bias_is_the_table_entry_of_each_bucket_and_head():
    bias = T5Bias(heads=2, d_model=8, bidirectional=True)
    with torch.no_grad():
        bias.weight.copy_(torch.arange(64.0).view(2, 32).T)  # weight[bucket, head] = 32 head + bucket
    # Queries and keys 0..2: key - query [[0, 1, 2], [-1, 0, 1], [-2, -1, 0]]; a later key is 16 on.
    buckets = torch.tensor([[0, 17, 18], [1, 0, 17], [2, 1, 0]])
    torch.testing.assert_close(bias(3, 3), torch.stack([buckets, 32 + buckets]).float())
    # One query after cached keys is the last position: the last row of the full bias.
    torch.testing.assert_close(bias(1, 3), bias(3, 3)[:, 2:])
    bias.bidirectional = False  # later keys (masked under the causal mask) share bucket 0
    torch.testing.assert_close(bias(3, 3)[0], torch.tensor([[0, 0, 0], [1, 0, 0], [2, 1, 0]]).float())


def test_t5_bias_starts_at_hugging_faces_t5_scale():
    # N(0, 1 / d_model) per entry: d = 64, 32 x 64 draws put the sample std within 10 % of 1/8.
    torch.manual_seed(0)
    assert abs(T5Bias(heads=64, d_model=64, bidirectional=True).weight.std().item() * 8 - 1) < 0.1


@pytest.mark.parametrize("causal_mask", [True, False])
def test_t5_has_one_table_per_stack_shared_by_its_layers(causal_mask):
    """T5 shares its position bias across layers, the encoder's and the decoder's apart; cross-attention gets
    none. The decoder's buckets are causal under the causal mask and bidirectional without it, where it
    sees later positions."""
    cfg = ModelConfig(d_model=8, heads=2, layers=3, pos_encoding="t5", causal_mask=causal_mask)
    model = Transformer(cfg, 9, 9)
    encoder = {id(layer.self_attn.fn.attn.score_bias) for layer in model.encoder}
    decoder = {id(layer.self_attn.fn.attn.score_bias) for layer in model.decoder}
    assert encoder == {id(model.positions.score_bias["src"])} and decoder == {
        id(model.positions.score_bias["tgt"])
    }
    assert model.positions.score_bias["src"].bidirectional
    assert model.positions.score_bias["tgt"].bidirectional is not causal_mask
    assert all(layer.cross_attn.fn.attn.score_bias is None for layer in model.decoder)
    names = [name for name, _ in model.named_parameters() if name.startswith("positions.")]
    assert names == ["positions.score_bias.src.weight", "positions.score_bias.tgt.weight"]
    assert model.positions.score_bias["src"].weight.shape == (32, 2)
    # No encoder, no encoder table.
    alone = Transformer(cfg.model_copy(update={"cross_attention": False}), 9, 9)
    assert list(alone.positions.score_bias) == ["tgt"]


# --- ALiBi and mirror images ------------------------------------------------------------------------------


def mirror_pair(heads: int = 4) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Two sources (the second padded) and their mirror images: each row's tokens, EOS included, in reverse
    order, padding left in place; with the real lengths."""
    src = torch.tensor([[5, 6, 7, 8, 9, 10, EOS_ID], [9, 4, 11, 6, EOS_ID, 0, 0]])
    lengths = [7, 5]
    mirrored = src.clone()
    for row, n in enumerate(lengths):
        mirrored[row, :n] = src[row, :n].flip(0)
    return src, mirrored, lengths


def mirror_model(pos_encoding: str) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, heads=4, layers=2, d_ff=32, dropout=0.0, pos_encoding=pos_encoding)
    return Transformer(cfg, 12, 12).double().eval()


def test_alibi_alone_gives_the_same_output_for_a_source_and_its_mirror_image():
    """The encoder bias -m|i - j| is the same for positions i, j and for their mirror images n-1-i, n-1-j;
    nothing is added to the embeddings; cross-attention is a weighted sum over an unordered set of memory
    vectors. So reflecting a source reflects the encoder's outputs and leaves every decoder output as it
    was. Real sources end in EOS: a source and its reverse differ only in where EOS sits, and that is all
    the model has to tell them apart."""
    model = mirror_model("alibi")
    src, mirrored, lengths = mirror_pair()
    memory, _, _ = model.encode(src)
    memory_mirrored, _, _ = model.encode(mirrored)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(memory_mirrored[row, :n], memory[row, :n].flip(0), rtol=0, atol=1e-12)
    tgt_in = torch.tensor([[BOS_ID, 10, 9, 8, 7], [BOS_ID, 6, 11, 4, 9]])
    torch.testing.assert_close(model(mirrored, tgt_in), model(src, tgt_in), rtol=0, atol=1e-12)
    decoded = greedy_decode(model, src, BOS_ID, EOS_ID, 0, max_len=9)
    torch.testing.assert_close(greedy_decode(model, mirrored, BOS_ID, EOS_ID, 0, max_len=9), decoded)
    # Order is not invisible: with EOS kept last, the reversed tokens are no mirror image and read differently.
    reversed_eos_last = src.clone()
    for row, n in enumerate(lengths):
        reversed_eos_last[row, : n - 1] = src[row, : n - 1].flip(0)
    gap = (model(reversed_eos_last, tgt_in) - model(src, tgt_in)).abs().amax(-1)
    assert (gap > 1e-4).all(), gap


@pytest.mark.parametrize("pos_encoding", ["alibi+sinusoidal", "alibi+learned", "sinusoidal", "rope", "t5"])
def test_absolute_positions_beside_alibi_and_other_kinds_see_mirror_images(pos_encoding):
    model = mirror_model(pos_encoding)
    src, mirrored, _ = mirror_pair()
    tgt_in = torch.tensor([[BOS_ID, 10, 9, 8, 7], [BOS_ID, 6, 11, 4, 9]])
    gap = (model(mirrored, tgt_in) - model(src, tgt_in)).abs().amax(-1)  # (B, T)
    assert (gap > 1e-4).all(), gap


# --- the registry: one list of kinds, one dispatch point ---------------------------------------------------


def test_joined_kinds_take_each_part_from_the_kind_that_has_it():
    model = Transformer(ModelConfig(d_model=8, heads=2, pos_encoding="alibi+sinusoidal"), 9, 9)
    attention = model.encoder[0].self_attn.fn.attn
    assert isinstance(model.positions.embedding, SinusoidalEncoding)
    assert isinstance(attention.score_bias, ALiBi) and attention.rotary is None
    cross = model.decoder[0].cross_attn.fn.attn
    assert cross.score_bias is None and cross.rotary is None  # relative positions stay inside a sequence
    alone = Transformer(ModelConfig(d_model=8, heads=2, pos_encoding="alibi"), 9, 9)
    x = torch.randn(1, 3, 8)
    torch.testing.assert_close(alone.positions.embed(x), x)
    torch.testing.assert_close(model.positions.embed(x), x + sinusoidal_table(3, 8))


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "wavelet",
            "unknown kind 'wavelet'; known: none, sinusoidal, learned, rope, alibi, t5; kinds that add different "
            "parts join with '+' (e.g. alibi+sinusoidal)",
        ),
        (
            "sinusoidal+learned",
            "'sinusoidal+learned': join kinds that each add a different part (embedding, ",
        ),
        ("alibi+alibi", "'alibi+alibi': join kinds that each add a different part"),
        ("none+alibi", "'none+alibi': join kinds that each add a different part"),
        ("alibi+t5", "'alibi+t5': join kinds that each add a different part"),
    ],
)
def test_pos_encoding_accepts_the_registry_names_and_joins_of_different_parts(name, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelConfig(pos_encoding=name)
    for accepted in [*POSITIONAL, "alibi+sinusoidal", "rope+learned", "rope+alibi", "t5+sinusoidal"]:
        ModelConfig(pos_encoding=accepted)


def test_rope_needs_an_even_head_dimension_and_other_kinds_do_not():
    from pydantic import ValidationError

    message = "pos_encoding: rope rotates pairs of features and needs an even query and key width per head (d_k=3)"
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelConfig(d_model=6, heads=2, pos_encoding="rope")
    with pytest.raises(ValidationError, match=re.escape(message)):  # a key width of its own, odd
        ModelConfig(d_model=8, heads=2, key_dim=3, pos_encoding="rope")
    for name in ("sinusoidal", "alibi", "none"):
        ModelConfig(d_model=6, heads=2, pos_encoding=name)
    ModelConfig(d_model=8, heads=2, pos_encoding="rope")
    ModelConfig(d_model=6, heads=2, key_dim=4, pos_encoding="rope")  # d_model/heads = 3, but d_k = 4


@pytest.mark.parametrize(
    "model, limits",
    [
        (dict(pos_encoding="learned"), (6, 6)),
        (dict(pos_encoding="alibi+learned"), (6, 6)),
        (dict(pos_encoding="alibi+sinusoidal"), (None, None)),
        (dict(pos_encoding="rope"), (None, None)),
        (dict(arch="lstm", attention="location"), (6, None)),
        (dict(arch="lstm", attention="additive"), (None, None)),
    ],
)
def test_position_limits_come_from_the_kind(model, limits):
    assert ModelConfig(max_positions=6, **model).position_limits == limits


def test_a_kind_added_to_the_registry_reaches_config_and_model(monkeypatch):
    """Adding a kind is one registry entry (and its layer): the config accepts it, the model builds it."""
    doubled = PositionalKind(embedding=lambda layers, cfg: Doubling())
    monkeypatch.setitem(POSITIONAL, "doubled", doubled)
    model = Transformer(ModelConfig(d_model=8, heads=2, pos_encoding="doubled+alibi"), 9, 9)
    x = torch.randn(1, 3, 8)
    torch.testing.assert_close(model.positions.embed(x), 2 * x)
    assert isinstance(model.encoder[0].self_attn.fn.attn.score_bias, ALiBi)


class Doubling(torch.nn.Module):
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return 2 * x


def test_t5_buckets_past_the_training_length_are_named_untrained():
    # Trained on windows of 32 (+ BOS) and tested on 4L: T5's own buckets for distances 33-128 never train.
    assert t5_untrained(33, 129, bidirectional=False) == list(range(22, 32))
    # Scaled to L, every distance past L shares the last bucket, which training reaches.
    assert t5_untrained(33, 129, bidirectional=False, max_distance=33) == []
    # Bidirectional: 16 buckets a direction, exact below 8: distance 7 its own, 8-10 share bucket 8.
    assert t5_untrained(7, 11, bidirectional=True) == [7, 8, 23, 24]
    assert t5_untrained(7, 11, bidirectional=True, buckets=8, max_distance=6) == []
    assert t5_untrained(40, 40, bidirectional=True) == []  # nothing tested beyond training
