"""LSTM/GRU encoder-decoder (Sutskever et al. 2014; Cho et al. 2014) with every RNN attention variant.

`attention: none` is the fixed-length bottleneck: the decoder sees the source only through the encoder's
final state. Otherwise three independent switches shape the decoder step (Bahdanau et al. 2015; Luong et
al. 2015):
- `attention`: the score function (models/attention.py), over `attention_heads` heads;
- `attention_query`: `previous` scores with s_{t-1} and feeds the context into the RNN input (Bahdanau),
  `current` scores with the new h_t (Luong);
- `input_feeding`: the previous attentional state h~_{t-1} enters the RNN input (Luong).
Either way the output layer reads the attentional state h~_t = tanh(W_c [c_t; h_t]).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ablate.models.attention import ScoreAttention
from ablate.models.config import ModelConfig
from ablate.models.scores import make_score


class Encoder(nn.Module):
    """Embeds and runs a (bi)directional RNN; outputs (B, S, D) and the final state per layer."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.d_model, padding_idx=pad_id)
        directions = 2 if cfg.bidirectional else 1
        rnn_cls = nn.LSTM if cfg.cell == "lstm" else nn.GRU
        self.rnn = rnn_cls(
            cfg.d_model, cfg.d_model // directions, cfg.layers, batch_first=True,
            bidirectional=cfg.bidirectional, dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )  # fmt: skip
        self.dropout = nn.Dropout(cfg.dropout)
        self.directions, self.layers, self.is_lstm = directions, cfg.layers, cfg.cell == "lstm"

    def _merge_directions(self, h: torch.Tensor) -> torch.Tensor:
        # (layers * dirs, B, H) -> (layers, B, dirs * H): each layer's forward and backward final states side by side
        lb, b, hid = h.shape
        return h.view(self.layers, self.directions, b, hid).transpose(1, 2).reshape(self.layers, b, -1)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor):
        x = self.dropout(self.embed(src))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        if self.is_lstm:
            h, c = state
            return out, (self._merge_directions(h), self._merge_directions(c))
        return out, (self._merge_directions(state),)


class RNNSeq2Seq(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        d = cfg.d_model
        self.encoder = Encoder(cfg, src_vocab, pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d, padding_idx=pad_id)

        attends = cfg.attention != "none"
        self.attention = (
            ScoreAttention(
                make_score(cfg.attention, d, cfg.attention_heads, cfg.max_positions), cfg.attention_heads
            )
            if attends
            else None
        )
        # The bottleneck has no context to place or attentional state to feed: both switches are moot there.
        self.query_previous = attends and cfg.attention_query == "previous"
        self.query_current = attends and cfg.attention_query == "current"
        self.input_feeding = attends and cfg.input_feeding
        # h~_t = tanh(W_c [c_t; h_t]); without attention the output layer reads h_t itself.
        self.attentional = nn.Sequential(nn.Linear(2 * d, d), nn.Tanh()) if attends else None
        # Teacher forcing can run all steps at once unless something computed at step t-1 (s_{t-1} as the
        # query, h~_{t-1} as input) enters the RNN at step t.
        self.parallel = not (self.query_previous or self.input_feeding)

        rnn_cls = nn.LSTM if cfg.cell == "lstm" else nn.GRU
        self.decoder = rnn_cls(
            d * (1 + self.query_previous + self.input_feeding), d, cfg.layers, batch_first=True,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )  # fmt: skip
        self.state_names = ("h", "c") if cfg.cell == "lstm" else ("h",)
        self.dropout = nn.Dropout(cfg.dropout)
        self.generator = nn.Linear(d, tgt_vocab)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight

    def _decode(self, x: torch.Tensor, state: dict[str, torch.Tensor]):
        """Embedded targets x (B, T, D) -> output-layer inputs (B, T, D), weights (B, H, T, S) or None,
        next state. T > 1 only when self.parallel; the step loop calls this with T = 1."""
        memory, padding = state["memory"], state["padding"]
        inputs = [x]
        weights = None
        if self.query_previous:  # Bahdanau: score with s_{t-1} (top layer); the context enters the RNN
            context, weights = self.attention(state["h"][:, -1:], memory, padding, state["prepared"])
            inputs.append(context)
        if self.input_feeding:  # Luong: h~_{t-1} enters the RNN
            inputs.append(state["feed"])
        # Decoder states are kept batch-first, (B, layers, D); the RNN wants (layers, B, D).
        rnn_state = tuple(state[n].transpose(0, 1).contiguous() for n in self.state_names)
        h, rnn_state = self.decoder(torch.cat(inputs, -1), rnn_state if len(rnn_state) == 2 else rnn_state[0])
        rnn_state = rnn_state if isinstance(rnn_state, tuple) else (rnn_state,)
        out = h
        if self.attention is not None:
            if self.query_current:  # Luong: score with h_t
                context, weights = self.attention(h, memory, padding, state["prepared"])
            out = self.attentional(torch.cat([context, h], -1))
        next_state = {**state, **{n: s.transpose(0, 1) for n, s in zip(self.state_names, rnn_state)}}
        if self.input_feeding:
            next_state["feed"] = out
        return out, weights, next_state

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V); with need_weights also {'cross': [weights (B, H, T, S)]},
        an empty list for the bottleneck model, which has no attention."""
        state = self.init_state(src)
        x = self.dropout(self.tgt_embed(tgt_in))  # (B, T, D)
        if self.parallel:
            out, weights, _ = self._decode(x, state)
        else:  # one step at a time; only attention models take this path, so every step has weights
            steps = []
            for t in range(x.size(1)):
                step_out, step_weights, state = self._decode(x[:, t : t + 1], state)
                steps.append((step_out, step_weights))
            out = torch.cat([s[0] for s in steps], dim=1)
            weights = torch.cat([s[1] for s in steps], dim=2)
        logits = self.generator(self.dropout(out))
        if not need_weights:
            return logits
        return logits, {"cross": [] if weights is None else [weights]}

    @contextmanager
    def record_states(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """The Transformer's layer-output recorder, empty: a recurrent layer's outputs are not token
        vectors mixed by attention, so rank collapse does not apply."""
        yield {}

    # Incremental decoding (models/decoding.py): every state tensor is batch-first so beams can reorder it.
    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        padding = src != self.pad_id
        memory, final = self.encoder(src, padding.sum(1))
        state = {"memory": memory, "padding": padding}
        if self.attention is not None:
            state["prepared"] = self.attention.prepare(memory)  # once per source, not once per step
        state.update({n: s.transpose(0, 1) for n, s in zip(self.state_names, final)})  # (B, layers, D)
        if self.input_feeding:
            state["feed"] = memory.new_zeros(src.size(0), 1, self.cfg.d_model)  # h~_0 = 0
        return state

    def step(self, state: dict[str, torch.Tensor], prev: torch.Tensor):
        """prev (B,) -> next-token logits (B, V), new state."""
        out, _, state = self._decode(self.dropout(self.tgt_embed(prev[:, None])), state)
        return self.generator(self.dropout(out[:, 0])), state
