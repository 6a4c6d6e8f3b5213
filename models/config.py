"""ModelConfig: every architectural switch of both model families, typed and validated.

The names a switch accepts come from the registries imported below. Each switch belongs to a family
(LSTM_KEYS, TRANSFORMER_KEYS), and some act only through a part the model may lack: `ignored_keys` names
them, so a study cannot count two variants that build one model as two. Presets are named configs
(`preset_keys`; `ModelConfig(**preset_keys(name))` builds one alone).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ablate.models.kinds import (
    BUILT_IN,
    CAPTIONER_KEYS,
    CELLS,
    CLASSIFIER_KEYS,
    CLASSIFIER_READS,
    ENCODERS,
    FAMILIES,
    LSTM_KEYS,
    NORMS,
    POOLINGS,
    TRANSFORMER_KEYS,
)  # fmt: skip
from ablate.models.plugins import fault as plugin_fault
from ablate.models.plugins import in_use, settings_model
from ablate.models.plugins import load as load_plugins
from ablate.models.positional import POSITIONAL, check_fits, positional_kind
from ablate.models.scores import SCORES, WINDOWS
from ablate.models.transformer_scores import TRANSFORMER_SCORES, check_scale

load_plugins()  # installed plug-ins join the registries before ModelConfig reads their names
PluginSettings = settings_model("model")  # model.plugin.<name>.<key>: the settings plug-ins declare

# Every number a config takes has both ends. The upper ones hold a value to what one machine can train, far
# above any study's, so that a slip of a few zeros is refused up front, not found when memory or time runs out.
MAX_SIZE = 2**20  # widths, heads, layers, positions, lengths, vocabularies, batch rows, beams
MAX_MANY = 10**9  # examples, steps, tokens of a batch budget
# A count of at least one; strict, so a boolean (YAML's `true`) is not taken for 1.
Count = Annotated[int, Field(ge=1, le=MAX_SIZE, strict=True)]
Many = Annotated[int, Field(ge=1, le=MAX_MANY, strict=True)]
Scale = Literal["sqrt", "none"] | Annotated[float, Field(ge=-1e6, le=1e6)]


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no key takes NaN or inf

    arch: Literal[tuple(FAMILIES)] = "transformer"  # type: ignore[valid-type]
    d_model: Count = 64
    layers: Count = 2
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    tie_embeddings: bool = False

    # lstm family
    cell: Literal[tuple(CELLS)] = "lstm"  # type: ignore[valid-type]
    bidirectional: bool = True
    attention: Literal[("none", *SCORES)] = "none"  # type: ignore[valid-type]
    attention_query: Literal["previous", "current"] = "previous"
    input_feeding: bool = False
    attention_heads: Count = 1
    attention_window: Literal[tuple(WINDOWS)] = "global"  # type: ignore[valid-type]
    attention_width: Count = 10  # D of a local window, [p_t - D, p_t + D]: Luong et al. 2015's choice

    # transformer family
    heads: Count = 4
    # d_k, the width of each head's queries and keys (Vaswani et al.'s Table 3 (B) varies it alone); unset:
    # d_model / heads, the width of each head's values.
    key_dim: Count | None = None
    d_ff: Count = 256
    scale: Scale = "sqrt"
    score: Literal[tuple(TRANSFORMER_SCORES)] = "dot"  # type: ignore[valid-type]
    pos_encoding: str = Field(
        "sinusoidal",
        description=f"{' | '.join(POSITIONAL)}, or kinds with different parts joined by +, e.g. alibi+sinusoidal",
    )
    pos_base: float = Field(10000.0, gt=1.0, le=1e12)
    # Where learned position rows start: small, N(0, 0.02²), as they did before the key; embedding, on the
    # token embeddings' scale (std ≈ 1.4 under embed_scale), so that neither drowns the other at the start.
    pos_init: Literal["small", "embedding"] = "small"
    max_positions: Count = 512
    # T5's relative-position buckets (Raffel et al. 2020: 32 up to distance 128): half exact, the rest
    # logarithmic up to max_distance, every distance beyond sharing the last.
    t5_buckets: Annotated[int, Field(ge=4, le=MAX_SIZE, strict=True)] = 32
    t5_max_distance: Count = 128
    residual: bool = True
    ffn: bool = True  # false: no feed-forward sublayers (pure attention when residual is false too)
    norm: Literal[tuple(NORMS)] = "post"  # type: ignore[valid-type]
    causal_mask: bool = True
    cross_attention: bool = True
    decoder_self_attention: bool = True  # false: a target position sees no earlier one
    embed_scale: bool = True
    qkv_projections: bool = True

    # classifier family (models/classifier.py): the encoder and the pooling; attention pooling scores with
    # model.attention over model.attention_heads heads
    encoder: Literal[tuple(ENCODERS)] = "lstm"  # type: ignore[valid-type]
    # uniform by default: attention pooling needs a score, and model.attention's default is none
    pooling: Literal[tuple(POOLINGS)] = "uniform"  # type: ignore[valid-type]
    # captioner family (models/captioner.py): the weight lambda of Xu et al. 2015's doubly stochastic
    # regularisation, lambda * sum over regions of (1 - the attention the caption gave the region)^2; 0: off
    doubly_stochastic: float = Field(0.0, ge=0.0, le=1e3)
    plugin: PluginSettings = PluginSettings()  # type: ignore[valid-type]

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: Scale) -> Scale:
        if isinstance(v, float) and v <= 0:
            raise ValueError("must be 'sqrt', 'none' or a positive number")
        return v

    @field_validator("pos_encoding")
    @classmethod
    def _positional_kind(cls, v: str) -> str:
        broken = next(filter(None, (plugin_fault("pos_encoding", name) for name in v.split("+"))), None)
        if broken:  # an installed plug-in of that name that failed: its own line, not "unknown kind"
            raise ValueError(broken)
        positional_kind(v)
        return v

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.arch == "classifier" and self.pooling == "attention" and self.attention == "none":
            raise ValueError("attention: attention pooling needs a score (got attention=none; or pooling: "
                             f"{' | '.join(p for p in POOLINGS if p != 'attention')})")  # fmt: skip
        if self.arch == "classifier" and self.pooling == "last" and self.encoder == "embedding":
            raise ValueError("pooling: last reads the last token alone, which a classifier without context "
                             "(encoder: embedding) reads nothing else through (always EOS)")  # fmt: skip
        reads = self.read_keys() if self.arch in BUILT_IN else ()
        if self.arch in BUILT_IN and FAMILIES[self.arch].images and self.attention != "none" and (
            self.attention_window == "local-m"
        ):
            raise ValueError("attention_window: local-m centres each step's window on its step number, and an "
                             "image's regions are not in step with its caption (global | local-p)")  # fmt: skip
        if "heads" in reads:
            if self.d_model % self.heads:
                raise ValueError(f"heads: must divide d_model={self.d_model} (got heads={self.heads})")
            if self.key_dim is not None and not self.qkv_projections:
                raise ValueError(
                    f"key_dim: needs qkv_projections (without them queries and keys are the d_model/heads="
                    f"{self.d_model // self.heads} features of each head's slice)"
                )
            check_fits(self)
            check_scale(self)
            if positional_kind(self.pos_encoding).bucketed and self.t5_max_distance <= self.t5_buckets // 2:
                raise ValueError(
                    f"t5_max_distance: must exceed the {self.t5_buckets // 2} exact buckets of t5_buckets="
                    f"{self.t5_buckets} (got {self.t5_max_distance})"
                )
        if "bidirectional" in reads:
            if self.bidirectional and self.d_model % 2:
                raise ValueError(
                    f"d_model: must be even for a bidirectional encoder (got d_model={self.d_model})"
                )
        if "attention_heads" in reads:
            if self.attention != "none" and self.d_model % self.attention_heads:
                raise ValueError(
                    f"attention_heads: must divide d_model={self.d_model} (got attention_heads={self.attention_heads})"
                )
        return self

    def read_keys(self) -> tuple[str, ...]:
        """Which of the families' own switches (LSTM_KEYS, TRANSFORMER_KEYS, CLASSIFIER_KEYS) this model reads:
        its family's, and of a classifier's those of its encoder and, with attention pooling, its score's."""
        if self.arch != "classifier":
            return FAMILIES[self.arch].reads
        parts = (self.encoder, "attention") if self.pooling == "attention" else (self.encoder,)
        return (*CLASSIFIER_KEYS, *(key for part in parts for key in CLASSIFIER_READS.get(part, ())))

    def ignored_keys(self) -> dict[str, str]:
        """Key -> why the model this config builds ignores it: a switch of another family, or one that acts
        only through a part this model lacks. Changing such a key changes nothing the model computes."""
        reads = self.read_keys()
        owner = {**dict.fromkeys(LSTM_KEYS, "an LSTM"), **dict.fromkeys(TRANSFORMER_KEYS, "a Transformer"),
                 **dict.fromkeys(CLASSIFIER_KEYS, "a classifier"), **dict.fromkeys(CAPTIONER_KEYS, "a captioner")}  # fmt: skip
        ignored = {key: f"{family} setting; model.arch is {self.arch}" for key, family in owner.items()
                   if key not in FAMILIES[self.arch].reads}  # fmt: skip
        if self.arch == "classifier":
            ignored["tie_embeddings"] = "ties a decoder's embeddings to its output layer; a classifier has none"
            if self.encoder == "embedding":
                ignored["layers"] = "stacks an encoder's layers; model.encoder is embedding (one layer, no context)"
            for part, keys in CLASSIFIER_READS.items():
                switch, value = ("pooling", self.pooling) if part == "attention" else ("encoder", self.encoder)
                why = f"acts only with a classifier's {part} {switch}; model.{switch} is {value}"
                ignored |= {key: why for key in keys if key not in reads}
        if self.attention == "uniform" and self.attention_window == "global" and "attention" in reads:
            # Every head's weights are the mean, and their sum over a caption is fixed by its length.
            why = "weights cannot move under model.attention uniform over the global window"
            ignored |= {key: why for key in ("attention_heads", *CAPTIONER_KEYS) if key in reads}
        if self.arch in ("lstm", "captioner"):
            if self.attention == "none":
                keys = (*ATTENTION_KEYS, *CAPTIONER_KEYS) if self.arch == "captioner" else ATTENTION_KEYS
                ignored |= dict.fromkeys(keys, "acts only with attention; model.attention is none")
            elif not WINDOWS[self.attention_window].reads_width:
                ignored["attention_width"] = (
                    f"acts only with a local window; model.attention_window is {self.attention_window}"
                )
        if self.arch in BUILT_IN and "ffn" in reads:
            if not self.ffn:
                ignored["d_ff"] = "acts only with feed-forward sublayers; model.ffn is false"
            if "decoder_self_attention" in reads and not self.decoder_self_attention:
                ignored["causal_mask"] = "masks only the decoder's self-attention; model.decoder_self_attention is false"
            kind = positional_kind(self.pos_encoding)
            if not kind.based:
                ignored["pos_base"] = f"acts only on sinusoidal or rotary positions, not {self.pos_encoding}"
            if not kind.learned:
                ignored["pos_init"] = f"acts only on learned positions, not {self.pos_encoding}"
            if not kind.bucketed:
                for key in ("t5_buckets", "t5_max_distance"):
                    ignored[key] = f"acts only on the T5 bias, not {self.pos_encoding}"
        if type(self.plugin).model_fields:  # plug-ins with settings are installed
            # A plug-in named by a key this model ignores is not used either.
            read = {f"model.{k}": v for k, v in self.model_dump().items() if k not in ignored}
            used = {name for _, name in in_use(read)}
            for name, block in self.plugin:
                if name not in used:
                    why = f"a setting of plug-in {name}, which this model does not use"
                    ignored |= dict.fromkeys((f"plugin.{name}.{key}" for key in type(block).model_fields), why)
        score_reads = "score" in reads and TRANSFORMER_SCORES[self.score].reads_max_positions
        if self.position_limits == (None, None) and not score_reads:
            ignored["max_positions"] = (
                "bounds only learned positions and location attention; no score reads it"
            )
        return ignored

    def effective(self) -> ModelConfig:
        """This config with every ignored key at its default: equal for two configs that build one model."""
        ignored = self.ignored_keys()
        defaults = {key: ModelConfig.model_fields[key].default for key in ignored if "." not in key}
        unused = {key.split(".")[1] for key in ignored if key.startswith("plugin.")}
        default = PluginSettings()
        defaults["plugin"] = self.plugin.model_copy(update={name: getattr(default, name) for name in unused})
        return self.model_copy(update=defaults)

    @property
    def d_k(self) -> int:
        """Each head's query and key width: model.key_dim, else d_model / heads."""
        return self.key_dim or self.d_model // self.heads

    @property
    def scale_factor(self) -> float:
        """The factor that multiplies q·k: 1/sqrt(d_k) for `sqrt`, 1 for `none`, else the number given."""
        if self.scale == "sqrt":
            return self.d_k**-0.5
        return 1.0 if self.scale == "none" else float(self.scale)

    @property
    def position_limits(self) -> tuple[int | None, int | None]:
        """The most source and target positions the model can place; None where any length works
        (learned positions stop at max_positions on both sides, location attention on the source), for
        the keys it reads. A classifier places no target positions: it emits one label."""
        reads = self.read_keys()
        limits = []
        if "pos_encoding" in reads:
            limits.append(positional_kind(self.pos_encoding).max_length(self.max_positions))
        score = SCORES.get(self.attention) if "attention" in reads else None
        if score is not None:
            limits.append(score.max_length(self.max_positions))
        source = min((limit for limit in limits if limit is not None), default=None)
        if source is not None:
            source = FAMILIES[self.arch].memory_tokens(source)
        decodes_positions = "pos_encoding" in reads and not FAMILIES[self.arch].classifies
        return source, (source if decodes_positions else None)


# An LSTM's switches that act only with attention.
ATTENTION_KEYS = ("attention_query", "input_feeding", "attention_heads", "attention_window",
                  "attention_width")  # fmt: skip


def preset_keys(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model keys of preset `name` with `overrides` on top; ValueError naming the known presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return {**PRESETS[name], **(overrides or {})}


PRESETS: dict[str, dict[str, Any]] = {
    # Sutskever et al. 2014: the fixed-length bottleneck.
    "lstm": dict(arch="lstm", attention="none"),
    # Bahdanau et al. 2015: additive score of s_{t-1}, context enters the RNN input.
    "lstm-bahdanau": dict(arch="lstm", attention="additive", attention_query="previous"),
    # Luong et al. 2015: score with h_t, attentional state h~_t, input feeding.
    "lstm-luong-dot": dict(arch="lstm", attention="dot", attention_query="current", input_feeding=True),
    "lstm-luong-general": dict(
        arch="lstm", attention="general", attention_query="current", input_feeding=True
    ),
    "lstm-luong-concat": dict(arch="lstm", attention="concat", attention_query="current", input_feeding=True),
    "lstm-luong-location": dict(
        arch="lstm", attention="location", attention_query="current", input_feeding=True
    ),
    # Jain & Wallace 2019's classifiers: a BiLSTM's states pooled by additive or scaled dot-product attention
    # with a learned query (models/classifier.py).
    "classifier-additive": dict(arch="classifier", encoder="lstm", pooling="attention", attention="additive"),
    "classifier-scaled-dot": dict(
        arch="classifier", encoder="lstm", pooling="attention", attention="scaled_dot"
    ),
    # Xu et al. 2015's soft attention: an LSTM decoder scoring the CNN's regions additively with h_{t-1}, the
    # context entering the LSTM's input, and the doubly stochastic regularisation at weight 1.
    "captioner-soft": dict(arch="captioner", attention="additive", attention_query="previous",
                           doubly_stochastic=1.0),  # fmt: skip
    # Vaswani et al. 2017: post-LN, sinusoidal positions, 1/sqrt(d_k).
    "transformer": dict(arch="transformer", norm="post", pos_encoding="sinusoidal", scale="sqrt"),
    # Xiong et al. 2020.
    "transformer-pre-ln": dict(arch="transformer", norm="pre", pos_encoding="sinusoidal", scale="sqrt"),
}
