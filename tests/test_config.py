"""Config validation: every error names its dotted key; presets and overrides compose."""

from __future__ import annotations

import re

import pytest
import torch
import yaml

from ablate.models import build_model
from ablate.models.config import PRESETS, ModelConfig, preset_keys
from ablate.models.positional import POSITIONAL
from ablate.models.scores import SCORES, WINDOWS
from ablate.models.transformer_scores import TRANSFORMER_SCORES
from ablate.schema.config import (
    ExperimentConfig,
    accepted_values,
    build_config,
    fitting_task,
    load_config,
    parse_override,
)
from ablate.schema.errors import ConfigError
from tests.conftest import ablate


def error_of(tree: dict, overrides: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(tree, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_key_names_its_path():
    assert error_of({"model": {"headz": 4}}) == "model.headz: unknown config key"
    assert error_of({}, {"train.lrr": 0.1}) == "train.lrr: unknown config key"
    assert error_of({"colour": "red"}) == "colour: unknown config key"


def test_heads_must_divide_d_model():
    assert (
        error_of({"model": {"d_model": 128, "heads": 3}})
        == "model.heads: must divide d_model=128 (got heads=3)"
    )


def test_bad_values_name_their_key():
    assert error_of({}, {"model.layers": "many"}).startswith("model.layers: ")
    assert error_of({}, {"model.norm": "batch"}).startswith("model.norm: ")
    assert error_of({}, {"model.scale": "cube"}).startswith("model.scale: ")
    assert error_of({}, {"train.lr": -1}) == "train.lr: Input should be greater than 0 (got -1)"
    assert error_of({}, {"task.min_len": 9, "task.max_len": 4}).startswith("task.min_len: ")
    assert error_of({}, {"task.name": "juggle"}).startswith("task.name: ")


def test_unknown_preset():
    assert error_of({"preset": "gpt5"}).startswith("preset: unknown preset 'gpt5'")


def test_preset_then_overrides_win():
    cfg = build_config({"preset": "transformer-pre-ln", "model": {"heads": 2}}, {"model.d_model": 32})
    assert (cfg.model.norm, cfg.model.heads, cfg.model.d_model) == ("pre", 2, 32)
    assert ModelConfig(**preset_keys("lstm-bahdanau")).attention == "additive"
    assert {"lstm", "lstm-bahdanau", "lstm-luong-dot", "transformer", "transformer-pre-ln"} <= set(PRESETS)


def test_presets_resolve_in_one_place():
    for name in PRESETS:
        task = {"task": {"name": fitting_task(preset_keys(name)["arch"])}}
        assert build_config({"preset": name, **task}).model == ModelConfig(**preset_keys(name))
    assert error_of({"preset": "gpt5"}) == f"preset: unknown preset 'gpt5'; known: {', '.join(PRESETS)}"


def one_of(names: list[str]) -> str:
    """How pydantic lists a Literal's choices: 'a', 'b' or 'c'."""
    return ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"


def test_lstm_scores_the_config_accepts_are_the_registry():
    for name in ["none", *SCORES]:
        assert build_config({"preset": "lstm"}, {"model.attention": name}).model.attention == name
    assert (
        error_of({}, {"model.attention": "dotty"})
        == f"model.attention: Input should be {one_of(['none', *SCORES])} (got 'dotty')"
    )


def test_transformer_scores_the_config_accepts_are_the_registry():
    for name in TRANSFORMER_SCORES:
        assert build_config({"preset": "transformer"}, {"model.score": name}).model.score == name
    assert (
        error_of({}, {"model.score": "dotty"})
        == f"model.score: Input should be {one_of(list(TRANSFORMER_SCORES))} (got 'dotty')"
    )


def test_scale_is_refused_where_the_score_gives_it_no_meaning():
    """cosine learns its factor g: model.scale is g's start (a number, or the default sqrt for Henry et al.'s
    log2(L^2 - L)), and `none` (no factor) would be ignored."""
    assert error_of({}, {"model.score": "cosine", "model.scale": "none"}) == (
        "model.scale: none has no meaning with score cosine, where it sets the learned factor g's starting "
        "value: a number, or sqrt (the default) for Henry et al.'s log2(L² − L) with L = model.max_positions"
    )
    for scale in ("sqrt", 3.0):
        assert build_config({}, {"model.score": "cosine", "model.scale": scale}).model.scale == scale
    for scale in ("sqrt", "none", 0.3):
        assert build_config({}, {"model.score": "dot", "model.scale": scale}).model.scale == scale


def test_accepted_values_name_every_key_with_its_choices():
    accepts = accepted_values()
    assert set(accepts) == set(build_config({}).flat())
    assert accepts["model.norm"] == "post | pre | none | rms_pre"
    assert accepts["model.attention"] == " | ".join(["none", *SCORES])
    assert accepts["model.attention_window"] == " | ".join(WINDOWS) == "global | local-m | local-p"
    assert accepts["model.score"] == " | ".join(TRANSFORMER_SCORES)
    assert accepts["model.pos_encoding"].startswith(" | ".join(POSITIONAL) + ", or kinds")
    assert (accepts["model.scale"], accepts["task.test_max_len"]) == (
        "sqrt | none, or number >= -1000000, <= 1000000",
        "integer >= 1, <= 1048576, or unset",
    )


def test_scale_accepts_keyword_or_number():
    assert build_config({}, {"model.scale": "none"}).model.scale_factor == 1.0
    assert build_config({}, {"model.scale": 0.25}).model.scale_factor == 0.25
    # d_model 64 over 4 heads: d_k 16; with key_dim, d_k is that
    assert build_config({}, {"model.scale": "sqrt"}).model.scale_factor == 16**-0.5
    assert build_config({}, {"model.scale": "sqrt", "model.key_dim": 4}).model.scale_factor == 0.5


def test_override_values_are_typed():
    assert parse_override("model.heads=8") == ("model.heads", 8)
    assert parse_override("model.residual=false") == ("model.residual", False)
    assert parse_override("train.lr=3e-4") == ("train.lr", 3e-4)
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("model.heads")


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  heads: 4\n   d_model: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: YAML syntax error"):
        load_config(bad)
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        load_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("seed: 3\nmodel: {arch: lstm}\n")
    assert load_config(good, sets=["model.d_model=32"]).model.d_model == 32


def test_flat_keys_match_the_design_contract():
    flat = build_config({}).flat()
    for key in ["seed", "task.name", "task.test_max_len", "model.pos_encoding", "model.pos_base", "model.norm",
                "model.attention_query", "model.input_feeding", "train.batch_tokens", "train.schedule",
                "train.max_time", "train.beam_size", "train.compile"]:  # fmt: skip
        assert key in flat


@pytest.mark.parametrize(
    "key", ["train.lr", "train.weight_decay", "train.label_smoothing", "train.max_time", "train.grad_clip",
            "train.length_penalty", "model.dropout", "model.pos_base", "model.scale"],
)  # fmt: skip
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_key_takes_nan_or_infinity(key, value):
    # model.scale is 'sqrt', 'none' or a number: its message names the words it also accepts.
    said = "Input should be 'sqrt' or 'none'" if key == "model.scale" else "Input should be a finite number"
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: {said}"):
        load_config(None, "transformer", [f"{key}={value}"])


def test_nan_learning_rate_is_refused_on_the_command_line_before_training(tmp_path):
    proc = ablate("train", "--set", "train.lr=nan", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: train.lr: Input should be a finite number"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "key, inside, outside, said",
    [
        ("model.dropout", [0.0, 0.999], [1.0], "Input should be less than 1"),
        ("model.dropout", [0.0], [-0.001], "Input should be greater than or equal to 0"),
        ("model.scale", [0.001], [0.0, -1.0], "must be 'sqrt', 'none' or a positive number"),
        ("model.pos_base", [1.001], [1.0, 0.5], "Input should be greater than 1"),
        ("train.lr", [1e-9], [0.0, -1e-9], "Input should be greater than 0"),
        ("train.weight_decay", [0.0], [-0.001], "Input should be greater than or equal to 0"),
        ("train.warmup_steps", [0], [-1], "Input should be greater than or equal to 0"),
        ("train.label_smoothing", [0.0, 0.999], [1.0], "Input should be less than 1"),
        ("train.label_smoothing", [0.0], [-0.001], "Input should be greater than or equal to 0"),
        ("train.length_penalty", [0.0], [-0.001], "Input should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_bounds_refuse_the_value_just_outside_and_keep_the_one_just_inside(key, inside, outside, said):
    group, name = key.split(".")
    for value in inside:
        assert getattr(getattr(build_config({}, {key: value}), group), name) == value
    for value in outside:
        assert error_of({}, {key: value}).startswith(f"{key}: {said}")


def test_lstm_shape_checks_apply_only_where_they_matter():
    lstm = {"model.arch": "lstm", "model.d_model": 63}
    assert error_of({}, lstm).startswith("model.d_model: must be even for a bidirectional encoder")
    assert build_config({}, {**lstm, "model.bidirectional": False}).model.d_model == 63
    heads = {"model.arch": "lstm", "model.attention": "dot", "model.attention_heads": 3}
    assert error_of({}, heads) == "model.attention_heads: must divide d_model=64 (got attention_heads=3)"
    # Without attention there are no attention heads to divide d_model; a Transformer never reads them.
    assert build_config({}, {**heads, "model.attention": "none"}).model.attention_heads == 3
    assert build_config({}, {"model.attention_heads": 3}).model.attention_heads == 3


def test_preset_keys_apply_their_overrides_on_the_preset():
    cfg = ModelConfig(**preset_keys("lstm-luong-dot", {"d_model": 32, "input_feeding": False}))
    assert (cfg.arch, cfg.attention, cfg.attention_query) == ("lstm", "dot", "current")
    assert (cfg.d_model, cfg.input_feeding) == (32, False)  # the preset says True


def test_a_key_the_model_ignores_is_refused_on_the_command_line():
    with pytest.raises(ConfigError) as info:
        load_config(None, "lstm", ["model.heads=8"])
    assert str(info.value) == "model.heads: has no effect (a Transformer setting; model.arch is lstm)"
    with pytest.raises(ConfigError, match=r"^model.input_feeding: has no effect \(acts only with attention"):
        load_config(None, "lstm", ["model.input_feeding=true"])
    with pytest.raises(ConfigError, match=r"^model.attention: has no effect \(an LSTM setting"):
        load_config(None, None, ["model.attention=dot"])
    # A local window's width, without a local window; a window without attention.
    with pytest.raises(ConfigError) as info:
        load_config(None, "lstm-luong-dot", ["model.attention_width=3"])
    assert str(info.value) == (
        "model.attention_width: has no effect (acts only with a local window; model.attention_window is global)"
    )
    with pytest.raises(ConfigError, match=r"^model.attention_window: has no effect \(acts only with"):
        load_config(None, "lstm", ["model.attention_window=local-p"])
    with pytest.raises(ConfigError, match=r"^model.attention_width: has no effect \(an LSTM setting"):
        load_config(None, None, ["model.attention_width=3"])
    local = ["model.attention_window=local-p", "model.attention_width=3"]
    assert load_config(None, "lstm-luong-dot", local).model.attention_width == 3
    # What the preset sets is not the user's doing; a key the model reads is always welcome.
    assert load_config(None, "lstm-luong-dot", ["model.input_feeding=false"]).model.input_feeding is False


# A value other than the default for every key a model may ignore.
CHANGED = {"cell": "gru", "bidirectional": False, "attention": "dot", "attention_query": "current",
           "input_feeding": True, "attention_heads": 2, "attention_window": "local-m", "attention_width": 3,
           "heads": 2, "key_dim": 4, "d_ff": 8, "scale": "none", "score": "cosine", "pos_encoding": "rope",
           "pos_base": 100.0, "pos_init": "embedding", "t5_buckets": 8, "t5_max_distance": 9, "residual": False, "ffn": True, "norm": "pre",
           "causal_mask": False, "cross_attention": False, "decoder_self_attention": False,
           "embed_scale": False, "qkv_projections": False, "max_positions": 9, "encoder": "embedding",
           "pooling": "max", "tie_embeddings": True, "layers": 2, "doubly_stochastic": 0.5}  # fmt: skip


@pytest.mark.parametrize(
    "model",
    [
        {"arch": "lstm"},
        {"arch": "lstm", "attention": "dot"},
        {"arch": "transformer", "ffn": False, "pos_encoding": "alibi"},
        {"arch": "transformer", "decoder_self_attention": False},
        {"arch": "classifier", "pooling": "attention", "attention": "additive"},
        {"arch": "classifier", "encoder": "transformer", "pooling": "last"},
        {"arch": "classifier", "encoder": "embedding", "pooling": "attention", "attention": "dot"},
        {"arch": "captioner"},
        {"arch": "captioner", "attention": "dot"},
        {"arch": "captioner", "attention": "uniform"},
        {"arch": "lstm", "attention": "uniform"},
    ],
    ids=[
        "lstm",
        "lstm-attention",
        "transformer-no-ffn-alibi",
        "transformer-no-decoder-self-attention",
        "classifier-lstm-attention",
        "classifier-transformer-last",
        "classifier-embedding-attention",
        "captioner",
        "captioner-attention",
        "captioner-uniform",
        "lstm-uniform",
    ],  # fmt: skip
)
def test_a_key_the_model_ignores_changes_nothing_it_computes(model):
    cfg = ModelConfig(d_model=16, layers=1, dropout=0.0, **model)
    src, tgt = torch.randint(1, 12, (2, 6)), torch.randint(1, 12, (2, 5))

    def built(config: ModelConfig) -> tuple[dict, torch.Tensor]:
        torch.manual_seed(0)
        net = build_model(config, 12, 12).eval()
        return net.state_dict(), net(src, tgt)

    weights, outputs = built(cfg)
    assert set(cfg.ignored_keys()) <= set(CHANGED)
    for key in cfg.ignored_keys():
        changed = ModelConfig(**{**cfg.model_dump(), key: CHANGED[key]})
        assert changed.effective() == cfg.effective(), key
        other_weights, other_outputs = built(changed)
        assert other_weights.keys() == weights.keys(), key
        assert all(torch.equal(other_weights[name], w) for name, w in weights.items()), key
        assert torch.equal(other_outputs, outputs), key


def test_pos_init_is_refused_where_no_learned_positions_are():
    with pytest.raises(ConfigError) as info:
        load_config(None, None, ["model.pos_init=embedding"])
    assert str(info.value) == "model.pos_init: has no effect (acts only on learned positions, not sinusoidal)"
    with pytest.raises(
        ConfigError, match=r"^model.pos_init: has no effect \(acts only on learned positions, not t5"
    ):
        load_config(None, None, ["model.pos_encoding=t5", "model.pos_init=embedding"])
    with pytest.raises(ConfigError, match=r"^model.pos_init: has no effect \(a Transformer setting"):
        load_config(None, "lstm", ["model.pos_init=embedding"])
    for kind in ("learned", "alibi+learned", "rope+learned"):
        overrides = [f"model.pos_encoding={kind}", "model.pos_init=embedding"]
        assert load_config(None, None, overrides).model.pos_init == "embedding"
    assert error_of({}, {"model.pos_init": "large"}).startswith(
        "model.pos_init: Input should be 'small' or 'embedding'"
    )


def test_max_positions_is_ignored_unless_something_reads_it():
    assert "max_positions" in ModelConfig(arch="transformer").ignored_keys()
    assert "max_positions" not in ModelConfig(arch="transformer", pos_encoding="learned").ignored_keys()
    # QKNorm's learned factor starts from it (log2(L² − L), L = max_positions).
    assert "max_positions" not in ModelConfig(arch="transformer", score="cosine").ignored_keys()


def test_a_key_width_needs_the_projections_that_make_it():
    with pytest.raises(ConfigError, match=r"^model.key_dim: needs qkv_projections"):
        load_config(None, None, ["model.key_dim=4", "model.qkv_projections=false"])
    with pytest.raises(ConfigError, match=r"^model.key_dim: has no effect \(a Transformer setting"):
        load_config(None, "lstm", ["model.key_dim=4"])
    assert load_config(None, None, ["model.key_dim=4"]).model.d_k == 4
    assert load_config(None, None, ["model.d_model=32", "model.heads=4"]).model.d_k == 8


# Numbers whose range is their metric's, checked with the study (harness/study/validate.py): finite here.
RANGED_BY_METRIC = {"StudySpec.claims[].margin", "StudySpec.claims[].chance", "StudySpec.judge_from.value"}


def numeric_fields_without_bounds() -> list[str]:
    """Every int or float the study schema and the config take, lacking a lower or an upper bound."""
    from ablate.models.bounds import unbounded
    from ablate.schema.spec import StudySpec

    return unbounded(ExperimentConfig, "ExperimentConfig") + unbounded(StudySpec, "StudySpec")


def test_every_number_of_the_schema_has_both_ends():
    assert sorted(set(numeric_fields_without_bounds()) - RANGED_BY_METRIC) == []


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({"judge_from": {"metric": "test/seq_acc", "value": 5.0}},
         "judge_from.value: 5 is outside test/seq_acc's range [0, 1]"),
        ({"judge_from": {"metric": "test/seq_acc", "value": float("nan")}}, "judge_from.value: Input should be a finite number"),
        ({"judge_from": {"metric": "test/seq_acc", "value": float("inf")}}, "judge_from.value: Input should be a finite number"),
        ({"claims": [{"text": "t", "compare": {"model.norm": "pre"}, "to": {"model.norm": "post"}, "expect": "lower",
                      "chance": -0.5}]}, "claims[0].chance: -0.5 is outside test/seq_acc's range [0, 1]"),
        ({"tune": {"params": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "seeds": 10**9}},
         "tune.seeds: Input should be less than or equal to 1000"),
    ],
)  # fmt: skip
def test_levels_and_counts_outside_their_range_are_refused_up_front(tmp_path, extra, problem):
    from ablate.harness.study.validate import load_study

    tree = {"name": "s", "seeds": [0, 1], "metric": {"name": "test/seq_acc", "direction": "maximize"},
            "base": {"task": {"name": "reverse"}}, "factors": {"model.norm": ["pre", "post"]}, **extra}  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as refused:
        load_study(path, read_data=False)
    assert problem in str(refused.value)
