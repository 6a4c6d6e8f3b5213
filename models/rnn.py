"""LSTM/GRU encoder-decoder (Sutskever et al. 2014; Cho et al. 2014) with every RNN attention variant.

`attention: none` is the fixed-length bottleneck: the decoder sees the source only through the encoder's
final state. Otherwise three independent switches shape the decoder step (Bahdanau et al. 2015; Luong et
al. 2015):
- `attention`: the score (models/attention.py) over `attention_heads` heads, within `attention_window`
  (global, or Luong's local-m / local-p: 2·`attention_width` + 1 positions around an aligned one);
- `attention_query`: `previous` scores with s_{t-1} and feeds the context into the RNN input (Bahdanau),
  `current` scores with the new h_t (Luong);
- `input_feeding`: the previous attentional state h~_{t-1} enters the RNN input (Luong).
Either way the output layer reads the attentional state h~_t = tanh(W_c [c_t; h_t]). `ensemble=K` fuses K
seeds into one model (models/ensemble.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ablate.models.attention import ScoreAttention
from ablate.models.config import ModelConfig
from ablate.models.ensemble import Ensemble
from ablate.models.kinds import CELLS
from ablate.models.scores import make_score, make_window


class RNN(nn.Module):
    """nn.LSTM / nn.GRU with batch_first for the K seeds of a model: their parameter names, shapes and
    initialisation, with a leading seed axis when K > 1. Each seed runs its own weights over its B rows in
    turn, on the plain model's kernel, packed sequences included (2-core CPU, K = 4, 64 x 9 tokens, d 64:
    7-9 ms, as fast as a cell batched over K; one block-diagonal LSTM of hidden K·H took 12). Layers run one
    at a time because the dropout between them is drawn per seed (SeedDropout); nn.LSTM draws its own from
    the global generator (cuDNN: its own state)."""

    def __init__(
        self, cell: str, input_size: int, hidden_size: int, num_layers: int, ensemble: Ensemble,
        bidirectional: bool = False, dropout: float = 0.0, side: str | None = None,
    ):  # fmt: skip
        """dropout: between layers, as nn.LSTM's; side: that of the time axis ('tgt'), whose lengths bound
        each seed's dropout mask when the sequences are not packed."""
        super().__init__()
        self.cell, self.ensemble = cell, ensemble
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bidirectional, self.dropout = bidirectional, dropout
        self.directions = 2 if bidirectional else 1
        self.between = ensemble.dropout(dropout, side) if num_layers > 1 else None
        gates = CELLS[cell].gates * hidden_size
        self.weight_names = []  # per layer, in nn.LSTM's order, which torch.lstm / torch.gru take
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self.directions
            shapes = {"weight_ih": (gates, layer_input), "weight_hh": (gates, hidden_size),
                      "bias_ih": (gates,), "bias_hh": (gates,)}  # fmt: skip
            names = []
            for suffix in ("", "_reverse")[: self.directions]:
                for kind, shape in shapes.items():
                    names.append(f"{kind}_l{layer}{suffix}")
                    self.register_parameter(names[-1], nn.Parameter(torch.empty(ensemble.shape(*shape))))
            self.weight_names.append(names)
        for p in self.parameters():  # nn.LSTM's reset_parameters, in its order
            nn.init.uniform_(p, -(hidden_size**-0.5), hidden_size**-0.5)

    def forward(
        self,
        x: torch.Tensor,
        state: tuple[torch.Tensor, ...] | None = None,
        lengths: torch.Tensor | None = None,
        offset: int = 0,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """x (K·B, T, in) -> outputs (K·B, T, directions·H) and the final state, (h, c) or (h,), each
        (layers·directions, K·B, H). state: the initial one (None: zeros). lengths (K·B,): packs each seed's
        sequences, so a row's final state is at its own last token. offset: the position of x's first step,
        for the dropout between layers."""
        k = self.ensemble.k
        if state is None:
            zeros = x.new_zeros(self.num_layers * self.directions, x.size(0), self.hidden_size)
            state = tuple(zeros for _ in CELLS[self.cell].states)
        seed_states = zip(*(s.chunk(k, dim=1) for s in state))
        seed_lengths = lengths.chunk(k) if lengths is not None else [None] * k
        runs = [
            self.run_seed(seed, rows, seed_state, seed_length, offset)
            for seed, (rows, seed_state, seed_length) in enumerate(zip(x.chunk(k), seed_states, seed_lengths))
        ]
        outputs, finals = zip(*runs)
        # A plain model's outputs stay as torch.lstm returns them: nn.Dropout's mask follows their layout.
        output = outputs[0] if k == 1 else torch.cat(outputs)
        return output, tuple(torch.cat(parts, dim=1) for parts in zip(*finals))

    def run_seed(self, seed: int, x: torch.Tensor, state, lengths: torch.Tensor | None, offset: int):
        """One seed's rows x (B, T, in) from its state, each (layers·directions, B, H), by its own weights."""
        op = getattr(torch, CELLS[self.cell].op)  # what nn.LSTM / nn.GRU call, here per layer
        packed = None
        if lengths is not None:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            state = [s.index_select(1, packed.sorted_indices) for s in state]  # the packed order, as nn.LSTM
        data, finals = (x if packed is None else packed.data), []
        for layer, names in enumerate(self.weight_names):
            weights = [getattr(self, name) for name in names]
            if self.ensemble.k > 1:
                weights = [w[seed] for w in weights]
            hx = [s[layer * self.directions : (layer + 1) * self.directions] for s in state]
            hx = hx if len(hx) > 1 else hx[0]  # torch.gru takes its one state alone
            if packed is None:
                data, *final = op(data, hx, weights, True, 1, 0.0, self.training, self.bidirectional, True)
            else:
                data, *final = op(
                    data, packed.batch_sizes, hx, weights, True, 1, 0.0, self.training, self.bidirectional
                )
            finals.append(final)
            if self.between is not None and layer < self.num_layers - 1:
                data = self.between.seed_forward(data, seed, offset)
        final_state = tuple(torch.cat(parts) for parts in zip(*finals))
        if packed is not None:
            final_state = tuple(s.index_select(1, packed.unsorted_indices) for s in final_state)
            data, _ = pad_packed_sequence(
                PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices),
                batch_first=True, total_length=x.size(1),
            )  # fmt: skip
        return data, final_state


class Encoder(nn.Module):
    """Embeds and runs a (bi)directional RNN; outputs (B, S, D) and the final state per layer."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int, ensemble: Ensemble):
        super().__init__()
        self.embed = ensemble.embedding(vocab, cfg.d_model, padding_idx=pad_id)
        directions = 2 if cfg.bidirectional else 1
        self.rnn = RNN(
            cfg.cell, cfg.d_model, cfg.d_model // directions, cfg.layers, ensemble,
            bidirectional=cfg.bidirectional, dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )  # fmt: skip
        self.dropout = ensemble.dropout(cfg.dropout, "src")
        self.directions, self.layers = directions, cfg.layers

    def _merge_directions(self, h: torch.Tensor) -> torch.Tensor:
        # (layers * dirs, B, H) -> (layers, B, dirs * H): each layer's forward and backward final states side by side
        lb, b, hid = h.shape
        return h.view(self.layers, self.directions, b, hid).transpose(1, 2).reshape(self.layers, b, -1)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor):
        out, state = self.rnn(self.dropout(self.embed(src)), lengths=lengths)
        return out, tuple(self._merge_directions(s) for s in state)


class RNNSeq2Seq(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0, ensemble: int = 1):
        super().__init__()
        self.cfg, self.vocab, self.pad_id = cfg, (src_vocab, tgt_vocab), pad_id
        self.ensemble = ens = Ensemble(ensemble)
        d = cfg.d_model
        self.encoder = self.make_encoder(cfg, src_vocab, pad_id, ens)
        self.tgt_embed = ens.embedding(tgt_vocab, d, padding_idx=pad_id)

        attends = cfg.attention != "none"
        heads = cfg.attention_heads
        self.attention = (
            ScoreAttention(
                ens.stacked(lambda: make_score(cfg.attention, d, heads, cfg.max_positions)),
                heads,
                ens.stacked(lambda: make_window(cfg.attention_window, d, heads, cfg.attention_width)),
            )
            if attends
            else None
        )
        # The bottleneck has no context to place or attentional state to feed: both switches are moot there.
        self.query_previous = attends and cfg.attention_query == "previous"
        self.query_current = attends and cfg.attention_query == "current"
        self.input_feeding = attends and cfg.input_feeding
        # h~_t = tanh(W_c [c_t; h_t]); without attention the output layer reads h_t itself.
        self.attentional = nn.Sequential(ens.linear(2 * d, d), nn.Tanh()) if attends else None
        # Teacher forcing can run all steps at once unless something computed at step t-1 (s_{t-1} as the
        # query, h~_{t-1} as input) enters the RNN at step t.
        self.parallel = not (self.query_previous or self.input_feeding)

        self.decoder = RNN(
            cfg.cell, d * (1 + self.query_previous + self.input_feeding), d, cfg.layers, ens,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0, side="tgt",
        )  # fmt: skip
        self.state_names = CELLS[cfg.cell].states
        self.dropout = ens.dropout(cfg.dropout, "tgt")
        self.generator = ens.linear(d, tgt_vocab)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight

    def make_encoder(self, cfg: ModelConfig, src_vocab: int, pad_id: int, ensemble: Ensemble) -> nn.Module:
        """What reads the source into the decoder's memory (models/captioner.py's differs)."""
        return Encoder(cfg, src_vocab, pad_id, ensemble)

    def _decode(self, x: torch.Tensor, state: dict[str, torch.Tensor], offset: int = 0):
        """Embedded targets x (B, T, D) from position `offset` -> output-layer inputs (B, T, D), weights
        (B, H, T, S) or None, next state. T > 1 only when self.parallel; the step loop passes T = 1."""
        memory, padding = state["memory"], state["padding"]
        steps = state["step"] + torch.arange(x.size(1), device=x.device)  # (B, T): the step of each query
        inputs = [x]
        weights = None
        if self.query_previous:  # Bahdanau: score with s_{t-1} (top layer); the context enters the RNN
            context, weights = self.attention(state["h"][:, -1:], memory, padding, state["prepared"], steps)
            inputs.append(context)
        if self.input_feeding:  # Luong: h~_{t-1} enters the RNN
            inputs.append(state["feed"])
        # Decoder states are kept batch-first, (B, layers, D); the RNN wants (layers, B, D).
        rnn_state = tuple(state[n].transpose(0, 1).contiguous() for n in self.state_names)
        h, rnn_state = self.decoder(torch.cat(inputs, -1), rnn_state, offset=offset)
        out = h
        if self.attention is not None:
            if self.query_current:  # Luong: score with h_t
                context, weights = self.attention(h, memory, padding, state["prepared"], steps)
            out = self.attentional(torch.cat([context, h], -1))
        next_state = {**state, **{n: s.transpose(0, 1) for n, s in zip(self.state_names, rnn_state)}}
        next_state["step"] = state["step"] + x.size(1)
        if self.input_feeding:
            next_state["feed"] = out
        return out, weights, next_state

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V); with need_weights also {'cross': [weights (B, H, T, S)]},
        an empty list for the bottleneck model, which has no attention."""
        state = self.init_state(src)
        self.ensemble.measure("tgt", tgt_in != self.pad_id)
        x = self.dropout(self.tgt_embed(tgt_in))  # (B, T, D)
        if self.parallel:
            out, weights, _ = self._decode(x, state)
        else:  # one step at a time; only attention models take this path, so every step has weights
            steps = []
            for t in range(x.size(1)):
                step_out, step_weights, state = self._decode(x[:, t : t + 1], state, offset=t)
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
        self.ensemble.measure("src", padding)
        memory, final = self.encoder(src, padding.sum(1))
        # step (B, 1): the next query's decoder step (local-m centres on it), batch-first for beams.
        state = {"memory": memory, "padding": padding, "step": src.new_zeros(src.size(0), 1)}
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
