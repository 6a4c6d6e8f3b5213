"""LSTM/GRU encoder-decoder (Sutskever et al. 2014; Cho et al. 2014).

With `attention: none` the decoder sees the source only through the encoder's final state: the
fixed-length bottleneck that attention (Bahdanau et al. 2015; Luong et al. 2015) removes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from models.config import ModelConfig


class Encoder(nn.Module):
    """Embeds and runs a (bi)directional RNN; outputs (B, S, D) and the final state per layer."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.d_model, padding_idx=pad_id)
        directions = 2 if cfg.bidirectional else 1
        if cfg.d_model % directions:
            raise ValueError(f"d_model={cfg.d_model} must be even for a bidirectional encoder")
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
        if cfg.attention != "none":
            raise NotImplementedError(f"model.attention={cfg.attention!r} is not available yet")
        self.cfg, self.pad_id = cfg, pad_id
        self.encoder = Encoder(cfg, src_vocab, pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=pad_id)
        rnn_cls = nn.LSTM if cfg.cell == "lstm" else nn.GRU
        self.decoder = rnn_cls(
            cfg.d_model,
            cfg.d_model,
            cfg.layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.generator = nn.Linear(cfg.d_model, tgt_vocab)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight

    def encode(self, src: torch.Tensor):
        lengths = (src != self.pad_id).sum(1)
        return self.encoder(src, lengths)

    def _run_decoder(self, tgt_in: torch.Tensor, state: tuple[torch.Tensor, ...]):
        x = self.dropout(self.tgt_embed(tgt_in))
        out, state = self.decoder(x, state if len(state) == 2 else state[0])
        return self.generator(self.dropout(out)), state if isinstance(state, tuple) else (state,)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V). The bottleneck model has no attention weights to return."""
        _, state = self.encode(src)
        logits, _ = self._run_decoder(tgt_in, state)
        return (logits, {}) if need_weights else logits

    # Incremental decoding: states are stored batch-first, (B, layers, D), so beams can reorder them.
    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        _, state = self.encode(src)
        return {f"s{i}": s.transpose(0, 1) for i, s in enumerate(state)}

    def step(self, state: dict[str, torch.Tensor], prev: torch.Tensor):
        rnn_state = tuple(state[f"s{i}"].transpose(0, 1).contiguous() for i in range(len(state)))
        logits, rnn_state = self._run_decoder(prev[:, None], rnn_state)
        return logits[:, 0], {f"s{i}": s.transpose(0, 1) for i, s in enumerate(rnn_state)}
