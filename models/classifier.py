"""Text classification: a text's states pooled into one vector, and that vector into a label.

The lectures' third use of attention (the hotel-review example: the words behind each label highlighted), and
the models whose attention Jain & Wallace 2019 and Wiegreffe & Pinter 2019 dispute as explanation. Two
switches, each resolved to a module in __init__:
- `encoder` (kinds.ENCODERS): the LSTM encoder of models/rnn.py, the Transformer's encoder stack with all its
  switches, or no context at all (each token's embedding through one feed-forward layer);
- `pooling` (kinds.POOLINGS): attention with a learned query u (Yang et al. 2016's context vector), scored
  by `model.attention` (models/scores.py: additive is Bahdanau's v·tanh(W1 u + W2 h), so a learned bias on
  W2 h), uniform attention (the mean), max, or the last state.

It runs in the sequence-to-sequence loop unchanged: its task's target is one label token (Task.labelled), the
logits at every target position are the label's, and its one query's weights over the text are
weights['cross'], as a decoder's over its source, so alignment error and the probes' figures read them.
`encode`, `pool_weights` and `classify` are the three steps forward takes, apart so that the explanation
measures (models/explanation.py) can feed the classifier weights of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ablate.models.attention import merge_heads, split_heads
from ablate.models.config import ModelConfig
from ablate.models.ensemble import Ensemble, per_row
from ablate.models.rnn import Encoder
from ablate.models.scores import make_score, make_window
from ablate.models.transformer import Transformer


class TokenEncoder(nn.Module):
    """No context: h_t = ReLU(W e_t + b) for each token's embedding e_t alone."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int, ensemble: Ensemble):
        super().__init__()
        self.embed = ensemble.embedding(vocab, cfg.d_model, padding_idx=pad_id)
        self.project = nn.Sequential(ensemble.linear(cfg.d_model, cfg.d_model), nn.ReLU())
        self.dropout = ensemble.dropout(cfg.dropout, "src")

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        return self.project(self.dropout(self.embed(src)))


class Query(nn.Module):
    """The learned query u of attention pooling, (1, D); fused, (K, 1, D), one per seed."""

    def __init__(self, d_model: int):
        super().__init__()
        self.vector = nn.Parameter(torch.randn(1, d_model) * d_model**-0.5)

    def forward(self, rows: int) -> torch.Tensor:
        """(rows, 1, D): each row's seed's query."""
        u = self.vector if self.vector.dim() == 3 else self.vector[None]
        return per_row(u, rows).expand(rows, -1, -1)


class Classifier(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0, ensemble: int = 1):
        super().__init__()
        self.cfg, self.vocab, self.pad_id = cfg, (src_vocab, tgt_vocab), pad_id
        d = cfg.d_model
        # A Transformer: its encoder stack alone (built only to cross-attend); its Ensemble is the model's.
        if cfg.encoder == "transformer":
            encoder_cfg = cfg.model_copy(update={"cross_attention": True})
            body = Transformer(encoder_cfg, src_vocab, tgt_vocab, pad_id, ensemble, decoder=False)
            self.ensemble = ens = body.ensemble
        else:
            self.ensemble = ens = Ensemble(ensemble)
            body = Encoder(cfg, src_vocab, pad_id, ens) if cfg.encoder == "lstm" else TokenEncoder(
                cfg, src_vocab, pad_id, ens
            )  # fmt: skip
        self.body = body
        self.heads = cfg.attention_heads if cfg.pooling == "attention" else 1
        self.query = self.score = self.window = None
        if cfg.pooling == "attention":
            self.query = ens.stacked(lambda: Query(d))
            self.score = ens.stacked(lambda: make_score(cfg.attention, d, self.heads, cfg.max_positions))
            self.window = ens.stacked(lambda: make_window("global", d, self.heads, cfg.attention_width))
        self.dropout = ens.dropout(cfg.dropout)
        self.generator = ens.linear(d, tgt_vocab)

    @property
    def embedding(self) -> nn.Module:
        """The source embedding, whose outputs gradient importance is taken at (models/explanation.py)."""
        return self.body.src_embed if isinstance(self.body, Transformer) else self.body.embed

    def encode(self, src: torch.Tensor, need_weights: bool = False):
        """src (B, S) -> states (B, S, D), padding (B, S) True at real tokens, the last state (B, D), and the
        encoder's self-attention weights per layer (a Transformer encoder's; else none)."""
        padding = src != self.pad_id
        lengths = padding.sum(1)
        if isinstance(self.body, Transformer):
            states, _, weights = self.body.encode(src, need_weights)
        else:
            self.ensemble.measure("src", padding)
            weights = []
            if isinstance(self.body, Encoder):
                states, final = self.body(src, lengths)
                return states, padding, final[0][-1], weights  # h of the top layer, both directions
            states = self.body(src)
        last = states[torch.arange(src.size(0), device=src.device), lengths - 1]
        return states, padding, last, weights

    def pool_weights(self, states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor | None:
        """The pooling's weights over the text (B, H, 1, S), or None for max and last."""
        if self.cfg.pooling == "uniform":
            real = padding[:, None, None].to(states.dtype)  # (B, 1, 1, S)
            return real / real.sum(-1, keepdim=True)
        if self.query is None:
            return None
        query = self.query(states.size(0))  # (B, 1, D)
        scores = self.score(query, self.score.prepare(states))  # (B, H, 1, S)
        steps = torch.zeros(1, 1, dtype=torch.long, device=states.device)
        return self.window(scores, query, steps, padding)

    def classify(self, states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Label logits (B, V) of the states pooled by `weights` (B, H, 1, S), each head over its slice."""
        pooled = merge_heads(weights @ split_heads(states, self.heads))[:, 0]  # (B, D)
        return self.generator(self.dropout(pooled))

    def logits(self, src: torch.Tensor, need_weights: bool = False):
        """Label logits (B, V), the pooling's weights (B, H, 1, S) or None, the encoder's weights."""
        states, padding, last, encoder_weights = self.encode(src, need_weights)
        weights = self.pool_weights(states, padding)
        if weights is not None:
            return self.classify(states, weights), weights, encoder_weights
        if self.cfg.pooling == "max":
            pooled = states.masked_fill(~padding[..., None], float("-inf")).amax(1)
        else:
            pooled = last
        return self.generator(self.dropout(pooled)), None, encoder_weights

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """The label's logits at every target position (B, T, V); with need_weights also {'cross': the
        pooling's weights (B, H, T, S), or none; 'encoder': a Transformer encoder's per layer}."""
        logits, weights, encoder_weights = self.logits(src, need_weights)
        t = tgt_in.size(1)
        logits = logits[:, None].expand(-1, t, -1)
        if not need_weights:
            return logits
        cross = [] if weights is None else [weights.expand(-1, -1, t, -1)]
        return logits, {"cross": cross, "encoder": encoder_weights}

    @contextmanager
    def record_states(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Nothing recorded: rank collapse is a Transformer's measure (reports read it per family)."""
        yield {}

    # Decoding (models/decoding.py): a classifier's output is one token, the same whatever came before.
    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.logits(src)[0]}

    def step(self, state: dict[str, torch.Tensor], prev: torch.Tensor):
        return state["logits"], state
