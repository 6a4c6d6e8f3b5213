"""The names five ModelConfig switches accept, each with what the model code builds for it:

  model.arch     FAMILIES   the model family: the nn.Module class build_model (models/__init__.py) builds
  model.cell     CELLS      the recurrent cell of the LSTM family (models/rnn.py)
  model.norm     NORMS      where the Transformer's norms sit, and which (models/transformer.py)
  model.encoder  ENCODERS   what a classifier encodes its text with (models/classifier.py)
  model.pooling  POOLINGS   how a classifier pools its text's states into one vector (models/classifier.py)

This module imports no torch (config checks read it); the model code reads each entry when it builds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ablate.models.sequences import IMAGE_ROWS

if TYPE_CHECKING:
    from ablate.models.config import ModelConfig

REGION = 2  # a captioner's region is REGION x REGION pixels (models/captioner.py): an 8 x 8 digit is 4 x 4 of them

# The switches of one family, which the other ignores; the rest (d_model, layers, ...) every family reads.
LSTM_KEYS = ("cell", "bidirectional", "attention", "attention_query", "input_feeding", "attention_heads",
             "attention_window", "attention_width")  # fmt: skip
TRANSFORMER_KEYS = ("heads", "key_dim", "d_ff", "scale", "score", "pos_encoding", "pos_base", "pos_init",
                    "t5_buckets", "t5_max_distance", "residual", "ffn",
                    "norm", "causal_mask", "cross_attention", "decoder_self_attention", "embed_scale",
                    "qkv_projections")  # fmt: skip
CLASSIFIER_KEYS = ("encoder", "pooling")
# The captioner's own: Xu et al. 2015's doubly stochastic regularisation (its weight); its decoder reads the
# LSTM's switches but one, its encoder being a CNN rather than a (bi)directional RNN.
CAPTIONER_KEYS = ("doubly_stochastic",)
# A classifier's switches by what they act through: its LSTM encoder, its Transformer encoder, its attention
# pooling (the score, from models/scores.py, and its heads); the Transformer's decoder-only ones it never reads.
CLASSIFIER_READS = {
    "lstm": ("cell", "bidirectional"),
    "transformer": tuple(k for k in TRANSFORMER_KEYS
                         if k not in ("causal_mask", "cross_attention", "decoder_self_attention")),
    "attention": ("attention", "attention_heads"),
}  # fmt: skip


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
    # Why its training step cannot compile whole (models/steps.py), or None; for the configurations
    # `eager_when` picks (all by default).
    eager: str | None = "a plug-in family's step is compiled only where its Family says so (eager=None)"
    eager_when: Callable[[ModelConfig], bool] = lambda cfg: True
    # Its output is one label, the same at every target position (a task whose targets are one label,
    # schema/tasks.py Task.labelled): decoding emits one token, and the test pass adds the explanation
    # measures of models/explanation.py, which read what models/classifier.py's Classifier has beyond the
    # interface above: pad_id, cfg.pooling, `embedding` (the source embedding module), encode(src) ->
    # (states, padding, last, encoder weights), pool_weights(states, padding), classify(states, weights)
    # and logits(src).
    classifies: bool = False
    # Its source is an image (a task whose tokens are an image's pixels, schema/tasks.py Task.image), read
    # back into its rows and columns.
    images: bool = False
    # Its training loss adds a penalty of its own (models/steps.py `penalised`): the module then has
    # penalised(src, tgt_in) -> (logits, each example's penalty (B,) or None).
    penalised: bool = False
    # The most source tokens a memory of n positions holds (what position limits such as location
    # attention's max_positions bound): a token each, or a captioner's region of REGION x REGION pixels.
    memory_tokens: Callable[[int], int] = lambda n: n


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
    # The label's one query attends over the text as a decoder's query over its source: weights['cross'].
    "classifier": Family(
        "ablate.models.classifier:Classifier",
        (*CLASSIFIER_KEYS, *dict.fromkeys(k for keys in CLASSIFIER_READS.values() for k in keys)),
        cross_attends=lambda cfg: cfg.pooling in ("attention", "uniform"),
        eager="with model.encoder lstm, the encoder packs each batch (pack_padded_sequence) by lengths read on "
        "the host, which dynamo does not trace",
        eager_when=lambda cfg: cfg.encoder == "lstm",
        classifies=True,
    ),
    # The LSTM decoder over a CNN's regions of an image (models/captioner.py): its weights['cross'] over the
    # image's pixels, each region's weight spread over the pixels it covers.
    "captioner": Family(
        "ablate.models.captioner:Captioner",
        (*(k for k in LSTM_KEYS if k != "bidirectional"), *CAPTIONER_KEYS),
        cross_attends=lambda cfg: cfg.attention != "none",
        eager=None,
        images=True,
        penalised=True,
        memory_tokens=lambda n: n // (IMAGE_ROWS // REGION) * IMAGE_ROWS * REGION,
    ),
}
BUILT_IN = frozenset(FAMILIES)  # before plug-ins join: the families whose cross-key checks models/config.py runs


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

# model.encoder: each of a classifier's encoders, what it is.
ENCODERS = {
    "lstm": "models/rnn.py's encoder: a (bi)directional LSTM or GRU (model.cell, model.bidirectional)",
    "transformer": "models/transformer.py's encoder stack, every switch of its own (norm, positions, ...)",
    "embedding": "no context: each token's embedding through one feed-forward layer (ReLU)",
}
# model.pooling: how a classifier turns its text's states (B, S, D) into one vector (B, D).
POOLINGS = {
    "attention": "attention with a learned query, scored by model.attention (Bahdanau's additive, dot, ...)",
    "uniform": "attention frozen uniform over the real tokens, which is the mean of the states",
    "max": "the largest value of each feature over the real tokens",
    "last": "the final state (an LSTM's: its last step, both directions'), else the last real token's",
}
