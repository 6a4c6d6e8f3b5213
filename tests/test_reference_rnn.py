"""The LSTM family against its equations, computed by hand in float64 from the model's own parameters.

Bahdanau et al. 2015 (query = previous): e_tj = score(s_{t-1}, h_j), a_t = softmax over the real source
positions, c_t = sum_j a_tj h_j, and c_t enters the RNN input: s_t = LSTM([y_{t-1}; c_t], s_{t-1}).
Luong et al. 2015 (query = current): h_t = LSTM(y_{t-1}, h_{t-1}), then e_tj = score(h_t, h_j), a_t, c_t.
Either way the output layer reads the attentional vector h~_t = tanh(W_c [c_t; h_t]), and with input
feeding h~_{t-1} (h~_0 = 0) is appended to the RNN input. The encoder's final states initialise the
decoder: layer l's is [forward final state; backward final state] of encoder layer l.

Luong's local attention (Sec. 3.2) takes that softmax over the positions s within D of an aligned position
p_t instead (|s - floor(p_t)| <= D, 0 elsewhere): local-m p_t = t, local-p p_t = S sigmoid(v_p^T tanh(W_p
h_t)) (eq. 9) with the weights times exp(-(s - p_t)^2 / (2 (D/2)^2)) (eq. 10).

Nothing here calls the code under test to compute an expected value: the LSTM cell, the scores, the
softmax and the encoder are written out below. Tolerance: 1e-10 absolute in float64 (the computations
differ only in summation order).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ablate.models import build_model
from ablate.models.attention import ScoreAttention
from ablate.models.config import ModelConfig
from ablate.models.scores import make_score, make_window

pytestmark = pytest.mark.usefixtures("single_thread")

SCORES = ["additive", "dot", "general", "concat", "location", "cosine", "scaled_dot", "uniform"]
D, VOCAB, PAD, TOL = 6, 9, 0, 1e-10
# Two sources of different lengths, the shorter first (the encoder must not need them sorted), both
# padded past the longest: attention must ignore every padding position.
SRC = torch.tensor([[8, 4, 5, PAD, PAD, PAD], [4, 5, 6, 7, 8, PAD]])
TGT_IN = torch.tensor([[1, 5, 8], [1, 6, 7]])  # BOS, then two teacher-forced tokens


def model(layers: int = 3, **switches) -> torch.nn.Module:
    """Three layers by default: s_{t-1} must be the top one, not merely "not the bottom one"."""
    cfg = ModelConfig(arch="lstm", d_model=D, layers=layers, dropout=0.0, max_positions=8, **switches)
    torch.manual_seed(0)
    net = build_model(cfg, VOCAB, VOCAB, PAD).double().eval()
    with torch.no_grad():  # biases of zero would hide a bias that is dropped: make every one count
        for name, p in net.named_parameters():
            if "bias" in name:
                p.uniform_(-0.5, 0.5)
    return net


# The pieces, from the equations.


def lstm_cell(x, h, c, rnn: torch.nn.LSTM, layer: int, suffix: str = ""):
    """i, f, g, o = W_ih x + b_ih + W_hh h + b_hh (PyTorch's gate order); c' = f c + i g; h' = o tanh(c')."""
    p = {n: getattr(rnn, f"{n}_l{layer}{suffix}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    gates = x @ p["weight_ih"].T + p["bias_ih"] + h @ p["weight_hh"].T + p["bias_hh"]
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def encode(net, tokens: list[int]):
    """One unpadded source through the encoder by hand: states (S, D) and per layer the final (h, c),
    each [forward; backward]."""
    rnn, x = net.encoder.rnn, net.encoder.embed.weight[tokens]
    forward = list(range(len(tokens)))
    directions = [("", forward), ("_reverse", forward[::-1])] if rnn.bidirectional else [("", forward)]
    finals = []
    for layer in range(rnn.num_layers):
        outputs = []
        for suffix, order in directions:
            h = c = x.new_zeros(rnn.hidden_size)
            out = [None] * len(tokens)
            for j in order:
                h, c = lstm_cell(x[j], h, c, rnn, layer, suffix)
                out[j] = h
            outputs.append((torch.stack(out), h, c))
        x = torch.cat([o[0] for o in outputs], -1)  # the next layer reads both directions
        finals.append((torch.cat([o[1] for o in outputs]), torch.cat([o[2] for o in outputs])))
    return x, finals


def score(kind: str, net, s: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """e_j for one query s (D,) over the states (S, D)."""
    p = net.attention.score
    if kind == "additive":  # v^T tanh(W s + U h_j)
        return torch.tanh(s @ p.w.weight.T + states @ p.u.weight.T + p.u.bias) @ p.v[0]
    if kind == "dot":
        return states @ s
    if kind == "scaled_dot":
        return states @ s / D**0.5
    if kind == "general":  # s^T W h_j
        return states @ p.w.weight.T @ s
    if kind == "concat":  # v^T tanh(W [s; h_j])
        pairs = torch.cat([s.expand(len(states), -1), states], -1)
        return torch.tanh(pairs @ p.w.weight.T + p.w.bias) @ p.v[0]
    if kind == "location":  # W s, one score per source position, whatever the states say
        return (p.w.weight @ s + p.w.bias)[: len(states)]
    if kind == "cosine":  # beta cos(k, h_j), k = W s, beta = 1 + softplus(w . s)
        k = p.key.weight @ s + p.key.bias
        beta = 1 + torch.nn.functional.softplus(p.strength.weight[0] @ s + p.strength.bias[0])
        return beta * (states @ k) / (states.norm(dim=-1) * k.norm())
    if kind == "uniform":  # no score: the weights are 1 / length, the context the mean of the states
        return torch.zeros(len(states), dtype=states.dtype)
    raise AssertionError(kind)


def aligned_position(window: str, predictor, s: torch.Tensor, length: int, t: int) -> float:
    """p_t for the query s (D,) of step t over a source of `length` real positions, counted from 0."""
    if window == "local-m":  # p_t = t, stopping at the source's last position past its end
        return min(t, length - 1)
    return float(length * torch.sigmoid(predictor.v.weight @ torch.tanh(predictor.w.weight @ s))[0])  # eq. 9


def local_alignment(e: torch.Tensor, p: float, width: int, gaussian: bool) -> torch.Tensor:
    """a_t over one source's real positions from its scores e (S,): the softmax over the window's positions
    s, |s - floor(p_t)| <= D (2D + 1 of them, clipped to 0..S-1), and 0 elsewhere; local-p times the
    Gaussian exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2, not renormalised (eq. 10)."""
    inside = [j for j in range(len(e)) if abs(j - math.floor(p)) <= width]
    exp = {j: math.exp(float(e[j])) for j in inside}
    a = [exp[j] / sum(exp.values()) if j in exp else 0.0 for j in range(len(e))]
    if gaussian:
        a = [a_j * math.exp(-((j - p) ** 2) / (2 * (width / 2) ** 2)) for j, a_j in enumerate(a)]
    return torch.tensor(a, dtype=torch.float64)


def attend(kind, net, s, states, t=0, window="global"):
    """a_t = softmax(e_t) over the real positions only, or a local window of them; c_t = sum_j a_tj h_j."""
    e = score(kind, net, s, states)
    if window == "global":
        a = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
    else:
        p = aligned_position(window, net.attention.window, s, len(states), t)
        a = local_alignment(e, p, net.attention.window.width, gaussian=window == "local-p")
    return a, a @ states


def decoder_step(net, kind, query, feeding, y, state, states, t=0, window="global"):
    """One step (the t-th) for one sentence: returns logits, attention weights and the state for step t+1."""
    hs, cs, feed = state
    inputs = [net.tgt_embed.weight[y]]
    if query == "previous":
        a, context = attend(kind, net, hs[-1], states, t, window)  # s_{t-1}: the top layer's previous state
        inputs.append(context)
    if feeding:
        inputs.append(feed)
    x, new_h, new_c = torch.cat(inputs), [], []
    for layer in range(len(hs)):
        h, c = lstm_cell(x, hs[layer], cs[layer], net.decoder, layer)
        new_h.append(h)
        new_c.append(c)
        x = h
    if query == "current":
        a, context = attend(kind, net, x, states, t, window)  # h_t: the top layer's new state
    w_c = net.attentional[0]
    attentional = torch.tanh(torch.cat([context, x]) @ w_c.weight.T + w_c.bias)  # h~_t = tanh(W_c [c_t; h_t])
    logits = attentional @ net.generator.weight.T + net.generator.bias
    return logits, a, (new_h, new_c, attentional)


def reference(net, kind, query, feeding, sentence: int, window="global", tgt_in=TGT_IN):
    """Teacher-forced logits (T, V), weights (T, S) and the state after the first step."""
    tokens = [int(t) for t in SRC[sentence] if t != PAD]
    states, finals = encode(net, tokens)
    state = ([h for h, _ in finals], [c for _, c in finals], torch.zeros(D, dtype=torch.float64))
    logits, weights, handed_on = [], [], []
    for t, y in enumerate(tgt_in[sentence].tolist()):
        step_logits, a, state = decoder_step(net, kind, query, feeding, y, state, states, t, window)
        logits.append(step_logits)
        weights.append(a)
        handed_on.append(state)
    return torch.stack(logits), torch.stack(weights), handed_on[0]


CASES = list(itertools.product(SCORES, ["previous", "current"], [False, True]))


@pytest.mark.parametrize("kind, query, feeding", CASES)
def test_decoder_steps_equal_the_equations(kind, query, feeding):
    net = model(attention=kind, attention_query=query, input_feeding=feeding)
    with torch.no_grad():
        logits, attention = net(SRC, TGT_IN, need_weights=True)
        _, state = net.step(net.init_state(SRC), TGT_IN[:, 0])
        for i in range(len(SRC)):
            ref_logits, ref_weights, (h1, c1, feed1) = reference(net, kind, query, feeding, i)
            length = len(ref_weights[0])
            torch.testing.assert_close(logits[i], ref_logits, atol=TOL, rtol=0)
            weights = attention["cross"][0][i, 0]  # (T, S), one head
            torch.testing.assert_close(weights[:, :length], ref_weights, atol=TOL, rtol=0)
            assert torch.all(weights[:, length:] == 0)  # padding gets exactly nothing
            # The state handed to step 2: every layer's h and c, and the fed attentional vector h~_1.
            torch.testing.assert_close(state["h"][i], torch.stack(h1), atol=TOL, rtol=0)
            torch.testing.assert_close(state["c"][i], torch.stack(c1), atol=TOL, rtol=0)
            if feeding:
                torch.testing.assert_close(state["feed"][i, 0], feed1, atol=TOL, rtol=0)
            else:
                assert "feed" not in state


# Local attention. D = 2, so windows of 5 positions: the first source (3 positions) is shorter than one, and
# the second's (5) is clipped at its start and, from step 3 on, at its end. The targets run past both
# sources' ends, where local-m's p_t stops at the last position.
WIDTH = 2
LONG_TGT_IN = torch.tensor([[1, 5, 8, 4, 6, 7], [1, 6, 7, 5, 4, 8]])
LOCAL_CASES = list(
    itertools.product(["local-m", "local-p"], ["dot", "general"], ["previous", "current"], [False, True])
)


@pytest.mark.parametrize("window, kind, query, feeding", LOCAL_CASES)
def test_local_decoder_steps_equal_the_equations(window, kind, query, feeding):
    net = model(attention=kind, attention_query=query, input_feeding=feeding, attention_window=window,
                attention_width=WIDTH)  # fmt: skip
    with torch.no_grad():
        if window == "local-p":  # v_p larger than its initialisation's: p_t away from S / 2, steps apart
            net.attention.window.v.weight.mul_(20)
        logits, attention = net(SRC, LONG_TGT_IN, need_weights=True)
        for i in range(len(SRC)):
            ref_logits, ref_weights, _ = reference(net, kind, query, feeding, i, window, LONG_TGT_IN)
            length = len(ref_weights[0])
            torch.testing.assert_close(logits[i], ref_logits, atol=TOL, rtol=0)
            weights = attention["cross"][0][i, 0]  # (T, S), one head
            torch.testing.assert_close(weights[:, :length], ref_weights, atol=TOL, rtol=0)
            assert torch.all(weights[:, length:] == 0)


def test_local_windows_by_hand():
    """The weights of both local windows on a small example with given numbers: a dot score, D = 2, two
    sources of 6 and 2 positions (the second's padding keys large: they must get nothing), five queries;
    local-p with W_p = I and v_p = (4, 0), so p_t = S sigmoid(4 tanh(q_1)): for the first source 0.11,
    1.08, 3.59, 5.61, 5.89 from the queries' first features -3, -0.4, 0.1, 0.8, 3."""
    keys = torch.tensor([
        [[0.5, -1.0], [1.0, 0.2], [-0.3, 0.8], [0.9, 0.9], [-1.2, 0.1], [0.4, -0.6]],
        [[0.7, 0.3], [-0.5, 1.1], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0]],
    ], dtype=torch.float64)  # fmt: skip
    padding = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    first = torch.tensor([-3.0, -0.4, 0.1, 0.8, 3.0], dtype=torch.float64)
    queries = torch.stack([torch.stack([first, torch.linspace(-1, 1, 5, dtype=torch.float64)], -1)] * 2)
    # The positions each step attends to (nonzero weights), the windows clipped at both ends; the second
    # source, shorter than a window, is attended whole at every step.
    windows = {
        "local-m": [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [2, 3, 4, 5]],  # p_t = t
        "local-p": [[0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4, 5], [3, 4, 5], [3, 4, 5]],  # floor(p_t) above
    }
    for window, attended in windows.items():
        attention = ScoreAttention(make_score("dot", 2, 1, 8), 1, make_window(window, 2, 1, WIDTH)).double()
        attention.requires_grad_(False)
        if window == "local-p":
            attention.window.w.weight.copy_(torch.eye(2))
            attention.window.v.weight.copy_(torch.tensor([[4.0, 0.0]]))
        weights = attention(queries, keys, padding)[1][:, 0]  # (B, T, S), the T queries steps 0..4
        for i, length in enumerate([6, 2]):
            for t, q in enumerate(queries[i]):
                p = aligned_position(window, attention.window, q, length, t)
                expected = local_alignment(keys[i, :length] @ q, p, WIDTH, gaussian=window == "local-p")
                torch.testing.assert_close(weights[i, t, :length], expected, atol=1e-12, rtol=0)
            assert torch.all(weights[i, :, length:] == 0)
        assert [row.nonzero().flatten().tolist() for row in weights[0]] == attended, window
        assert all(row.nonzero().flatten().tolist() == [0, 1] for row in weights[1]), window
        if window == "local-m":
            torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5, dtype=torch.float64))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_initial_decoder_state_is_each_layers_final_states_merged(bidirectional):
    net = model(layers=3, attention="dot", attention_query="current", bidirectional=bidirectional)
    with torch.no_grad():
        state = net.init_state(SRC)
        for i in range(len(SRC)):
            tokens = [int(t) for t in SRC[i] if t != PAD]
            states, finals = encode(net, tokens)
            torch.testing.assert_close(state["memory"][i, : len(tokens)], states, atol=TOL, rtol=0)
            for layer, (h, c) in enumerate(finals):  # [forward final; backward final] of that layer
                torch.testing.assert_close(state["h"][i, layer], h, atol=TOL, rtol=0)
                torch.testing.assert_close(state["c"][i, layer], c, atol=TOL, rtol=0)


def test_bidirectional_merge_puts_forward_first_and_backward_second():
    # The backward direction's final state is its state at the first source token: spell it out.
    net = model(layers=2, attention="dot", attention_query="current")
    rnn, half = net.encoder.rnn, D // 2
    with torch.no_grad():
        state = net.init_state(SRC[:1])
        tokens = [int(t) for t in SRC[0] if t != PAD]
        x = net.encoder.embed.weight[tokens[0]]
        zero = x.new_zeros(half)
        h_first_backward = lstm_cell(
            x, *lstm_cell(net.encoder.embed.weight[tokens[1]], *lstm_cell(
                net.encoder.embed.weight[tokens[2]], zero, zero, rnn, 0, "_reverse"), rnn, 0, "_reverse"),
            rnn, 0, "_reverse",
        )[0]  # fmt: skip
        torch.testing.assert_close(state["h"][0, 0, half:], h_first_backward, atol=TOL, rtol=0)


@pytest.mark.parametrize("layers, between", [(1, 0.0), (2, 0.3)])
def test_dropout_acts_between_stacked_layers_only(layers, between):
    # nn.LSTM applies its dropout to the outputs of every layer but the last: one layer has none.
    cfg = ModelConfig(arch="lstm", d_model=D, layers=layers, dropout=0.3, attention="dot")
    net = build_model(cfg, VOCAB, VOCAB, PAD)
    assert (net.encoder.rnn.dropout, net.decoder.dropout) == (between, between)
    assert net.dropout.p == net.encoder.dropout.p == 0.3
