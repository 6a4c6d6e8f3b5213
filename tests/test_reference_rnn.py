"""The LSTM family against its equations, computed by hand in float64 from the model's own parameters.

Bahdanau et al. 2015 (query = previous): e_tj = score(s_{t-1}, h_j), a_t = softmax over the real source
positions, c_t = sum_j a_tj h_j, and c_t enters the RNN input: s_t = LSTM([y_{t-1}; c_t], s_{t-1}).
Luong et al. 2015 (query = current): h_t = LSTM(y_{t-1}, h_{t-1}), then e_tj = score(h_t, h_j), a_t, c_t.
Either way the output layer reads the attentional vector h~_t = tanh(W_c [c_t; h_t]), and with input
feeding h~_{t-1} (h~_0 = 0) is appended to the RNN input. The encoder's final states initialise the
decoder: layer l's is [forward final state; backward final state] of encoder layer l.

Nothing here calls the code under test to compute an expected value: the LSTM cell, the scores, the
softmax and the encoder are written out below. Tolerance: 1e-10 absolute in float64 (the computations
differ only in summation order).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from ablate.models import build_model
from ablate.models.config import ModelConfig

pytestmark = pytest.mark.usefixtures("single_thread")

SCORES = ["additive", "dot", "general", "concat", "location", "cosine", "scaled_dot"]
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
    raise AssertionError(kind)


def attend(kind, net, s, states):
    """a_t = softmax(e_t) over the real positions only; c_t = sum_j a_tj h_j."""
    e = score(kind, net, s, states)
    a = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
    return a, a @ states


def decoder_step(net, kind, query, feeding, y, state, states):
    """One step for one sentence: returns logits, attention weights and the state for step t+1."""
    hs, cs, feed = state
    inputs = [net.tgt_embed.weight[y]]
    if query == "previous":
        a, context = attend(kind, net, hs[-1], states)  # s_{t-1}: the top layer's previous state
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
        a, context = attend(kind, net, x, states)  # h_t: the top layer's new state
    w_c = net.attentional[0]
    attentional = torch.tanh(torch.cat([context, x]) @ w_c.weight.T + w_c.bias)  # h~_t = tanh(W_c [c_t; h_t])
    logits = attentional @ net.generator.weight.T + net.generator.bias
    return logits, a, (new_h, new_c, attentional)


def reference(net, kind, query, feeding, sentence: int):
    """Teacher-forced logits (T, V), weights (T, S) and the state after the first step."""
    tokens = [int(t) for t in SRC[sentence] if t != PAD]
    states, finals = encode(net, tokens)
    state = ([h for h, _ in finals], [c for _, c in finals], torch.zeros(D, dtype=torch.float64))
    logits, weights, handed_on = [], [], []
    for y in TGT_IN[sentence].tolist():
        step_logits, a, state = decoder_step(net, kind, query, feeding, y, state, states)
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
