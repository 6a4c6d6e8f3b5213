"""Encoder-decoder Transformer (Vaswani et al. 2017) with every part switchable.

Each ModelConfig switch is resolved to a module (or nn.Identity) in __init__, so forward reads straight
through: score and scale -> MultiHeadAttention.score, pos_encoding -> Positions, norm -> where the norms
sit, residual -> Sublayer.residual, ffn -> Sublayer or Skip, causal_mask / cross_attention /
decoder_self_attention -> DecoderLayer, qkv_projections -> Identity projections. `cross_attention: false`
builds no encoder: a language model of the target, the control that shows how much a task needs the source.
`decoder_self_attention: false`: a target position sees no earlier one, so without positions it cannot tell
where it is (Haviv et al. 2022's contrast: a causal decoder infers its position from the mask).
`ensemble=K`: models/ensemble.py; each dropout knows its side ('src' or 'tgt'), whose lengths bound each
seed's mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import repeat

import torch
from torch import nn

from ablate.models.attention import MultiHeadAttention
from ablate.models.config import ModelConfig
from ablate.models.ensemble import Ensemble, seed_axis
from ablate.models.kinds import NORMS
from ablate.models.positional import build_positions, positional_kind
from ablate.models.transformer_scores import build_score

Cache = dict[str, torch.Tensor]  # one decoder layer's keys and values (B, H, L, Dh) for incremental decoding
SELF_CACHE = ("self_k", "self_v")


def make_norm(cfg: ModelConfig, where: str, ensemble: Ensemble) -> nn.Module:
    """The norm `model.norm` (NORMS) puts `where` ('pre' or 'post'), or nn.Identity if none goes there."""
    norm = NORMS[cfg.norm]
    return ensemble.norm(cfg.d_model, rms=norm.rms) if norm.where == where else nn.Identity()


class Sublayer(nn.Module):
    """x -> post_norm(x + dropout(f(pre_norm(x)))), with the skip and either norm removable; x on `side`."""

    def __init__(self, fn: nn.Module, cfg: ModelConfig, ensemble: Ensemble, side: str):
        super().__init__()
        self.fn = fn
        self.pre_norm = make_norm(cfg, "pre", ensemble)
        self.post_norm = make_norm(cfg, "post", ensemble)
        self.dropout = ensemble.dropout(cfg.dropout, side)
        self.residual = cfg.residual

    def forward(self, x: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, weights = self.fn(self.pre_norm(x), *args)
        y = self.dropout(y)
        return self.post_norm(x + y if self.residual else y), weights


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, ensemble: Ensemble, side: str):
        super().__init__()
        self.net = nn.Sequential(
            ensemble.linear(d_model, d_ff), nn.ReLU(), ensemble.dropout(dropout, side),
            ensemble.linear(d_ff, d_model),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.net(x), None


class Skip(nn.Module):
    """A removed sublayer: the stream passes unchanged."""

    def forward(self, x: torch.Tensor, *_inputs) -> tuple[torch.Tensor, None]:
        return x, None


def feed_forward(cfg: ModelConfig, ensemble: Ensemble, side: str) -> nn.Module:
    if not cfg.ffn:
        return Skip()
    return Sublayer(FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, ensemble, side), cfg, ensemble, side)


class SelfAttention(nn.Module):
    def __init__(self, attn: MultiHeadAttention, causal: bool):
        super().__init__()
        self.attn, self.causal = attn, causal

    def forward(
        self, x: torch.Tensor, padding: torch.Tensor, need_weights: bool = False, cache: Cache | None = None
    ):
        """padding (B, L) covers every key position; with a cache, x holds only the positions after the
        cached ones, and their keys and values are appended to it."""
        if cache is None:
            k, v = self.attn.keys_values(x)
        else:
            k, v = self.attn.keys_values(x, offset=cache["self_k"].size(2))
            k = cache["self_k"] = torch.cat([cache["self_k"], k], dim=2)
            v = cache["self_v"] = torch.cat([cache["self_v"], v], dim=2)
        return self.attn.attend(x, k, v, padding, self.causal, need_weights)

    def init_cache(self, memory: torch.Tensor) -> Cache:
        """No positions yet: the keys and values of an empty sequence (shape and dtype as later ones)."""
        k, v = self.attn.keys_values(memory[:, :0])
        return {"self_k": k, "self_v": v}


class CrossAttention(nn.Module):
    def __init__(self, attn: MultiHeadAttention):
        super().__init__()
        self.attn = attn

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_padding: torch.Tensor,
        need_weights: bool = False,
        cache: Cache | None = None,
    ):
        k, v = (cache["cross_k"], cache["cross_v"]) if cache is not None else self.attn.keys_values(memory)
        return self.attn.attend(x, k, v, memory_padding, need_weights=need_weights)

    def init_cache(self, memory: torch.Tensor) -> Cache:
        """The memory's keys and values, computed once per source instead of once per decoding step."""
        k, v = self.attn.keys_values(memory)
        return {"cross_k": k, "cross_v": v}


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, make_attention, ensemble: Ensemble):
        super().__init__()
        attention = make_attention(("src", "src"))
        self.self_attn = Sublayer(SelfAttention(attention, causal=False), cfg, ensemble, "src")
        self.ff = feed_forward(cfg, ensemble, "src")

    def forward(self, x, padding, need_weights=False):
        x, weights = self.self_attn(x, padding, need_weights)
        x, _ = self.ff(x)
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, make_attention, ensemble: Ensemble):
        super().__init__()
        self.self_attn = (
            Sublayer(SelfAttention(make_attention(("tgt", "tgt")), cfg.causal_mask), cfg, ensemble, "tgt")
            if cfg.decoder_self_attention
            else Skip()
        )
        self.cross_attn = (
            Sublayer(CrossAttention(make_attention(("tgt", "src"), positional=False)), cfg, ensemble, "tgt")
            if cfg.cross_attention
            else None
        )
        self.ff = feed_forward(cfg, ensemble, "tgt")

    def forward(self, x, padding, memory, memory_padding, need_weights=False, cache: Cache | None = None):
        x, self_weights = self.self_attn(x, padding, need_weights, cache)
        cross_weights = None
        if self.cross_attn is not None:
            x, cross_weights = self.cross_attn(x, memory, memory_padding, need_weights, cache)
        x, _ = self.ff(x)
        return x, self_weights, cross_weights

    def init_cache(self, memory: torch.Tensor) -> Cache:
        cache = self.self_attn.fn.init_cache(memory)
        if self.cross_attn is not None:
            cache.update(self.cross_attn.fn.init_cache(memory))
        return cache


class Transformer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0, ensemble: int = 1,
        decoder: bool = True,
    ):  # fmt: skip
        """decoder=False: the encoder stack alone (`encode`), as a classifier's encoder (models/classifier.py)."""
        super().__init__()
        self.cfg, self.vocab, self.pad_id = cfg, (src_vocab, tgt_vocab), pad_id
        self.ensemble = ens = Ensemble(ensemble)
        d = cfg.d_model
        self.src_embed = ens.embedding(src_vocab, d, padding_idx=pad_id)
        self.tgt_embed = ens.embedding(tgt_vocab, d, padding_idx=pad_id) if decoder else None
        self.embed_scale = math.sqrt(d) if cfg.embed_scale else 1.0
        # Without cross-attention no encoder layer could reach the decoder: none is built or run.
        encoder_layers = cfg.layers if cfg.cross_attention else 0
        # Each stack's self-attention: whether it sees later positions (a score bias per stack reads it).
        bidirectional = ({"src": True} if encoder_layers else {}) | (
            {"tgt": not cfg.causal_mask} if decoder and cfg.decoder_self_attention else {}
        )
        self.positions = ens.stacked(lambda: build_positions(cfg, bidirectional))
        self.src_dropout, self.tgt_dropout = ens.dropout(cfg.dropout, "src"), ens.dropout(cfg.dropout, "tgt")

        def make_attention(sides: tuple[str, str], positional: bool = True) -> MultiHeadAttention:
            # Relative positions act within a sequence; cross-attention gets none. A score of its own per
            # attention: a learned one has its parameters per layer.
            slots = self.positions.slots(sides[0]) if positional else (None, None)
            score = ens.stacked(lambda: build_score(cfg))
            return MultiHeadAttention(
                d, cfg.heads, cfg.dropout, cfg.qkv_projections, *slots, score=score, ensemble=ens, sides=sides,
                key_dim=cfg.key_dim,
            )

        self.encoder = nn.ModuleList(EncoderLayer(cfg, make_attention, ens) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(
            DecoderLayer(cfg, make_attention, ens) for _ in range(cfg.layers if decoder else 0)
        )
        # Pre-norm stacks need a final norm: their residual stream is never normalised otherwise.
        self.encoder_norm = make_norm(cfg, "pre", ens) if encoder_layers else nn.Identity()
        self.decoder_norm = make_norm(cfg, "pre", ens) if decoder else None
        self.generator = ens.linear(d, tgt_vocab) if decoder else None
        if cfg.tie_embeddings and decoder:
            self.generator.weight = self.tgt_embed.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.startswith("positions."):
                continue
            for w in seed_axis(p, self.ensemble.k):  # each seed's own tensor
                if w.dim() > 1:
                    nn.init.xavier_uniform_(w)
        with torch.no_grad():  # xavier overwrote the zero vector nn.Embedding keeps for padding
            for embedding in filter(None, (self.src_embed, self.tgt_embed)):
                embedding.weight[..., self.pad_id, :] = 0.0
        if self.cfg.pos_init == "embedding" and positional_kind(self.cfg.pos_encoding).learned:
            self.positions.embedding.redraw(self._token_scale())

    def _token_scale(self) -> list[float]:
        """Each seed's standard deviation of the token embeddings the positions are added to, times
        embed_scale: over the real rows of each side the model embeds, the sides' variances averaged, so
        that a large vocabulary does not outweigh a small one (xavier's sqrt(2 / (V + d)) a side)."""
        sides = [e for e in (self.tgt_embed, self.src_embed if len(self.encoder) else None) if e is not None]
        variances = []
        for embedding in sides:
            real = torch.arange(embedding.num_embeddings, device=embedding.weight.device) != self.pad_id
            rows = seed_axis(embedding.weight.detach(), self.ensemble.k)[:, real]  # (K, V - 1, D)
            variances.append(rows.flatten(1).var(dim=1))
        return (torch.stack(variances).mean(0).sqrt() * self.embed_scale).tolist()

    def _embed(self, embedding: nn.Module, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Token embeddings with positions, before dropout."""
        return self.positions.embed(embedding(tokens) * self.embed_scale, offset)

    def encode(self, src: torch.Tensor, need_weights: bool = False):
        """src (B, S) -> memory (B, S, D), padding (B, S) True for real tokens, per-layer weights."""
        padding = src != self.pad_id
        self.ensemble.measure("src", padding)
        x = self.src_dropout(self._embed(self.src_embed, src))
        weights = []
        for layer in self.encoder:
            x, w = layer(x, padding, need_weights)
            weights.append(w)
        return self.encoder_norm(x), padding, weights

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        memory_padding: torch.Tensor,
        need_weights: bool = False,
        caches: list[Cache] | None = None,
    ):
        """tgt_in (B, T) -> logits (B, T, V) and per-layer self / cross weights. With `caches` (one per layer,
        see init_state) only the T - cached positions after the cached ones are computed."""
        cached = caches[0]["self_k"].size(2) if caches else 0
        padding = tgt_in != self.pad_id
        self.ensemble.measure("tgt", padding)
        x = self.tgt_dropout(self._embed(self.tgt_embed, tgt_in[:, cached:], offset=cached), offset=cached)
        self_w, cross_w = [], []
        for layer, cache in zip(self.decoder, caches or repeat(None)):
            x, sw, cw = layer(x, padding, memory, memory_padding, need_weights, cache)
            self_w.append(sw)
            cross_w.append(cw)
        return self.generator(self.decoder_norm(x)), self_w, cross_w

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V); with need_weights also {'encoder', 'decoder', 'cross'}:
        a list per layer of (B, H, T, S) weights (None for cross when cross_attention is off)."""
        memory, padding, enc_w = self.encode(src, need_weights)
        logits, self_w, cross_w = self.decode(tgt_in, memory, padding, need_weights)
        if not need_weights:
            return logits
        return logits, {"encoder": enc_w, "decoder": self_w, "cross": cross_w}

    @contextmanager
    def record_states(self) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Collects every encoder and decoder layer's output (B, L, D) of the forward passes run inside, for
        diagnostics (models/diagnostics.py); read off forward hooks so forward itself stays plain."""
        states: dict[str, list[torch.Tensor]] = {"encoder": [], "decoder": []}
        hooks = [
            layer.register_forward_hook(lambda _m, _args, out, side=side: states[side].append(out[0]))
            for side, stack in (("encoder", self.encoder), ("decoder", self.decoder))
            for layer in stack
        ]
        try:
            yield states
        finally:
            for hook in hooks:
                hook.remove()

    # Incremental decoding (models/decoding.py): every state tensor is batch-first so beams can reorder it.
    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        memory, padding, _ = self.encode(src)
        state = {"memory": memory, "padding": padding, "prefix": src.new_zeros(src.size(0), 0)}
        # A key/value cache is exact only if earlier positions never see later ones; without the causal
        # mask every step changes them all, so step decodes the whole prefix again (as without self-attention,
        # where no cache holds the prefix's length).
        if self.cfg.causal_mask and self.cfg.decoder_self_attention:
            caches = [layer.init_cache(memory) for layer in self.decoder]
            state.update({name: torch.stack([c[name] for c in caches], dim=1) for name in caches[0]})
        return state

    def step(self, state: dict[str, torch.Tensor], prev: torch.Tensor):
        """prev (B,) -> next-token logits (B, V), new state. State caches are (B, layers, H, L, Dh)."""
        prefix = torch.cat([state["prefix"], prev[:, None]], dim=1)
        caches = None
        if "self_k" in state:
            names = [name for name in state if name.endswith(("_k", "_v"))]
            caches = [{name: state[name][:, i] for name in names} for i in range(len(self.decoder))]
        logits, _, _ = self.decode(prefix, state["memory"], state["padding"], caches=caches)
        new_state = {**state, "prefix": prefix}
        if caches is not None:
            new_state.update({name: torch.stack([c[name] for c in caches], dim=1) for name in SELF_CACHE})
        return logits[:, -1], new_state
