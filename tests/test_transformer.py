"""The Transformer family: agreement with torch.nn.Transformer, fast vs explicit attention, what each
ablation switch does to the built module, incremental decoding, diagnostics, and learning `reverse`."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablate.models.attention import MultiHeadAttention, QKNorm, ScaledDotProduct
from ablate.models.config import ModelConfig, preset_keys
from ablate.models.diagnostics import at_initialisation, attention_entropy, rank_collapse, visible_keys
from ablate.models.kinds import NORMS
from ablate.models.transformer import FeedForward, Transformer
from ablate.models.transformer_scores import TRANSFORMER_SCORES, ScoreKind

VOCAB = 11  # 4 specials + 7 symbols
PAD, BOS, EOS = 0, 1, 2


pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(**overrides) -> ModelConfig:
    base = dict(d_model=16, heads=2, layers=2, d_ff=32, dropout=0.0)
    return ModelConfig(**{**base, **overrides})


def build(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny(**overrides), VOCAB, VOCAB, PAD).eval()


def batch(b: int = 3, s: int = 7, t: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources and BOS-started targets with some padding at the end of the first rows."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (b, s), generator=g)
    tgt = torch.randint(4, VOCAB, (b, t), generator=g)
    tgt[:, 0] = BOS
    src[0, s - 3 :] = PAD
    tgt[1, t - 2 :] = PAD
    return src, tgt


# --- agreement with torch.nn.Transformer -------------------------------------------------------------


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.load_state_dict(ours.out_proj.state_dict())


def copy_sublayers(sublayers, theirs_layer, attention_names, norm_names, pre: bool) -> None:
    *attentions, ff = sublayers
    for ours, name in zip(attentions, attention_names):
        copy_attention(ours.fn.attn, getattr(theirs_layer, name))
    theirs_layer.linear1.load_state_dict(ff.fn.net[0].state_dict())
    theirs_layer.linear2.load_state_dict(ff.fn.net[3].state_dict())
    for ours, name in zip(sublayers, norm_names):
        getattr(theirs_layer, name).load_state_dict((ours.pre_norm if pre else ours.post_norm).state_dict())


@torch.no_grad()
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_vanilla_settings_equal_torch_nn_transformer(norm):
    """ReLU feed-forward, sinusoidal positions, 1/sqrt(d_k), residuals; post-LN (Vaswani et al.) and
    pre-LN (nn.Transformer's norm_first). nn.Transformer always ends its encoder and decoder stacks with a
    LayerNorm. Pre-LN needs exactly that final norm, and ours has it (weights copied below). The post-LN
    paper model has none, since every sublayer already ends in a LayerNorm, so for post-LN those two
    final norms are replaced by Identity: the comparison is then layer for layer, with nothing hidden."""
    model = build(norm=norm, layers=2, heads=4)
    reference = nn.Transformer(
        16, 4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32, dropout=0.0,
        batch_first=True, norm_first=norm == "pre",
    ).eval()  # fmt: skip
    pre = norm == "pre"
    for ours, theirs in zip(model.encoder, reference.encoder.layers):
        copy_sublayers([ours.self_attn, ours.ff], theirs, ["self_attn"], ["norm1", "norm2"], pre)
    for ours, theirs in zip(model.decoder, reference.decoder.layers):
        copy_sublayers(
            [ours.self_attn, ours.cross_attn, ours.ff], theirs,
            ["self_attn", "multihead_attn"], ["norm1", "norm2", "norm3"], pre,
        )  # fmt: skip
    if pre:
        reference.encoder.norm.load_state_dict(model.encoder_norm.state_dict())
        reference.decoder.norm.load_state_dict(model.decoder_norm.state_dict())
    else:
        reference.encoder.norm, reference.decoder.norm = nn.Identity(), nn.Identity()

    src, tgt = batch()
    expected = model.generator(
        reference(
            model._embed(model.src_embed, src), model._embed(model.tgt_embed, tgt),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.size(1)), tgt_is_causal=True,
            src_key_padding_mask=src == PAD, memory_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt == PAD,
        )
    )  # fmt: skip
    torch.testing.assert_close(model(src, tgt), expected)
    torch.testing.assert_close(model(src, tgt, need_weights=True)[0], expected)


# --- fast and explicit attention -----------------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pos", ["none", "sinusoidal", "learned", "rope", "alibi", "t5"])
@pytest.mark.parametrize(
    "score",
    [
        dict(scale="sqrt"),
        dict(scale="none"),
        dict(scale=0.3),
        dict(score="cosine"),
        dict(score="cosine", scale=3.0),
    ],
)
def test_fast_and_explicit_paths_agree(score, pos, causal):
    model = build(**score, pos_encoding=pos, causal_mask=causal, heads=4)
    src, tgt = batch()
    fast = model(src, tgt)
    explicit, weights = model(src, tgt, need_weights=True)
    # cosine's g starts at log2(L² - L) = 18 for L = 512: a softmax that sharp carries float32 rounding about
    # a hundredfold through two layers (up to 7e-5 over seeds, for ALiBi, RoPE and T5 alike; float64: 1e-13).
    atol = 1e-4 if score == dict(score="cosine") else 1e-5
    torch.testing.assert_close(explicit, fast, atol=atol, rtol=0)
    for kind, size in (("encoder", (3, 4, 7, 7)), ("decoder", (3, 4, 6, 6)), ("cross", (3, 4, 6, 7))):
        assert [w.shape for w in weights[kind]] == [size, size]
        for w in weights[kind]:
            torch.testing.assert_close(w.sum(-1), torch.ones(size[:3]))
            assert (w[0, ..., 4:] == 0).all() or kind == "decoder"  # source padding gets nothing
    upper = torch.ones(6, 6, dtype=torch.bool).triu(1)
    decoder_future = torch.stack(weights["decoder"])[..., upper]
    assert (decoder_future == 0).all() == causal


def attention_inputs(d: int = 8, t: int = 5, s: int = 6):
    torch.manual_seed(3)
    return torch.randn(2, t, d), torch.randn(2, s, d)


@torch.no_grad()
@pytest.mark.parametrize("scale, factor", [(None, 8**-0.5), (1.0, 1.0), (0.3, 0.3)])
def test_scale_multiplies_q_dot_k_exactly(scale, factor):
    attn = MultiHeadAttention(8, 1, score=None if scale is None else ScaledDotProduct(scale)).eval()
    query, key = attention_inputs()
    out, weights = attn(query, key, need_weights=True)
    q, k, v = attn.q_proj(query), attn.k_proj(key), attn.v_proj(key)
    expected = (q @ k.transpose(1, 2) * factor).softmax(-1)
    torch.testing.assert_close(weights[:, 0], expected)
    torch.testing.assert_close(out, attn.out_proj(expected @ v))
    torch.testing.assert_close(attn(query, key)[0], out)


@torch.no_grad()
def test_no_qkv_projections_is_the_lectures_parameter_free_self_attention():
    attn = MultiHeadAttention(8, 1, qkv_projections=False, score=ScaledDotProduct(1.0))
    assert not list(attn.parameters())
    x, _ = attention_inputs()
    out, weights = attn(x, x, need_weights=True)
    expected = (x @ x.transpose(1, 2)).softmax(-1)  # w_ij = softmax_j(x_i . x_j)
    torch.testing.assert_close(weights[:, 0], expected)
    torch.testing.assert_close(out, expected @ x)  # y_i = sum_j w_ij x_j
    model = build(qkv_projections=False)
    assert not any(p.numel() for layer in model.encoder for p in layer.self_attn.fn.parameters())


# --- causal mask -----------------------------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("causal", [True, False])
def test_causal_mask_hides_later_target_tokens(causal):
    model = build(causal_mask=causal)
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, VOCAB, changed[:, 3:].shape, generator=torch.Generator().manual_seed(9))
    before, after = model(src, tgt), model(src, changed)
    assert torch.equal(before[:, :3], after[:, :3]) == causal
    if not causal:  # the leak: earlier positions see the change
        assert (before[:, :3] - after[:, :3]).abs().max() > 1e-3


# --- residual and norm switches, on the module ------------------------------------------------------


def zero_sublayer_outputs(model: Transformer) -> None:
    """Every attention and feed-forward sublayer then outputs exactly 0."""
    with torch.no_grad():
        for layer in model.encoder:
            for linear in (layer.self_attn.fn.attn.out_proj, layer.ff.fn.net[3]):
                linear.weight.zero_()
                linear.bias.zero_()


@torch.no_grad()
@pytest.mark.parametrize("residual", [True, False])
def test_residual_switch_removes_the_skip(residual):
    model = build(residual=residual, norm="none")
    assert all(s.residual == residual for layer in model.encoder for s in (layer.self_attn, layer.ff))
    zero_sublayer_outputs(model)
    src, _ = batch()
    memory, _, _ = model.encode(src)
    embedded = model._embed(model.src_embed, src)
    # With zero sublayers the skip alone carries the input through; without it nothing is left.
    torch.testing.assert_close(memory, embedded if residual else torch.zeros_like(embedded))


@torch.no_grad()
def test_ffn_switch_without_residuals_leaves_pure_attention():
    """Dong et al. 2021's self-attention network: each layer's output is its attention's alone."""
    model = build(ffn=False, residual=False, norm="none", dropout=0.0)
    assert not any(isinstance(m, FeedForward) for m in model.modules())
    src, _ = batch()
    memory, padding, _ = model.encode(src)
    x = model._embed(model.src_embed, src)
    for layer in model.encoder:
        x, _ = layer.self_attn.fn(x, padding)
    torch.testing.assert_close(memory, x)


def norms(model: Transformer, kind: type[nn.Module]) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, kind)]


def test_norm_switch_places_or_removes_the_norms():
    layers = 2
    sublayers = layers * 2 + layers * 3  # encoder: attention + ff; decoder: self + cross + ff
    post, pre, rms, none = (build(norm=n, layers=layers) for n in ("post", "pre", "rms_pre", "none"))
    assert norms(none, nn.LayerNorm) == [] and norms(none, nn.RMSNorm) == []
    assert len(norms(post, nn.LayerNorm)) == sublayers
    assert all(name.endswith("post_norm") for name in norms(post, nn.LayerNorm))
    assert isinstance(post.encoder_norm, nn.Identity)
    assert len(norms(pre, nn.LayerNorm)) == sublayers + 2  # + the final encoder and decoder norms
    assert all(
        name.endswith(("pre_norm", "encoder_norm", "decoder_norm")) for name in norms(pre, nn.LayerNorm)
    )
    assert norms(rms, nn.LayerNorm) == [] and len(norms(rms, nn.RMSNorm)) == sublayers + 2


@torch.no_grad()
def test_post_ln_normalises_every_layer_output_and_no_norm_does_not():
    src, _ = batch()
    for norm, normalised in (("post", True), ("none", False)):
        memory, _, _ = build(norm=norm, embed_scale=True).encode(src)
        std = memory.std(-1, unbiased=False)
        assert torch.allclose(std, torch.ones_like(std), atol=1e-3) == normalised


# --- every switch value builds and trains --------------------------------------------------------------

SWITCHES = [
    ("scale", ["sqrt", "none", 0.5]),
    ("score", ["dot", "cosine"]),
    ("pos_encoding", ["none", "sinusoidal", "learned", "rope", "alibi", "t5"]),
    ("pos_base", [100.0]),
    ("residual", [True, False]),
    ("ffn", [True, False]),
    ("norm", list(NORMS)),
    ("heads", [1, 4]),
    ("layers", [1, 3]),
    ("d_model", [8, 24]),
    ("d_ff", [8]),
    ("dropout", [0.0, 0.3]),
    ("causal_mask", [True, False]),
    ("cross_attention", [True, False]),
    ("decoder_self_attention", [True, False]),
    ("embed_scale", [True, False]),
    ("tie_embeddings", [True, False]),
    ("qkv_projections", [True, False]),
]


@pytest.mark.parametrize("key, value", [(k, v) for k, values in SWITCHES for v in values])
def test_every_switch_value_builds_and_trains_a_step(key, value):
    model = build(**{"dropout": 0.0, key: value})
    src, tgt = batch()
    tgt_out = torch.roll(tgt, -1, dims=1)

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(src, tgt).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)

    with torch.no_grad():
        before = loss()
        explicit, weights = model(src, tgt, need_weights=True)
        # Relative tolerance too: without norms (norm: none) activations grow large.
        torch.testing.assert_close(explicit, model(src, tgt), atol=1e-5, rtol=1e-5)
        assert (weights["cross"][0] is None) == (key == "cross_attention" and not value)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(3):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        after = loss()
    assert torch.isfinite(after) and after < before


def qk_norms(model: nn.Module) -> list[QKNorm]:
    return [m for m in model.modules() if isinstance(m, QKNorm)]


@pytest.mark.parametrize(
    "model, start",
    [(dict(max_positions=20), math.log2(20**2 - 20)), (dict(max_positions=20, scale=3.0), 3.0)],
)
def test_cosine_score_has_one_learned_g_per_attention_layer_starting_as_configured(model, start):
    """Henry et al. 2020 start g at log2(L^2 - L), L a length the model sees (here model.max_positions);
    a number in model.scale starts it there instead. Each attention layer (encoder self, decoder self and
    cross: 2 + 2 + 2 here) has its own g, one scalar shared by the layer's heads."""
    transformer = build(score="cosine", **model)
    scores = qk_norms(transformer)
    assert len(scores) == 6 and len({id(s.g) for s in scores}) == 6
    assert all(s.g.shape == () and s.g.requires_grad and s.g.item() == pytest.approx(start) for s in scores)


def test_every_attention_layer_builds_its_own_score_from_the_registry(monkeypatch):
    """Adding a score is its class and one registry entry: the model builds each attention's score from the
    entry `model.score` names, a fresh one per attention (encoder self, decoder self and cross: 6 here)."""
    monkeypatch.setitem(TRANSFORMER_SCORES, "dot", ScoreKind(lambda a, cfg: a.QKNorm(1.5), ("sqrt",), ""))
    scores = [m.score for m in build().modules() if isinstance(m, MultiHeadAttention)]
    assert len({id(s) for s in scores}) == 6 and all(type(s) is QKNorm and s.g.item() == 1.5 for s in scores)


def test_cosine_score_learns_to_copy_in_a_few_steps():
    """A one-layer Transformer with model.score: cosine, teacher-forced to copy 32 sources of 5 symbols
    (then EOS): 30 Adam steps more than halve the loss, and every g has moved (gradients reach it)."""
    model = build(score="cosine", layers=1, max_positions=8).train()
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, VOCAB, (32, 5), generator=g)
    tgt_in = torch.cat([torch.full((32, 1), BOS), src], dim=1)
    tgt_out = torch.cat([src, torch.full((32, 1), EOS)], dim=1)
    starts = [score.g.item() for score in qk_norms(model)]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2
    assert all(score.g.item() != start for score, start in zip(qk_norms(model), starts))


def test_weights_start_xavier_uniform_except_positions_and_padding():
    """Every weight matrix is Xavier-uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) and standard
    deviation a / sqrt(3); the learned position table keeps its N(0, 0.02^2); the padding rows are zero.
    Tolerance on the sample std: 25 % (the smallest matrix, 11 x 16, has a relative standard error of 6 %)."""
    model = build(pos_encoding="learned", max_positions=64)
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.startswith("positions."):
            continue
        fan_out, fan_in = p.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        rows = torch.cat([p[:PAD], p[PAD + 1 :]]) if name.endswith("_embed.weight") else p
        assert rows.abs().max() <= bound, name
        assert abs(rows.std().item() / (bound / math.sqrt(3)) - 1) < 0.25, name
    assert abs(model.positions.embedding.embedding.weight.std().item() / 0.02 - 1) < 0.25
    assert not model.src_embed.weight[PAD].any() and not model.tgt_embed.weight[PAD].any()


def test_tied_embeddings_share_one_tensor():
    model = build(tie_embeddings=True)
    assert model.generator.weight is model.tgt_embed.weight
    assert build().generator.weight is not build().tgt_embed.weight


@torch.no_grad()
def test_embed_scale_multiplies_embeddings_by_sqrt_d_model():
    src, _ = batch()
    scaled, plain = (
        build(embed_scale=True, pos_encoding="none"),
        build(embed_scale=False, pos_encoding="none"),
    )
    torch.testing.assert_close(scaled._embed(scaled.src_embed, src), plain._embed(plain.src_embed, src) * 4.0)


# --- incremental decoding --------------------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize(
    "overrides",
    [dict(pos_encoding=p) for p in ("sinusoidal", "learned", "rope", "alibi", "t5", "none")]
    + [dict(norm="pre"), dict(causal_mask=False), dict(cross_attention=False), dict(qkv_projections=False)]
    + [dict(pos_encoding="t5", causal_mask=False), dict(decoder_self_attention=False)]
    + [dict(score="cosine", pos_encoding="rope"), dict(score="cosine", pos_encoding="alibi")]
    + [dict(layers=1)],
)
def test_step_equals_full_decoding_of_the_prefix(overrides):
    """step() with its key/value cache gives at each position what forward gives on the prefix so far
    (for a non-causal decoder, the prefix is all forward can be given: later tokens do not exist yet)."""
    model = build(**overrides)
    src, tgt = batch()
    tgt[1, 4:] = PAD  # a finished sequence keeps being fed padding, as greedy_decode does
    state = model.init_state(src)
    assert ("self_k" in state) == (model.cfg.causal_mask and model.cfg.decoder_self_attention)
    for t in range(tgt.size(1)):
        logits, state = model.step(state, tgt[:, t])
        expected = model(src, tgt[:, : t + 1])[:, -1]
        live = tgt[:, t] != PAD
        torch.testing.assert_close(logits[live], expected[live])
    assert torch.equal(state["prefix"], tgt)


@torch.no_grad()
def test_step_state_is_batch_first_and_reorders_like_beams():
    model = build()
    src, tgt = batch()
    state = model.init_state(src)
    assert all(v.size(0) == 3 for v in state.values())
    for t in range(3):
        _, state = model.step(state, tgt[:, t])
    assert all(v.size(0) == 3 for v in state.values())
    assert state["self_k"].shape == (3, 2, 2, 3, 8)  # (B, layers, H, positions, Dh)
    order = torch.tensor([2, 0, 1])
    reordered = {k: v.index_select(0, order) for k, v in state.items()}
    logits, _ = model.step(reordered, tgt[order, 3])
    torch.testing.assert_close(logits, model(src[order], tgt[order, :4])[:, -1])


@torch.no_grad()
def test_step_projects_the_source_for_cross_attention_once():
    model = build()
    src, tgt = batch()
    projections = []
    for layer in model.decoder:
        for proj in (layer.cross_attn.fn.attn.k_proj, layer.cross_attn.fn.attn.v_proj):
            proj.register_forward_hook(lambda *_: projections.append(1))
    state = model.init_state(src)
    assert len(projections) == 4  # keys and values of 2 layers
    for t in range(3):
        _, state = model.step(state, tgt[:, t])
    assert len(projections) == 4


@torch.no_grad()
def test_weights_are_computed_only_when_asked():
    # Without need_weights every layer takes the fused scaled_dot_product_attention path, which has none.
    model = build()
    src, tgt = batch()
    memory, padding, enc_w = model.encode(src)
    _, self_w, cross_w = model.decode(tgt, memory, padding)
    assert enc_w == self_w == cross_w == [None, None]


# --- diagnostics ---------------------------------------------------------------------------------------


def test_rank_collapse_is_zero_for_identical_tokens_and_ignores_padding():
    row = torch.randn(1, 1, 6)
    assert rank_collapse(row.expand(2, 5, 6)).abs().max() < 1e-6
    x = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    torch.testing.assert_close(rank_collapse(x), torch.tensor([1.0]))  # mean 0: all of X is residual
    padded = torch.cat([row.expand(1, 3, 6), torch.randn(1, 2, 6)], dim=1)
    mask = torch.tensor([[True, True, True, False, False]])
    assert rank_collapse(padded, mask).abs().max() < 1e-6


@torch.no_grad()
def test_pure_attention_loses_rank_and_skip_connections_prevent_it():
    """Dong et al. 2021: stacked self-attention without skips converges to rank 1 (all tokens equal)."""
    torch.manual_seed(0)
    layers = [MultiHeadAttention(32, 4) for _ in range(6)]
    x = torch.randn(4, 10, 32)
    pure, skip = x, x
    pure_curve, skip_curve = [], []
    for attn in layers:
        pure = attn(pure, pure)[0]
        skip = skip + attn(skip, skip)[0]
        pure_curve.append(rank_collapse(pure).mean().item())
        skip_curve.append(rank_collapse(skip).mean().item())
    assert pure_curve[0] > 0.1 and pure_curve[2] < 1e-4  # collapse within a few layers
    assert min(skip_curve) > 0.5


@torch.no_grad()
def test_record_states_holds_every_layers_output():
    model = build(layers=3, heads=4)
    src, tgt = batch()
    with model.record_states() as hidden:
        model(src, tgt)
    assert [h.shape for h in hidden["encoder"]] == [(3, 7, 16)] * 3
    assert [h.shape for h in hidden["decoder"]] == [(3, 6, 16)] * 3
    memory, _, _ = model.encode(src)
    torch.testing.assert_close(hidden["encoder"][-1], memory)  # post-LN: no final norm
    collapse = torch.stack([rank_collapse(h, src != PAD).mean() for h in hidden["encoder"]])
    assert ((collapse > 0) & (collapse <= 1)).all()
    # Without cross-attention there are no encoder layers to record.
    model = build(cross_attention=False)
    with model.record_states() as hidden:
        model(src, tgt)
    assert hidden["encoder"] == [] and len(hidden["decoder"]) == 2


def test_attention_entropy_is_scipys_entropy_over_the_keys_the_masks_allow():
    from scipy.stats import entropy

    g = torch.Generator().manual_seed(0)
    src, tgt = batch()
    visible = visible_keys(src, tgt, causal=True)["decoder"]  # (B, T, T): padded and later keys hidden
    real = tgt != PAD
    by_hand = [
        [[bool(real[b, t] and real[b, k] and k <= t) for k in range(6)] for t in range(6)] for b in range(3)
    ]
    assert torch.equal(visible, torch.tensor(by_hand))  # a padded query sees nothing
    logits = torch.randn(3, 2, 6, 6, generator=g).masked_fill(~visible[:, None], -math.inf)
    weights = logits.softmax(-1)
    expected = [
        entropy(weights[b, h, t, visible[b, t]].numpy()) / math.log(int(visible[b, t].sum()))
        for b in range(3) for h in range(2) for t in range(6) if visible[b, t].sum() >= 2
    ]  # fmt: skip
    got = attention_entropy(weights, visible)  # flat, in (b, h, t) order
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert len(got) < 3 * 2 * 6  # the first query sees one key only: no entropy to speak of
    everything = torch.ones(1, 4, 4, dtype=torch.bool)
    uniform, one_key = torch.full((1, 1, 4, 4), 0.25), torch.eye(4)[None, None]
    torch.testing.assert_close(attention_entropy(uniform, everything), torch.ones(4, dtype=torch.float64))
    assert attention_entropy(one_key, everything).abs().max() == 0  # 0 log 0 = 0, no NaN


def test_at_initialisation_reads_the_losss_gradient_and_leaves_the_model_as_it_was():
    model = build(layers=3, norm="post").train()
    src, tgt = batch()
    tgt_out = torch.cat([tgt[:, 1:], torch.full((3, 1), EOS)], dim=1).masked_fill(tgt == PAD, PAD)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    got = at_initialisation(model, {"src": src, "tgt_in": tgt, "tgt_out": tgt_out}, label_smoothing=0.1)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # The reference: the same loss, backward, the feed-forward output weights' .grad (eval mode: no dropout).
    reference = build(layers=3, norm="post")
    loss = F.cross_entropy(
        reference(src, tgt).flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, label_smoothing=0.1
    )
    loss.backward()
    norms = [layer.ff.fn.net[-1].weight.grad.norm().item() for layer in reference.decoder]
    assert got["grad_last"] == pytest.approx(norms[-1], rel=1e-5)
    assert got["grad_growth"] == pytest.approx(norms[-1] / norms[0], rel=1e-5)
    assert 0 < got["attn_entropy"] < 1
    assert set(at_initialisation(build(ffn=False), {"src": src, "tgt_in": tgt, "tgt_out": tgt_out}, 0.0)) == {
        "attn_entropy"
    }


def test_at_initialisation_reads_real_queries_alone_so_more_padding_measures_the_same():
    """A compiled step pads batches to a bounded set of lengths (models/steps.py): the padded positions are
    no query of the loss, and must not be one of the entropy either."""
    model = build(layers=2)
    src, tgt = batch()
    tgt_out = torch.cat([tgt[:, 1:], torch.full((3, 1), EOS)], dim=1).masked_fill(tgt == PAD, PAD)
    pad = lambda x, n: torch.cat([x, torch.full((x.size(0), n), PAD)], dim=1)  # noqa: E731
    plain = at_initialisation(model, {"src": src, "tgt_in": tgt, "tgt_out": tgt_out}, 0.0)
    padded = at_initialisation(
        model, {"src": pad(src, 5), "tgt_in": pad(tgt, 3), "tgt_out": pad(tgt_out, 3)}, 0.0
    )
    assert padded == pytest.approx(plain, rel=1e-5)


def initial(seeds=range(3), **overrides) -> dict[str, float]:
    """at_initialisation's metrics, each the mean over `seeds`, of a model built with `overrides`."""
    src, tgt = batch(b=8, s=9, t=8)
    tgt_out = torch.cat([tgt[:, 1:], torch.full((8, 1), EOS)], dim=1)
    runs = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = Transformer(tiny(**overrides), VOCAB, VOCAB, PAD)
        runs.append(at_initialisation(model, {"src": src, "tgt_in": tgt, "tgt_out": tgt_out}, 0.0))
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def test_post_ln_gradients_grow_towards_the_output_at_initialisation_and_pre_ln_ones_do_not():
    """Xiong et al. 2020 (abstract): at initialisation post-LN's gradients near the output are large and
    pre-LN's well-behaved: post-LN's W² gradient grows towards the last layer, pre-LN's does not, and is
    smaller."""
    deep = dict(d_model=64, d_ff=128, layers=6)
    post, pre = initial(**deep, norm="post"), initial(**deep, norm="pre")
    assert post["grad_growth"] > 2 and pre["grad_growth"] < 1.2
    assert post["grad_last"] > 2 * pre["grad_last"]


def test_unscaled_attention_at_initialisation_falls_towards_one_key_as_d_k_grows():
    """Vaswani et al. 2017, Sec. 3.2.1: q·k has variance d_k, so unscaled softmax saturates as d_k grows."""
    entropy = {(d, scale): initial(d_model=d, heads=1, scale=scale)["attn_entropy"]
               for d in (16, 256) for scale in ("sqrt", "none")}  # fmt: skip
    assert entropy[256, "none"] < entropy[16, "none"] - 0.2
    assert abs(entropy[256, "sqrt"] - entropy[16, "sqrt"]) < 0.1
    assert entropy[256, "none"] < entropy[256, "sqrt"] - 0.5


def test_rank_collapse_builds_its_mask_on_the_states_device():
    # The meta device stands in for an accelerator: a mask made on the CPU could not meet the states.
    assert rank_collapse(torch.empty(2, 3, 4, device="meta")).device.type == "meta"


@torch.no_grad()
@pytest.mark.parametrize("pos_encoding", ["none", "sinusoidal"])
def test_without_decoder_self_attention_a_target_position_sees_no_earlier_one(pos_encoding):
    """Each target position's output depends on its own input token and the source alone: without positions
    two positions that read the same token give the same output wherever they are (Haviv et al. 2022's
    contrast); with positions they differ."""
    model = build(decoder_self_attention=False, pos_encoding=pos_encoding, dropout=0.0).eval()
    src, tgt = batch()
    logits = model(src, tgt)
    changed = tgt.clone()
    changed[:, 1] = (changed[:, 1] % 5) + 3  # another earlier token: no later position may notice
    torch.testing.assert_close(model(src, changed)[:, 2:], logits[:, 2:])
    same = torch.full_like(tgt, 4)  # one token at every position
    spread = (model(src, same) - model(src, same)[:, :1]).abs().amax()
    assert (spread == 0) if pos_encoding == "none" else (spread > 1e-3)
    assert all(layer.self_attn.__class__.__name__ == "Skip" for layer in model.decoder)
    assert "causal_mask" in model.cfg.ignored_keys()


def test_without_cross_attention_no_encoder_is_built():
    full, decoder_only = build(layers=2), build(layers=2, cross_attention=False)
    count = lambda modules: sum(p.numel() for m in modules for p in m.parameters())  # noqa: E731
    cross = count(layer.cross_attn for layer in full.decoder)
    assert len(decoder_only.encoder) == 0
    assert count([decoder_only]) == count([full]) - count(full.encoder) - cross


# --- presets, bad values, learning ---------------------------------------------------------------------


def test_presets_are_vaswani_post_ln_and_xiong_pre_ln():
    for name, norm in (("transformer", "post"), ("transformer-pre-ln", "pre")):
        cfg = ModelConfig(**preset_keys(name))
        assert (cfg.arch, cfg.norm, cfg.pos_encoding, cfg.scale, cfg.residual) == (
            "transformer",
            norm,
            "sinusoidal",
            "sqrt",
            True,
        )


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("scale", -1.0, "model.scale: "),
        ("scale", "cube", "model.scale: "),
        ("score", "softmax", "model.score: Input should be 'dot' or 'cosine'"),
        ("pos_encoding", "relative", "model.pos_encoding: "),
        ("norm", "sandwich", "model.norm: "),
        ("pos_base", 1.0, "model.pos_base: Input should be greater than 1 "),
        ("heads", 3, "model.heads: must divide d_model=16"),
        ("dropout", 1.0, "model.dropout: "),
    ],
)
def test_bad_switch_values_fail_naming_the_key(key, value, message):
    from ablate.schema.config import build_config
    from ablate.schema.errors import ConfigError

    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.")):
        build_config({"model": {**dict(d_model=16, heads=2), key: value}})


LEARN_REVERSE = {
    "task": dict(name="reverse", min_len=1, max_len=12, test_max_len=12, vocab_size=10,
                 n_train=5000, n_valid=200, n_test=500),
    "model": dict(d_model=64, heads=4, layers=2, d_ff=128, dropout=0.0),
    # max_time is the CPU budget: training stops there whatever max_steps says.
    "train": dict(batch_size=64, lr=2e-3, schedule="cosine", warmup_steps=100, max_steps=1000,
                  val_every=500, max_time=600),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["transformer", "transformer-pre-ln"])
def test_preset_learns_reverse(preset):
    from ablate.harness.trial import run_trial
    from ablate.schema.config import build_config

    result = run_trial(build_config({**LEARN_REVERSE, "preset": preset}))
    assert result.metrics["test/seq_acc"] >= 0.95
