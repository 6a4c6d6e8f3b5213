"""Encoder-decoder Transformer (Vaswani et al. 2017) with every part switchable.

Each switch in ModelConfig is resolved to a module (or nn.Identity) here in __init__, so forward reads
straight through: scale -> MultiHeadAttention.scale, pos_encoding -> the added encoding / Rotary / ALiBi,
norm -> where the LayerNorms sit, residual -> Sublayer.residual, causal_mask / cross_attention -> DecoderLayer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.attention import MultiHeadAttention
from models.config import ModelConfig
from models.positional import ALiBi, Rotary, additive_encoding


def make_norm(kind: str, d_model: int) -> nn.Module:
    return nn.RMSNorm(d_model) if kind == "rms_pre" else nn.LayerNorm(d_model)


class Sublayer(nn.Module):
    """x -> post_norm(x + f(pre_norm(x))), with the skip and either norm removable."""

    def __init__(self, fn: nn.Module, cfg: ModelConfig):
        super().__init__()
        self.fn = fn
        self.pre_norm = make_norm(cfg.norm, cfg.d_model) if cfg.norm in ("pre", "rms_pre") else nn.Identity()
        self.post_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "post" else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.residual = cfg.residual

    def forward(self, x: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, weights = self.fn(self.pre_norm(x), *args, **kwargs)
        y = self.dropout(y)
        return self.post_norm(x + y if self.residual else y), weights


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.net(x), None


class SelfAttention(nn.Module):
    def __init__(self, attn: MultiHeadAttention, causal: bool):
        super().__init__()
        self.attn, self.causal = attn, causal

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None, need_weights: bool = False):
        return self.attn(x, x, padding, causal=self.causal, need_weights=need_weights)


class CrossAttention(nn.Module):
    def __init__(self, attn: MultiHeadAttention):
        super().__init__()
        self.attn = attn

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor, need_weights: bool = False
    ):
        return self.attn(x, memory, memory_padding, need_weights=need_weights)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, make_attention):
        super().__init__()
        self.self_attn = Sublayer(SelfAttention(make_attention(), causal=False), cfg)
        self.ff = Sublayer(FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout), cfg)

    def forward(self, x, padding, need_weights=False):
        x, weights = self.self_attn(x, padding, need_weights=need_weights)
        x, _ = self.ff(x)
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, make_attention):
        super().__init__()
        self.self_attn = Sublayer(SelfAttention(make_attention(), causal=cfg.causal_mask), cfg)
        self.cross_attn = (
            Sublayer(CrossAttention(make_attention(positional=False)), cfg) if cfg.cross_attention else None
        )
        self.ff = Sublayer(FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout), cfg)

    def forward(self, x, memory, memory_padding, need_weights=False):
        x, self_weights = self.self_attn(x, None, need_weights=need_weights)
        cross_weights = None
        if self.cross_attn is not None:
            x, cross_weights = self.cross_attn(x, memory, memory_padding, need_weights=need_weights)
        x, _ = self.ff(x)
        return x, self_weights, cross_weights


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        d = cfg.d_model
        self.src_embed = nn.Embedding(src_vocab, d, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d, padding_idx=pad_id)
        self.embed_scale = math.sqrt(d) if cfg.embed_scale else 1.0
        self.pos_encoding = additive_encoding(cfg.pos_encoding, d, cfg.max_positions, cfg.pos_base)
        self.embed_dropout = nn.Dropout(cfg.dropout)

        rotary = Rotary(d // cfg.heads, cfg.pos_base) if cfg.pos_encoding == "rope" else None
        alibi = ALiBi(cfg.heads) if cfg.pos_encoding == "alibi" else None

        def make_attention(positional: bool = True) -> MultiHeadAttention:
            # Relative positions (RoPE, ALiBi) act within a sequence; cross-attention gets neither.
            return MultiHeadAttention(
                d, cfg.heads, cfg.dropout, cfg.scale_factor, cfg.qkv_projections,
                rotary=rotary if positional else None, alibi=alibi if positional else None,
            )  # fmt: skip

        self.encoder = nn.ModuleList(EncoderLayer(cfg, make_attention) for _ in range(cfg.layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, make_attention) for _ in range(cfg.layers))
        # Pre-norm stacks need a final norm: their residual stream is never normalised otherwise.
        pre = cfg.norm in ("pre", "rms_pre")
        self.encoder_norm = make_norm(cfg.norm, d) if pre else nn.Identity()
        self.decoder_norm = make_norm(cfg.norm, d) if pre else nn.Identity()
        self.generator = nn.Linear(d, tgt_vocab)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "pos_encoding" not in name:
                nn.init.xavier_uniform_(p)

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_dropout(self.pos_encoding(embedding(tokens) * self.embed_scale))

    def encode(self, src: torch.Tensor, need_weights: bool = False):
        """src (B, S) -> memory (B, S, D), padding (B, S), per-layer weights."""
        padding = src != self.pad_id
        x = self._embed(self.src_embed, src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, padding, need_weights)
            weights.append(w)
        return self.encoder_norm(x), padding, weights

    def decode(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor, need_weights=False
    ):
        """tgt_in (B, T) -> logits (B, T, V) and per-layer self / cross weights."""
        x = self._embed(self.tgt_embed, tgt_in)
        self_w, cross_w = [], []
        for layer in self.decoder:
            x, sw, cw = layer(x, memory, memory_padding, need_weights)
            self_w.append(sw)
            cross_w.append(cw)
        return self.generator(self.decoder_norm(x)), self_w, cross_w

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V); with need_weights also {'encoder', 'decoder', 'cross'}:
        a list per layer of (B, H, T, S) weights."""
        memory, padding, enc_w = self.encode(src, need_weights)
        logits, self_w, cross_w = self.decode(tgt_in, memory, padding, need_weights)
        if not need_weights:
            return logits
        return logits, {"encoder": enc_w, "decoder": self_w, "cross": cross_w}

    # Incremental decoding (models/decoding.py): every state tensor is batch-first so beams can reorder it.
    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        memory, padding, _ = self.encode(src)
        return {"memory": memory, "padding": padding, "prefix": src.new_zeros(src.size(0), 0)}

    def step(self, state: dict[str, torch.Tensor], prev: torch.Tensor):
        """prev (B,) -> next-token logits (B, V), new state. Recomputes the decoder over the prefix."""
        prefix = torch.cat([state["prefix"], prev[:, None]], dim=1)
        logits, _, _ = self.decode(prefix, state["memory"], state["padding"])
        return logits[:, -1], {**state, "prefix": prefix}
