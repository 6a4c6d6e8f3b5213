"""The names three ModelConfig switches accept, each with what the model code builds for it:

  model.arch  FAMILIES  the model family: the nn.Module class build_model (models/__init__.py) builds
  model.cell  CELLS     the recurrent cell of the LSTM family (models/rnn.py)
  model.norm  NORMS     where the Transformer's norms sit, and which (models/transformer.py)

This module imports no torch (config checks read it); the model code reads each entry when it builds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ablate.models.config import ModelConfig

# The switches of one family, which the other ignores; the rest (d_model, layers, ...) every family reads.
LSTM_KEYS = ("cell", "bidirectional", "attention", "attention_query", "input_feeding", "attention_heads",
             "attention_window", "attention_width")  # fmt: skip
TRANSFORMER_KEYS = ("heads", "key_dim", "d_ff", "scale", "score", "pos_encoding", "pos_base", "pos_init",
                    "t5_buckets", "t5_max_distance", "residual", "ffn",
                    "norm", "causal_mask", "cross_attention", "decoder_self_attention", "embed_scale",
                    "qkv_projections")  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A model family. `model` is its nn.Module class as 'package.module:Class', imported only to build one
    (torch loads slowly): Class(cfg, src_vocab, tgt_vocab, pad_id, ensemble: int) keeping `cfg`, `vocab`
    (src, tgt), `pad_id` and, as `.ensemble`, models.ensemble.Ensemble(ensemble) for its K seeds (rows
    seed-major), whose factories build its layers so that K seeds train as one model where `fuses`;
    forward(src, tgt_in, need_weights=False) -> logits (B, T, V), or (logits, weights: kind -> per-layer
    (B, H, T, S) tensors); record_states(), a context manager yielding what the test pass records (may be
    {}); init_state(src) -> a dict of batch-first tensors and step(state, prev) -> (logits (B, V), state),
    for decoding. `reads` sets which switches are ignored and which position limits apply; checks across
    keys (heads dividing d_model, ...) run for the built-in families only, so a family that reads such keys
    checks them itself."""

    model: str
    reads: tuple[str, ...] = ()  # which of the families' own switches (LSTM_KEYS, TRANSFORMER_KEYS) it reads
    # Whether its decoder attends over the source, giving weights['cross'] for the alignment metrics.
    cross_attends: Callable[[ModelConfig], bool] = lambda cfg: False
    fuses: bool = True  # K seeds train as one model (ensemble=K); else each seed trains alone
    # Why its training step cannot compile whole (models/steps.py), or None.
    eager: str | None = "a plug-in family's step is compiled only where its Family says so (eager=None)"


FAMILIES = {
    "lstm": Family(
        "ablate.models.rnn:RNNSeq2Seq", LSTM_KEYS, cross_attends=lambda cfg: cfg.attention != "none",
        eager="the encoder packs each batch (pack_padded_sequence) by lengths read on the host, which dynamo "
        "does not trace",
    ),  # fmt: skip
    "transformer": Family(
        "ablate.models.transformer:Transformer", TRANSFORMER_KEYS,
        cross_attends=lambda cfg: cfg.cross_attention, eager=None,
    ),  # fmt: skip
}


@dataclass(frozen=True)
class Cell:
    op: str  # the torch function nn.LSTM / nn.GRU call (torch.lstm, torch.gru), which models.rnn.RNN calls
    gates: int  # gate blocks in each weight: weight_ih is (gates·H, in), as nn.LSTM's / nn.GRU's
    states: tuple[str, ...]  # the parts of its recurrent state


CELLS = {"lstm": Cell("lstm", 4, ("h", "c")), "gru": Cell("gru", 3, ("h",))}


@dataclass(frozen=True)
class Norm:
    # "pre": on each sublayer's input, and once more on each stack's output (its residual stream is never
    # normalised otherwise); "post": on each sublayer's output after the residual sum; None: no norm.
    where: Literal["pre", "post"] | None
    rms: bool = False  # RMSNorm rather than LayerNorm


NORMS = {"post": Norm("post"), "pre": Norm("pre"), "none": Norm(None), "rms_pre": Norm("pre", rms=True)}
