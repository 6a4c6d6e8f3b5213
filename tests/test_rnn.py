"""The LSTM family: score functions against their formulas, attention weights, local windows, the parallel
path against the step loop, padding invariance, every switch value, parameter counts, and (slow) every
preset learning copy."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from ablate.models import build_model
from ablate.models.attention import MultiHeadAttention, ScoreAttention
from ablate.models.config import PRESETS, ModelConfig, preset_keys
from ablate.models.decoding import beam_search, greedy_decode
from ablate.models.kinds import CELLS
from ablate.models.scores import WINDOWS, make_score
from ablate.schema.config import load_config
from ablate.schema.errors import ConfigError


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny recurrent models run faster on one thread than on several contended ones.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SCORES = ["additive", "dot", "general", "concat", "location", "cosine", "scaled_dot", "uniform"]
LOCAL = ["local-m", "local-p"]
RNN_PRESETS = [name for name, preset in PRESETS.items() if preset["arch"] == "lstm"]
VOCAB = 12


def rnn(**overrides) -> torch.nn.Module:
    cfg = ModelConfig(**{"arch": "lstm", "d_model": 16, "layers": 1, "dropout": 0.0, **overrides})
    torch.manual_seed(0)
    return build_model(cfg, VOCAB, VOCAB, 0).eval()


def batch(lengths: list[int], seed: int = 0) -> torch.Tensor:
    """Token ids >= 4 (no specials), padded with 0 after each length."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
    return out


def step_loop(model: torch.nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits through the incremental interface greedy and beam search use."""
    state, logits = model.init_state(src), []
    for t in range(tgt_in.size(1)):
        step_logits, state = model.step(state, tgt_in[:, t])
        logits.append(step_logits)
    return torch.stack(logits, dim=1)


# Score functions, single head, against their textbook formulas written out with the raw parameters.


def reference_score(kind: str, score: torch.nn.Module, s: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    d = s.size(-1)
    pairs = (s[:, :, None], h[:, None])  # (B, T, 1, D), (B, 1, S, D)
    if kind == "dot":
        return s @ h.transpose(1, 2)
    if kind == "scaled_dot":
        return s @ h.transpose(1, 2) / d**0.5
    if kind == "general":  # s^T W h
        return torch.einsum("btd,de,bse->bts", s, score.w.weight, h)
    if kind == "additive":  # v^T tanh(W s + U h)
        hidden = torch.tanh(pairs[0] @ score.w.weight.T + pairs[1] @ score.u.weight.T + score.u.bias)
        return hidden @ score.v[0]
    if kind == "concat":  # v^T tanh(W [s; h]), with the concatenation built
        cat = torch.cat(torch.broadcast_tensors(*pairs), dim=-1)  # (B, T, S, 2D)
        return torch.tanh(score.w(cat)) @ score.v[0]
    if kind == "location":  # W s, one logit per source position, the keys unused
        return score.w(s)[..., : h.size(1)]
    if kind == "cosine":  # beta * cos(W s, h), beta = 1 + softplus(w . s)
        beta = 1 + F.softplus(score.strength(s))  # (B, T, 1)
        return beta * F.cosine_similarity(score.key(s)[:, :, None], h[:, None], dim=-1)
    if kind == "uniform":  # no score: every position alike
        return torch.zeros(s.size(0), s.size(1), h.size(1))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", SCORES)
def test_score_matches_its_formula(kind):
    torch.manual_seed(0)
    score = make_score(kind, d_model=8, heads=1, max_positions=16)
    s, h = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    got = score(s, score.prepare(h))
    assert got.shape == (2, 1, 3, 5)
    torch.testing.assert_close(got[:, 0], reference_score(kind, score, s, h), atol=1e-5, rtol=1e-5)


def test_general_with_identity_equals_dot():
    torch.manual_seed(0)
    general, dot = make_score("general", 8, 2, 16), make_score("dot", 8, 2, 16)
    with torch.no_grad():
        general.w.weight.copy_(torch.eye(8))
    s, h = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    ctx_g, w_g = ScoreAttention(general, 2)(s, h, padding)
    ctx_d, w_d = ScoreAttention(dot, 2)(s, h, padding)
    torch.testing.assert_close(w_g, w_d)
    torch.testing.assert_close(ctx_g, ctx_d)


@pytest.mark.parametrize("heads", [1, 4])
def test_scaled_dot_is_multihead_attention_without_projections(heads):
    # One attention implementation: the RNN's scaled_dot heads are the Transformer's, minus projections.
    s, h = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    ctx, weights = ScoreAttention(make_score("scaled_dot", 16, heads, 16), heads)(s, h, padding)
    mha = MultiHeadAttention(16, heads, qkv_projections=False)
    mha_out, mha_weights = mha(s, h, padding, need_weights=True)
    torch.testing.assert_close(weights, mha_weights)
    torch.testing.assert_close(ctx, mha_out)
    torch.testing.assert_close(ctx, mha(s, h, padding)[0], atol=1e-6, rtol=1e-5)  # the fused path too


def test_location_score_refuses_sources_longer_than_max_positions():
    score = make_score("location", 8, 1, max_positions=4)
    with pytest.raises(ValueError, match="max_positions=4"):
        score(torch.randn(1, 1, 8), torch.randn(1, 5, 8))


# Attention weights returned by the model.


@pytest.mark.parametrize("kind", SCORES)
@pytest.mark.parametrize("query", ["previous", "current"])
def test_weights_are_zero_on_padding_and_rows_sum_to_one(kind, query):
    model = rnn(attention=kind, attention_query=query, attention_heads=2)
    src, tgt_in = batch([7, 3, 5]), batch([4, 6, 2], seed=1)
    logits, weights = model(src, tgt_in, need_weights=True)
    (cross,) = weights["cross"]
    assert logits.shape == (3, 6, VOCAB) and cross.shape == (3, 2, 6, 7)
    padding = (src == 0)[:, None, None, :].expand_as(cross)
    assert torch.all(cross[padding] == 0)
    torch.testing.assert_close(cross.sum(-1), torch.ones(3, 2, 6))


@pytest.mark.parametrize("kind", ["dot", "general", "location"])
@pytest.mark.parametrize("query", ["previous", "current"])
def test_local_m_whose_window_covers_the_source_is_global_attention(kind, query):
    # D >= S - 1 puts every source position within D of p_t (at most S - 1): the same softmax as global's.
    src, tgt_in = batch([7, 3, 5]), batch([9, 6, 2], seed=1)
    switches = dict(attention=kind, attention_query=query, attention_heads=2)
    global_logits, global_weights = rnn(**switches)(src, tgt_in, need_weights=True)
    local = rnn(**switches, attention_window="local-m", attention_width=6)
    logits, weights = local(src, tgt_in, need_weights=True)
    assert torch.equal(logits, global_logits)
    assert torch.equal(weights["cross"][0], global_weights["cross"][0])
    # One position narrower, the first step's window misses the longest source's last position.
    narrower = rnn(**switches, attention_window="local-m", attention_width=5)
    assert torch.all(narrower(src, tgt_in, need_weights=True)[1]["cross"][0][0, :, 0, 6] == 0)


@pytest.mark.parametrize("window", LOCAL)
def test_local_weights_stay_inside_the_window_and_the_source(window):
    """Zero outside ⌊p_t⌋ ± D and on padding; local-m's rows sum to 1, local-p's (times a Gaussian) less."""
    model = rnn(attention="general", attention_query="current", attention_window=window, attention_width=1)
    src, tgt_in = batch([7, 3, 5]), batch([9, 6, 2], seed=1)
    (cross,) = model(src, tgt_in, need_weights=True)[1]["cross"]
    assert torch.all(cross[(src == 0)[:, None, None, :].expand_as(cross)] == 0)
    assert torch.all((cross > 0).sum(-1) <= 3)
    sums = cross.sum(-1)
    if window == "local-m":
        torch.testing.assert_close(sums, torch.ones_like(sums))
    else:
        assert torch.all((sums > 0) & (sums < 1))


def test_bottleneck_sees_the_source_only_through_the_final_state():
    src, prev = batch([6, 4]), torch.tensor([5, 6])
    for attention, depends_on_memory in [("none", False), ("dot", True)]:
        model = rnn(attention=attention)
        state = model.init_state(src)
        blank = {**state, "memory": torch.zeros_like(state["memory"])}
        same = torch.equal(model.step(state, prev)[0], model.step(blank, prev)[0])
        assert same != depends_on_memory, attention
    _, weights = rnn(attention="none")(src, batch([3, 3]), need_weights=True)
    assert weights == {"cross": []}


# Parallel teacher forcing against the loop, padding, every switch.


@pytest.mark.parametrize("kind", SCORES)
def test_luong_without_input_feeding_computes_all_steps_at_once_like_the_loop(kind):
    model = rnn(attention=kind, attention_query="current", input_feeding=False, attention_heads=2, layers=2)
    assert model.parallel
    src, tgt_in = batch([7, 3, 5]), batch([6, 6, 2], seed=1)
    parallel, weights = model(src, tgt_in, need_weights=True)
    torch.testing.assert_close(parallel, step_loop(model, src, tgt_in), atol=1e-5, rtol=0)
    model.parallel = False  # the same model through forward's own step loop
    looped, looped_weights = model(src, tgt_in, need_weights=True)
    torch.testing.assert_close(parallel, looped, atol=1e-5, rtol=0)
    torch.testing.assert_close(weights["cross"][0], looped_weights["cross"][0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("query", ["previous", "current"])
@pytest.mark.parametrize("kind, projection", [("additive", "u"), ("general", "w")])
def test_the_step_loop_projects_the_source_once(kind, projection, query):
    """U h (additive) and W h (general) depend on the source alone: one projection per sentence, however
    many decoder steps, in training's step loop and in decoding, whichever decoder state is the query
    (input feeding puts Luong's current query on the step loop in training too)."""
    model = rnn(attention=kind, attention_query=query, input_feeding=query == "current")
    calls = []
    getattr(model.attention.score, projection).register_forward_hook(lambda *_: calls.append(1))
    model(batch([7, 3, 5]), batch([6, 6, 2], seed=1))
    assert len(calls) == 1
    greedy_decode(model, batch([7, 3, 5]), bos_id=1, eos_id=2, pad_id=0, max_len=9)
    assert len(calls) == 2


@pytest.mark.parametrize("preset", RNN_PRESETS)
@pytest.mark.parametrize("cell", list(CELLS))
def test_padding_changes_nothing(preset, cell):
    cfg = ModelConfig(**preset_keys(preset, dict(d_model=16, layers=2, dropout=0.0, cell=cell, attention_heads=2)))
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB, VOCAB, 0).eval()
    src, tgt_in = batch([4, 9], seed=2), batch([3, 8], seed=3)
    alone_logits, alone_w = model(src[:1, :4], tgt_in[:1, :3], need_weights=True)
    batch_logits, batch_w = model(src, tgt_in, need_weights=True)
    torch.testing.assert_close(batch_logits[:1, :3], alone_logits, atol=1e-5, rtol=0)
    for alone, batched in zip(alone_w["cross"], batch_w["cross"]):
        torch.testing.assert_close(batched[:1, :, :3, :4], alone, atol=1e-5, rtol=0)
        assert torch.all(batched[0, :, :, 4:] == 0)


COMBINATIONS = list(
    itertools.product(["none", *SCORES], ["previous", "current"], [False, True], list(CELLS))
)


@pytest.mark.parametrize(("attention", "query", "feeding", "cell"), COMBINATIONS)
def test_every_combination_decodes_step_by_step_as_it_trains(attention, query, feeding, cell):
    model = rnn(attention=attention, attention_query=query, input_feeding=feeding, cell=cell, layers=2)
    src, tgt_in = batch([5, 2, 4]), batch([4, 3, 1], seed=1)
    torch.testing.assert_close(model(src, tgt_in), step_loop(model, src, tgt_in), atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", LOCAL)
@pytest.mark.parametrize(("query", "feeding"), [("previous", False), ("current", False), ("current", True)])
def test_local_windows_decode_step_by_step_as_they_train(window, query, feeding):
    # Targets past the sources' ends, and a window narrower than the longest source: each step's window
    # must sit where training put it (local-m: on the step's own position, carried in the decoder state).
    model = rnn(attention="dot", attention_query=query, input_feeding=feeding, attention_window=window,
                attention_width=1, layers=2)  # fmt: skip
    src, tgt_in = batch([7, 2, 4]), batch([8, 3, 6], seed=1)
    torch.testing.assert_close(model(src, tgt_in), step_loop(model, src, tgt_in), atol=1e-5, rtol=0)


SWITCHES = [
    ("cell", list(CELLS)),
    ("bidirectional", [True, False]),
    ("layers", [1, 2]),
    ("attention", ["none", *SCORES]),
    ("attention_query", ["previous", "current"]),
    ("input_feeding", [False, True]),
    ("attention_heads", [1, 2, 4]),
    ("attention_window", list(WINDOWS)),
    ("attention_width", [1, 10]),
    ("tie_embeddings", [False, True]),
]


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, values in SWITCHES for v in values])
def test_every_switch_value_trains_a_step(key, value):
    base = {"arch": "lstm", "d_model": 16, "layers": 1, "attention": "additive", "dropout": 0.1}
    if key == "attention_width":  # a width acts only in a local window
        base["attention_window"] = "local-p"
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**base, key: value}), VOCAB, VOCAB, 0)
    src, tgt = batch([6, 2, 4, 5]), batch([5, 3, 4, 6], seed=1)
    tgt_in = F.pad(tgt, (1, 0), value=1)[:, :-1]  # BOS first

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt.flatten(), ignore_index=0)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.eval()  # dropout off, so the two losses compare the same function
    before = loss()
    model.train()
    loss().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
    optimizer.step()
    model.eval()
    assert loss() < before


@pytest.mark.parametrize("window", ["global", *LOCAL])
@pytest.mark.parametrize("preset", ["lstm-bahdanau", "lstm-luong-general"])
def test_search_runs_over_the_step_interface(preset, window):
    # Every state tensor is batch-first, so beam search can reorder them (the input-feeding one included,
    # and the step that local-m centres its window on).
    model = rnn(**PRESETS[preset], attention_heads=2, attention_window=window, attention_width=1)
    src = batch([5, 2, 7])
    greedy = greedy_decode(model, src, bos_id=1, eos_id=2, pad_id=0, max_len=6)
    assert torch.equal(beam_search(model, src, 1, 2, 0, beam_size=1, max_len=6), greedy)
    batched = beam_search(model, src, 1, 2, 0, beam_size=3, max_len=6)
    for i, length in enumerate([5, 2, 7]):  # a beam reordered with another sentence's state would differ
        alone = beam_search(model, src[i : i + 1, :length], 1, 2, 0, beam_size=3, max_len=6)
        assert batched[i, : alone.size(1)].tolist() == alone[0].tolist()


# Parameter counts: each switch adds exactly the parameters its formula names.


def test_parameter_counts_follow_the_formulas():
    d, heads, positions = 16, 2, 32

    def count(**overrides) -> int:
        cfg = {
            "attention_query": "current",
            "attention_heads": heads,
            "max_positions": positions,
            **overrides,
        }
        return sum(p.numel() for p in rnn(**cfg).parameters())

    dot = count(attention="dot")
    assert count(attention="scaled_dot") == dot
    assert dot - count(attention="none") == 2 * d * d + d  # W_c of the attentional state
    assert count(attention="general") - dot == d * d  # W
    assert count(attention="additive") - dot == 2 * d * d + 2 * d  # W, U with bias, v per head
    assert count(attention="concat") == count(attention="additive")  # W on [s; h] has the same size
    assert count(attention="location") - dot == positions * (d // heads + 1)  # W shared by heads, bias
    assert count(attention="cosine") - dot == d * d + d + heads * (d + 1)  # key W, strength per head
    assert count(attention="dot", attention_window="local-m") == dot  # p_t = t: nothing learned
    assert count(attention="dot", attention_window="local-p") - dot == d * d + heads * d  # W_p, v_p per head
    lstm_input_weights = 4 * d * d  # one more d-wide input to the decoder LSTM's first layer
    assert count(attention="dot", attention_query="previous") - dot == lstm_input_weights
    assert count(attention="dot", input_feeding=True) - dot == lstm_input_weights


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.attention_heads=3", "model.attention_heads: must divide d_model=64"),
        ("model.d_model=15", "model.d_model: must be even for a bidirectional encoder"),
        ("model.attention=bilinear", "model.attention: "),
        ("model.attention_query=next", "model.attention_query: "),
        ("model.attention_window=local", "model.attention_window: "),
        ("model.attention_width=0", "model.attention_width: "),
    ],
)
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, "lstm-luong-dot", [override])
    assert str(err.value).startswith(message)


# Learning: every preset learns copy (length <= 10) to >= 95 % exact match on held-out sequences.


# The bottleneck squeezes the whole source into one state: it needs a wider state and more steps.
BUDGETS = {"lstm": ["model.d_model=128", "train.max_steps=2000"]}


@pytest.mark.slow
@pytest.mark.parametrize("preset", RNN_PRESETS)
def test_every_preset_learns_copy(preset):
    from ablate.harness.trial import run_trial

    cfg = load_config(None, preset, [
        "task.name=copy", "task.max_len=10", "task.test_max_len=10", "task.n_train=10000",
        "task.n_valid=100", "task.n_test=300", "model.d_model=64", "model.layers=1", "model.dropout=0.0",
        "train.lr=3e-3", "train.schedule=cosine", "train.max_steps=600", "train.val_every=5000",
        "train.batch_size=64", *BUDGETS.get(preset, []),
    ])  # fmt: skip
    result = run_trial(cfg)
    assert result.metrics["test/seq_acc"] >= 0.95, result.metrics
