"""Hostile input refused before the first trial: every value, reference, name and path is checked up front,
a failing study lists all its problems with their YAML locations, and operating-system errors become one
line. In-process checks first (fast); then the installed `ablate` script, permission cases in a process
without CAP_DAC_OVERRIDE so they bite when the tests run as root."""

from __future__ import annotations

import errno
import math
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, ablate_exe
from typer.testing import CliRunner

from ablate.cli import app, error_line, main
from ablate.harness.launchers import local
from ablate.harness.study.storage import masked_url, open_storage
from ablate.harness.study.validate import (
    MAX_TRIALS,
    StudyError,
    judging_problems,
    load_study,
    run_problems,
    trial_count,
)
from ablate.schema.config import ExperimentConfig, accepted_values, build_config, read_yaml
from ablate.schema.errors import ConfigError, RunFailed
from ablate.schema.names import MAX_FOLDER_BYTES, slugify
from ablate.schema.spec import ClaimSpec, StudySpec

FLAT = ExperimentConfig().flat()
FLOAT_KEYS = [k for k, v in FLAT.items() if isinstance(v, float)] + ["train.max_time"]
INT_KEYS = [k for k, v in FLAT.items() if isinstance(v, int) and not isinstance(v, bool)]


def base(**extra) -> dict:
    return {"preset": "transformer", "task": dict(TINY_TASK), "model": dict(TINY_MODEL),
            "train": dict(TINY_TRAIN), **extra}  # fmt: skip


def study(folder: Path, text: str | None = None, **tree) -> Path:
    path = folder / "study.yaml"
    path.write_text(text if text is not None else yaml.safe_dump({"name": "h", "base": base(), **tree}))
    return path


def problems_of(path: Path, **kwargs) -> list[str]:
    with pytest.raises(StudyError) as e:
        load_study(path, **kwargs)
    return e.value.lines


# Config values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_key_refuses_nan_and_infinity(key, value):
    with pytest.raises(ConfigError, match=f"^{key}: Input should be a finite number"):
        build_config({}, {key: value})


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [True, False, 8.0, "8"])
def test_every_int_key_is_strict(key, value):
    with pytest.raises(ConfigError, match=f"^{key}: Input should be a valid integer \\(got {value!r}\\)"):
        build_config({}, {key: value})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("train.lr", 0.0, "Input should be greater than 0"), ("train.lr", -1e-3, "Input should be greater than 0"),
        ("train.weight_decay", -0.1, "Input should be greater than or equal to 0"), ("train.warmup_steps", -1, "Input should be greater than or equal to 0"),
        ("train.max_steps", 0, "Input should be greater than or equal to 1"), ("train.max_epochs", 0, "Input should be greater than or equal to 1"),
        ("train.max_epochs", -3, "Input should be greater than or equal to 1"), ("train.max_time", 0.0, "Input should be greater than 0"),
        ("train.max_time", -5.0, "Input should be greater than 0"), ("train.grad_clip", 0.0, "Input should be greater than 0"),
        ("train.label_smoothing", 1.0, "Input should be less than 1"), ("model.dropout", -0.1, "Input should be greater than or equal to 0"),
        ("seed", -1, "Input should be greater than or equal to 0"), ("seed", 2**32, "Input should be less than 4294967296"),
        ("task.n_valid", 0, "Input should be greater than or equal to 1"), ("model.d_model", 0, "Input should be greater than or equal to 1"),
    ],
)  # fmt: skip
def test_each_key_has_its_range(key, value, message):
    with pytest.raises(ConfigError, match=f"^{key}: {message} \\(got {value!r}\\)"):
        build_config({}, {key: value})


def test_edges_of_the_ranges_are_accepted():
    cfg = build_config({}, {"seed": 2**32 - 1, "train.warmup_steps": 0, "train.max_time": 0.5,
                            "train.grad_clip": None, "train.weight_decay": 0.0})  # fmt: skip
    assert (cfg.seed, cfg.train.max_time, cfg.train.grad_clip) == (2**32 - 1, 0.5, None)


def test_ablate_list_shows_each_keys_range_from_the_schema():
    ranges = accepted_values()
    assert set(ranges) == set(FLAT)
    assert ranges["train.lr"] == "number > 0, <= 1000000"
    assert ranges["seed"] == "integer >= 0, < 4294967296"
    assert ranges["train.max_epochs"] == "integer >= 1, <= 1000000000, or unset"
    assert ranges["model.dropout"] == "number >= 0, < 1"
    assert ranges["model.norm"].startswith("post | pre")
    proc = ablate("list", env={"COLUMNS": "200"})  # wide enough that no cell wraps
    assert proc.returncode == 0
    row = next(line for line in proc.stdout.splitlines() if "train.max_time" in line)
    assert "number > 0, <= 31622400, or unset" in row


class StopBeforeTheFirstStep(L.Callback):
    def on_train_start(self, trainer, module) -> None:
        trainer.should_stop = True


def test_a_trial_that_ran_no_optimizer_step_fails(single_thread):
    from ablate.harness.trial import run_trial

    cfg = build_config(base())
    with pytest.raises(RunFailed, match="no optimizer step ran"):
        run_trial(cfg, callbacks=[StopBeforeTheFirstStep()])


# Study files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, line, key",
    [
        ("name: a\nseeds: [0]\nname: b\n", 3, "name"),
        ("name: a\nbase:\n  train:\n    lr: 0.1\n    lr: 0.2\n", 5, "lr"),
        ("name: a\nclaims:\n  - {text: t, compare: {}, to: {}, expect: lower, text: u}\n", 3, "text"),
        ("name: a\nfactors:\n  model.norm: [pre]\n  model.norm: [post]\n", 4, "model.norm"),
    ],
)
def test_a_key_given_twice_is_an_error_naming_its_line(tmp_path, text, line, key):
    path = study(tmp_path, text)
    with pytest.raises(ConfigError, match=f"study.yaml:{line}: .*duplicate key '{key}'"):
        read_yaml(path)


@pytest.mark.parametrize(
    "factor, values, same",
    [
        ("train.lr", [0.001, 1e-3], "0.001 and 0.001"),
        ("model.norm", ["pre", "post", "pre"], "'pre' and 'pre'"),
        ("model.tie_embeddings", [True, 1], "True and 1"),
        ("task.name", ["copy", "reverse", "copy"], "'copy' and 'copy'"),
    ],
)
def test_factor_values_that_build_the_same_config_are_an_error(tmp_path, factor, values, same):
    lines = problems_of(study(tmp_path, factors={factor: values}))
    assert any(f"factors.{factor}: {same} build the same config" in line for line in lines), lines


def test_named_variants_that_build_the_same_config_are_an_error(tmp_path):
    variants = {"a": {"model.norm": "pre"}, "b": {"preset": "transformer-pre-ln"}}
    lines = problems_of(study(tmp_path, variants=variants))
    assert lines == [f"{tmp_path / 'study.yaml'}: variants.b: builds the same config as variants.a"]


def test_a_key_a_variants_model_ignores_is_refused_at_its_location(tmp_path):
    # The base's transformer keys are shared: an LSTM variant may ignore them. Its own may not be ignored.
    variants = {"plain": {"preset": "lstm"}, "fed": {"preset": "lstm", "model.input_feeding": True},
                "headed": {"preset": "lstm-bahdanau", "model.heads": 2}}  # fmt: skip
    lines = problems_of(study(tmp_path, variants=variants))
    where = tmp_path / "study.yaml"
    assert lines == [
        f"{where}: variants.fed.model.input_feeding: has no effect (acts only with attention; "
        "model.attention is none)",
        f"{where}: variants.headed.model.heads: has no effect (a Transformer setting; model.arch is lstm)",
    ]  # said once: that plain and fed build one model follows from it


def test_a_grid_crossing_a_key_some_variants_ignore_is_refused_naming_them(tmp_path):
    factors = {"model.attention": ["none", "dot"], "model.input_feeding": [True, False]}
    lines = problems_of(study(tmp_path, base=base(preset="lstm"), factors=factors))
    assert lines == [
        f"{tmp_path / 'study.yaml'}: factors.model.input_feeding: has no effect in "
        "'attention=none,input_feeding=True', 'attention=none,input_feeding=False' (acts only with "
        "attention; model.attention is none); list the variants by name to leave it out where it does nothing",
    ]


def test_variants_that_build_one_model_through_their_presets_are_an_error(tmp_path):
    # Neither writes a key its model ignores, yet without attention the preset's input feeding does nothing.
    variants = {"a": {"preset": "lstm"}, "b": {"preset": "lstm-luong-dot", "model.attention": "none"}}
    lines = problems_of(study(tmp_path, variants=variants))
    assert lines == [
        f"{tmp_path / 'study.yaml'}: variants.b: builds the same model as variants.a "
        "(model.attention_query, model.input_feeding: ignored by this model)"
    ]


def test_a_failing_study_lists_all_its_problems_with_their_locations(tmp_path):
    path = study(
        tmp_path,
        variants={"a": {"model.norm": "pre"}, "b": {"train.max_time": -1.0}, "c": {"model.bogus": 1}},
        seeds=[0, -1, True],
        metric={"name": "test/bleu"},
        claims=[{"text": "t", "compare": {"model.norm": "pre"}, "to": {}, "expect": "lower"}],
    )
    # A study field that does not parse (the seed True) does not hide the variants' problems: their
    # configs are built from the parts that did parse. The metric and claim need the whole study.
    assert problems_of(path) == [
        f"{path}: seeds[1]: Input should be greater than or equal to 0 (got -1)",
        f"{path}: seeds[2]: Input should be a valid integer (got True)",
        f"{path}: variants.c.model.bogus: unknown config key",
        f"{path}: variants.b.train.max_time: Input should be greater than 0 (got -1.0)",
    ]
    # An unknown key does not hide the other variants' problems, nor the seeds'.
    path = study(tmp_path, variants={"a": {"model.norm": "pre"}, "b": {"train.max_time": -1.0},
                                     "c": {"model.bogus": 1}}, seeds=[0, -1])  # fmt: skip
    assert problems_of(path) == [
        f"{path}: seeds[1]: Input should be greater than or equal to 0 (got -1)",
        f"{path}: variants.c.model.bogus: unknown config key",
        f"{path}: variants.b.train.max_time: Input should be greater than 0 (got -1.0)",
    ]
    path = study(tmp_path, variants={"a": {"model.norm": "pre"}, "b": {"train.max_time": -1.0},
                                     "c": {"train.lr": math.inf}}, seeds=[0, -1, 2**32])  # fmt: skip
    assert problems_of(path) == [
        f"{path}: seeds[1]: Input should be greater than or equal to 0 (got -1)",
        f"{path}: seeds[2]: Input should be less than 4294967296 (got 4294967296)",
        f"{path}: variants.b.train.max_time: Input should be greater than 0 (got -1.0)",
        f"{path}: variants.c.train.lr: Input should be a finite number",
    ]
    # Several problems of one variant are each listed, not the first with a count.
    path = study(tmp_path, variants={"a": {"model.heads": 3, "train.lr": -1.0}, "b": {"model.norm": "post"}})
    assert problems_of(path) == [
        f"{path}: variants.a.model.heads: must divide d_model=16 (got heads=3)",
        f"{path}: variants.a.train.lr: Input should be greater than 0 (got -1.0)",
    ]


def test_a_claim_that_does_not_parse_leaves_the_configs_checked_and_a_bad_grid_adds_nothing(tmp_path):
    claims = [{"text": "t", "compare": {"model.heads": 1}, "to": {"model.heads": 4}, "expect": "sideways"}]
    path = study(tmp_path, base={**base(), "model": {"d_modle": 64}}, factors={"model.heads": [1, 4]},
                 fixed={"train.lr": -1.0}, claims=claims)  # fmt: skip
    assert problems_of(path) == [
        f"{path}: claims[0].expect: Input should be 'lower', 'higher', 'similar' or 'not_worse' (got 'sideways')",
        f"{path}: base.model.d_modle: unknown config key",
        f"{path}: fixed.train.lr: Input should be greater than 0 (got -1.0)",
    ]
    # The grid itself does not parse: no variant can be built, so nothing is said of their configs.
    path = study(tmp_path, base={**base(), "model": {"d_modle": 64}}, factors=["model.heads"], claims=claims)
    assert [line.split(": ")[1] for line in problems_of(path)] == ["factors", "claims[0].expect"]


@pytest.mark.parametrize(
    "seeds, problem",
    [
        ({"min": 2, "max": 2**32 + 1}, "seeds.max: Input should be less than or equal to 100000 (got 4294967297)"),
        ({"min": True, "max": 4}, "seeds.min: Input should be a valid integer (got True)"),
        ({"min": 2, "max": 4.0}, "seeds.max: Input should be a valid integer (got 4.0)"),
    ],
)
def test_adaptive_seeds_are_checked_too(tmp_path, seeds, problem):
    path = study(tmp_path, variants={"a": {"model.norm": "pre"}, "b": {"model.norm": "post"}}, seeds=seeds)
    assert problems_of(path, max_trials=None) == [f"{path}: {problem}"]


@pytest.mark.parametrize(
    "space, problem",
    [
        ({"uniform": [0, 100]}, "uniform: the key takes integers (strictly); use int: [low, high]"),
        ({"int": [0, 2.5]}, "int: bounds must be integers (got [0, 2.5])"),
        ({"int": [-5, 3]}, "-5 makes an invalid config (train.warmup_steps: Input should be greater than or"),
    ],
)
def test_a_tuned_integer_key_gets_integers_in_its_range(tmp_path, space, problem):
    path = study(
        tmp_path, factors={"model.norm": ["pre", "post"]}, tune={"params": {"train.warmup_steps": space}}
    )
    (line,) = problems_of(path)
    assert line.startswith(f"{path}: tune.params.train.warmup_steps: {problem}"), line


@pytest.mark.parametrize(
    "tree, location",
    [
        (
            {"factors": {"train.max_epochs": [1, 0]}},
            "factors.train.max_epochs: Input should be greater than or equal to 1 (got 0)",
        ),
        ({"fixed": {"train.lr": math.nan}}, "fixed.train.lr: Input should be a finite number"),
        ({"budget": {"train.max_time": 0}}, "budget.train.max_time: Input should be greater than 0 (got 0)"),
        (
            {"base": base(train={"warmup_steps": -2})},
            "base.train.warmup_steps: Input should be greater than or equal to 0 (got -2)",
        ),
    ],
)
def test_each_bad_value_names_the_section_it_came_from(tmp_path, tree, location):
    path = study(tmp_path, **{"factors": {"model.norm": ["pre", "post"]}, **tree})
    assert f"{path}: {location}" in problems_of(path)


@pytest.mark.parametrize(
    "task, preset, metric, ok",
    [
        ("reverse", "transformer", "test/bleu", False),
        ("synth_mt", "transformer", "test/bleu", True),
        ("reverse", "lstm", "test/aer", False),  # no attention, no alignment
        ("reverse", "lstm-bahdanau", "test/aer", True),
        ("addition", "transformer", "test/aer", False),  # no gold alignments
        ("reverse", "lstm-bahdanau", "test/rank_collapse_encoder", False),
        ("reverse", "transformer", "test/rank_collapse_encoder", True),
        ("reverse", "transformer", "valid/seq_acc", False),  # the split is called val
        ("reverse", "transformer", "val/seq_acc", True),
    ],
)
def test_the_study_metric_is_one_every_variant_reports(tmp_path, task, preset, metric, ok):
    sizes = {key: value for key, value in TINY_TASK.items() if key != "vocab_size"}  # synth_mt reads none
    tree = base(preset=preset, task={**sizes, "name": task, "min_len": 5, "max_len": 5, "test_max_len": 6})
    path = study(tmp_path, base=tree, metric={"name": metric})
    if ok:
        load_study(path)
    else:
        (line,) = problems_of(path)
        assert line.startswith(f"{path}: metric.name: {metric!r} is not reported by variant 'base'")


def test_a_t5_bias_tested_in_buckets_training_never_reaches_is_refused(tmp_path):
    """T5's buckets reach distance 128 (Raffel et al.): trained on short sequences and tested on longer ones,
    the far buckets' bias stays as initialised. The study check reads the task's lengths and says so, with
    the fix; scaled to the training length the same design passes."""
    task = {**TINY_TASK, "name": "reverse", "min_len": 2, "max_len": 6, "test_max_len": 10}
    path = study(tmp_path, base=base(task=task), variants={"t5": {"model.pos_encoding": "t5"}})
    (line,) = problems_of(path)
    assert line == (
        f"{path}: base.model.t5_max_distance: 128 leaves T5 buckets 7-8, 23-24 untrained: sources of up to 11 "
        "positions are tested, training reaches 7; set model.t5_max_distance to at most 7 and model.t5_buckets "
        "to at most 7, so that every longer distance falls in a trained last bucket"
    )
    scaled = {"model.pos_encoding": "t5", "model.t5_max_distance": 6, "model.t5_buckets": 6}
    load_study(study(tmp_path, base=base(task=task), variants={"t5": scaled}))
    # Only the T5 bias reads the keys; elsewhere they are refused as having no effect.
    other = study(tmp_path, base=base(task=task), variants={"rope": {"model.pos_encoding": "rope",
                                                                     "model.t5_buckets": 8}})  # fmt: skip
    assert "model.t5_buckets: has no effect (acts only on the T5 bias, not rope)" in problems_of(other)[0]


def test_a_claim_on_learned_positions_where_training_never_reached_is_refused(tmp_path):
    """Learned position vectors past the training lengths never train: a claim on test_long would judge their
    initial values, the same class of design as a T5 bucket no training distance reaches. Within the training
    lengths, or for a kind with nothing to train, the same claim stands."""
    task = {**TINY_TASK, "name": "reverse", "min_len": 2, "max_len": 6, "test_max_len": 10}
    variants = {pos: {"model.pos_encoding": pos} for pos in ("learned", "sinusoidal")}
    claim = {"text": "t", "expect": "lower", "compare": {"model.pos_encoding": "learned"},
             "to": {"model.pos_encoding": "sinusoidal"}}  # fmt: skip
    path = study(tmp_path, base=base(task=task), variants=variants, claims=[{**claim, "metric": "test_long/tok_acc"}])
    (line,) = problems_of(path)
    assert line == (
        f"{path}: claims[0].metric: test_long/tok_acc reads positions no training example reached, where the "
        "position tables of 'learned' are as initialised"
    )
    load_study(study(tmp_path, base=base(task=task), variants=variants, claims=[{**claim, "metric": "test/tok_acc"}]))
    rope = {"rope": {"model.pos_encoding": "rope"}, "sinusoidal": variants["sinusoidal"]}
    claim = {**claim, "compare": {"model.pos_encoding": "rope"}, "metric": "test_long/tok_acc"}
    load_study(study(tmp_path, base=base(task=task), variants=rope, claims=[claim]))


@pytest.mark.parametrize(
    "task, beyond",
    [
        ({"name": "reverse"}, {"test_long"}),  # generated: test_long starts past max_len
        ({"name": "parallel", "max_tokens": 20}, {"test_long"}),
        ({"name": "parallel", "max_tokens": 20, "long_after": 30}, {"test", "test_long"}),  # RNNsearch-30
        ({"name": "parallel", "max_tokens": 20, "long_after": 10}, {"test_long"}),
        ({"name": "parallel", "long_after": 20}, set()),  # trained on every length
        ({"name": "scan", "split": "length"}, {"test"}),
        ({"name": "scan", "split": "simple"}, set()),
        ({"name": "bible_lm", "max_tokens": 8}, {"test_x2", "test_x4"}),
        ({"name": "bible_lm", "max_tokens": 8, "train_factor": 2}, {"test_x4"}),
    ],
)
def test_the_splits_past_the_training_lengths_are_known_for_every_kind_of_task(task, beyond):
    from ablate.harness.lengths import beyond_training
    from ablate.schema.task_config import TaskConfig

    config = TaskConfig(**task)
    assert {s for s in config.test_splits if beyond_training(config, s)} == beyond


def test_a_positive_control_on_another_task_is_refused(tmp_path):
    """A control shows that the claim's own setting could have seen a difference: one that moves the metric
    on another task says nothing of the claim's (assay sensitivity)."""
    variants = {f"{pos}-{task}": {"model.pos_encoding": pos, "task.name": task}
                for pos in ("none", "sinusoidal") for task in ("sort", "reverse")}  # fmt: skip
    claim = {"text": "t", "expect": "similar", "margin": 0.05,
             "compare": {"model.pos_encoding": "none", "task.name": "sort"},
             "to": {"model.pos_encoding": "sinusoidal", "task.name": "sort"}}  # fmt: skip
    elsewhere = {"compare": {"model.pos_encoding": "none", "task.name": "reverse"},
                 "to": {"model.pos_encoding": "sinusoidal", "task.name": "reverse"}}  # fmt: skip
    path = study(tmp_path, variants=variants, claims=[{**claim, "control": elsewhere}])
    (line,) = problems_of(path)
    assert line == (f"{path}: claims[0].control: runs on another task than the claim: task.name='reverse' "
                    "(the claim's: 'sort'); a positive control runs on the claim's own task and metric")  # fmt: skip
    # The same contrast on the claim's own task is its control.
    own = {side: {**selector, "task.name": "sort"} for side, selector in elsewhere.items()}
    load_study(study(tmp_path, variants=variants, claims=[{**claim, "control": own}]))
    # A claim over both tasks takes a control on either.
    across = {**claim, "compare": {"model.pos_encoding": "none"}, "to": {"model.pos_encoding": "sinusoidal"}}
    load_study(study(tmp_path, variants=variants, claims=[{**across, "control": elsewhere}]))


@pytest.mark.parametrize(
    "claim, problem",
    [
        ({"compare": {"model.arch": "lstm"}, "to": {"preset": "transformer"}}, None),  # arch from preset
        ({"compare": {"preset": "lstm"}, "to": {"model.arch": "transformer"}}, None),
        ({"compare": {"model.arch": "rnn"}, "to": {}}, "claims[0].compare: no variant matches"),
        ({"compare": {"preset": "lstm"}, "to": {"preset": "lstm"}}, "claims[0].to: no variant other than"),
        ({"compare": {"model.heads": 2}, "to": {"model.headz": 2}}, "claims[0].to.model.headz: unknown"),
        ({"compare": {"preset": "lstm"}, "to": {}, "metric": "test/rank_collapse_decoder"},
         "claims[0].metric: 'test/rank_collapse_decoder' is not reported by variant 'rnn'"),
        # A positive control is matched as the claim's own sides are.
        ({"compare": {"preset": "lstm"}, "to": {}, "expect": "similar",
          "control": {"compare": {"model.arch": "rnn"}, "to": {}}}, "claims[0].control.compare: no variant matches"),
        ({"compare": {"preset": "lstm"}, "to": {}, "expect": "similar",
          "control": {"compare": {"preset": "lstm"}, "to": {"model.headz": 2}}},
         "claims[0].control.to.model.headz: unknown"),
    ],
)  # fmt: skip
def test_claims_are_matched_against_the_built_variants(tmp_path, claim, problem):
    variants = {"rnn": {"preset": "lstm"}, "tf": {"preset": "transformer"}}
    path = study(tmp_path, variants=variants, claims=[{"text": "t", "expect": "lower", **claim}])
    if problem is None:
        load_study(path)
    else:
        (line,) = problems_of(path)
        assert line.startswith(f"{path}: {problem}"), line


@pytest.mark.parametrize(
    "claim, problem",
    [
        ({"expect": "lower", "margin": 1.0},
         "claims[0].margin: 1 cannot be met: test/seq_acc lies in [0, 1], so Δ lies within ±1"),
        ({"expect": "similar", "margin": 1.5},
         "claims[0].margin: 1.5 can never fail: test/seq_acc lies in [0, 1], so Δ lies within ±1"),
        ({"expect": "not_worse", "margin": 1.0},
         "claims[0].margin: 1 can never fail: test/seq_acc lies in [0, 1], so Δ lies within ±1"),
        ({"expect": "higher", "margin": 1.0, "metric": "test_long/tok_acc"},
         "claims[0].margin: 1 cannot be met: test_long/tok_acc lies in [0, 1], so Δ lies within ±1"),
        ({"expect": "lower", "margin": 2.0, "versus": {"metric": "test/tok_acc"}},
         "claims[0].margin: 2 cannot be met: test/seq_acc lies in [0, 1], so Δ lies within ±2"),
        ({"expect": "lower", "margin": 0.1, "metric": "test/loss", "versus": {"metric": "test/tok_acc"}},
         "claims[0].versus.metric: judges test/loss as a ratio and test/tok_acc as a difference"),
        ({"expect": "lower", "margin": 0.99}, None),
        ({"expect": "lower", "margin": 5.0, "metric": "test/loss"}, None),  # a ratio: one side 6 times the other
    ],
)  # fmt: skip
def test_a_claim_whose_margin_its_metric_cannot_meet_is_refused(tmp_path, claim, problem):
    variants = {"rnn": {"preset": "lstm"}, "tf": {"preset": "transformer"}}
    sides = {"text": "t", "compare": {"preset": "lstm"}, "to": {"preset": "transformer"}}
    path = study(tmp_path, variants=variants, claims=[{**sides, **claim}])
    if problem is None:
        load_study(path)
    else:
        (line,) = problems_of(path)
        assert line.startswith(f"{path}: {problem}"), line


def test_an_interaction_of_two_metrics_reaches_the_sum_of_their_ranges():
    # Exact match's difference reaches 1 and BLEU's 100, so the interaction's reaches 101.
    spec = SimpleNamespace(metric=SimpleNamespace(name="test/seq_acc"))
    claim = {"text": "t", "compare": {}, "to": {}, "expect": "lower", "versus": {"metric": "test/bleu"}}
    assert judging_problems("claims[0]", ClaimSpec.model_validate({**claim, "margin": 5.0}), spec) == []
    assert judging_problems("claims[0]", ClaimSpec.model_validate({**claim, "margin": 101.0}), spec) == [
        ("claims[0].margin", "101 cannot be met: test/seq_acc lies in [0, 1] and test/bleu lies in [0, 100], "
         "so Δ lies within ±101")
    ]  # fmt: skip


def corpus_study(folder: Path, corpus: str) -> Path:
    task = {"name": "parallel", "path": str(folder / corpus), "n_valid": 2, "n_test": 2}
    return study(
        folder, variants={"a": {}, "b": {"task.path": str(folder / "other.tsv")}}, base=base(task=task)
    )


PAIRS = "".join(f"w{i} x\tx w{i}\n" for i in range(40))


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "no such file"),
        ("a b\tb a\nc d\n", "c.tsv:2: expected source<TAB>target, found no tab"),
        (b"a\ta\n" + "caf\xe9\tcaf\xe9\n".encode("latin-1"), "c.tsv:2: not UTF-8 text"),
        ("a\tb\nc\td\n", "too few pairs for every split (train 2, valid 0, test 0)"),
        ('{"x": 1}\n', "expected source<TAB>target"),
    ],
)
def test_corpora_are_read_and_split_before_anything_runs(tmp_path, content, problem):
    (tmp_path / "other.tsv").write_text(PAIRS)
    if content is not None:
        (tmp_path / "c.tsv").write_bytes(content if isinstance(content, bytes) else content.encode())
    (line,) = problems_of(corpus_study(tmp_path, "c.tsv"))
    assert line.startswith(f"{tmp_path / 'study.yaml'}: base.task.path: ") and problem in line, line
    (tmp_path / "c.tsv").write_text(PAIRS)
    (tmp_path / "other.tsv").write_text("no tab\n")
    (line,) = problems_of(corpus_study(tmp_path, "c.tsv"))
    assert line.startswith(f"{tmp_path / 'study.yaml'}: variants.b.task.path: "), line


@pytest.mark.parametrize("values_per_factor, factors", [(4, 10), (10, 6), (101, 2)])
def test_a_grid_above_the_limit_is_refused_at_once(tmp_path, values_per_factor, factors):
    keys = ["train.lr", "train.weight_decay", "model.dropout", "train.label_smoothing", "train.length_penalty",
            "train.max_time", "model.pos_base", "train.grad_clip", "task.n_train", "task.n_valid"]  # fmt: skip
    grid = {key: [0.1 + i for i in range(values_per_factor)] for key in keys[:factors]}
    path = study(tmp_path, factors=grid, seeds=[0])
    started = time.monotonic()
    (line,) = problems_of(path, max_trials=MAX_TRIALS)
    assert time.monotonic() - started < 2  # the grid is counted, not enumerated
    count = values_per_factor**factors
    assert (
        line
        == f"{path}: factors: {count:,} trials (variants x seeds) exceed 10,000; pass --allow-large to run them"
    )
    assert trial_count(StudySpec.model_validate(yaml.safe_load(path.read_text()))) == count


# Names, URLs, the command line --------------------------------------------------------------------------


def test_distinct_names_never_share_a_folder():
    names = ["team/x", "team_x", "team x", "team:x", "🙂", "🙃", "", "_x", "x_", ".x", "x" * 300,
             "x" * 301, "x" * 200, "x" * 201, "é", "e", "a/b/../c", "CON", "quickstart"]  # fmt: skip
    folders = [slugify(n) for n in names]
    assert len(set(folders)) == len(names)
    assert all(
        0 < len(f.encode()) <= MAX_FOLDER_BYTES and "/" not in f and f not in (".", "..") for f in folders
    )
    # Names safe as they are keep their folder, so existing runs/ folders stay where they were.
    for safe in ("quickstart", "positional-cpu", "pos_encoding=none,norm=pre", "x" * 200, "CON"):
        assert slugify(safe) == safe
    assert slugify("team/x").startswith("team_x+") and slugify("🙂").startswith("study+")


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql+psycopg2://ann:s3cret@db:5432/ablate", "postgresql+psycopg2://ann:***@db:5432/ablate"),
        ("mysql://root:p%40ss@h/x", "mysql://root:***@h/x"),
        ("postgresql+psycopg2://ann@db/ablate", "postgresql+psycopg2://ann@db/ablate"),
        ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
    ],
)
def test_storage_urls_are_shown_with_the_password_masked(url, shown):
    assert masked_url(url) == shown


def test_a_storage_error_masks_the_password():
    with pytest.raises(ConfigError) as e:
        open_storage("postgresql+psycopg2://ann:s3cret@127.0.0.1:9/ablate")
    assert "s3cret" not in str(e.value) and "ann:***@127.0.0.1:9" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, env, problem",
    [
        ({"storage": "mysql://u:pw@h/db"}, None, ("--storage", "mysql://u:***@h/db: the driver for mysql")),
        ({"storage": "nosuchdb://x"}, None, ("--storage", "nosuchdb://x: unknown database 'nosuchdb'")),
        ({"storage": "not a url"}, None, ("--storage", "not a url: not a database URL")),
        ({"wandb": "bogus"}, None, ("--wandb", "expected online, offline or disabled (got 'bogus')")),
        ({}, "sometimes", ("WANDB_MODE", "expected online, offline or disabled (got 'sometimes'")),
        ({"out": Path("/dev/null")}, None, ("--out", "/dev/null: not a folder")),
        ({"out": Path("/dev/null/runs")}, None, ("--out", "/dev/null: not a folder")),
    ],
)
def test_command_line_problems(monkeypatch, kwargs, env, problem):
    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    ((where, message),) = run_problems(**kwargs)
    assert where == problem[0] and message.startswith(problem[1]), message


def symlink_loop(folder: Path) -> Path:
    """A symbolic link to itself: the system refuses every path through it (ELOOP)."""
    (folder / "loop").symlink_to("loop")
    return folder / "loop"


@pytest.mark.parametrize(
    "out, problem",
    [
        (lambda d: symlink_loop(d) / "runs", "{out}: too many levels of symbolic links"),
        (lambda d: symlink_loop(d), "{out}: too many levels of symbolic links"),
        (lambda d: d / ("n" * 300) / "runs", "{out}: file name too long"),
        (lambda d: Path(*[str(d), *["d"] * 3000]), "{out}: file name too long"),  # past PATH_MAX
        (lambda d: d / "file" / "runs", f"{{d}}{os.sep}file: not a folder"),
    ],
    ids=["under-a-loop", "a-loop", "a-name-too-long", "a-path-too-long", "under-a-file"],
)
def test_an_out_the_system_refuses_to_look_at_is_one_problem_naming_it(tmp_path, out, problem):
    (tmp_path / "file").write_text("")
    path = out(tmp_path)
    assert run_problems(out=path) == [("--out", problem.format(out=path, d=tmp_path))]


@pytest.mark.parametrize("devices, says", [("a,b", "expected GPU indices like 0,1 (got 'a,b')"),
                                           (",", "expected GPU indices like 0,1")])  # fmt: skip
def test_devices_that_name_no_gpu_are_refused_by_the_local_launcher(devices, says, tmp_path):
    ((where, message),) = local.problems(local.Options(devices=devices), None, tmp_path)
    assert where == "--devices" and message.startswith(says), message


def test_a_gpu_torch_cannot_see_is_refused():
    visible = torch.cuda.device_count()
    ((where, message),) = local.problems(local.Options(devices=f"0,{visible}"), None, Path("runs"))
    assert where == "--devices" and message.startswith(f"no GPU {'0, ' if not visible else ''}{visible}: ")


@pytest.mark.parametrize(
    "error, code, line",
    [
        (PermissionError(errno.EACCES, "Permission denied", "/x/s.yaml"), 2, "/x/s.yaml: permission denied"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/f/runs"), 2, "/f/runs: not a folder"),
        (OSError(errno.ENAMETOOLONG, "File name too long", "/x/y"), 2, "/x/y: file name too long"),
        (OSError(errno.ENOSPC, "No space left on device", "/runs/a"), 1, "/runs/a: no space left on device"),
        (OSError(errno.ENOSPC, "No space left on device"), 1, "no space left on device"),
        (
            ConfigError("train.lr: Input should be greater than 0"),
            2,
            "train.lr: Input should be greater than 0",
        ),
        (RunFailed("no optimizer step ran"), 1, "no optimizer step ran"),
    ],
)
def test_errors_become_one_line_with_the_exit_code_of_their_kind(error, code, line):
    assert error_line(error) == (code, line)
    assert error_line(ZeroDivisionError()) is None  # a bug keeps its traceback


# Through the installed script ---------------------------------------------------------------------------


def assert_refused(proc: subprocess.CompletedProcess, *lines: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines() == [f"error: {line}" for line in lines], proc.stderr


@pytest.mark.parametrize(
    "value, message",
    [("nan", "Input should be a finite number"), ("inf", "Input should be a finite number"),
     ("-.inf", "Input should be a finite number"), ("0", "Input should be greater than 0 (got 0)")],
)  # fmt: skip
def test_set_a_bad_float_is_refused_naming_the_key(tmp_path, value, message):
    proc = ablate("train", "--set", f"train.lr={value}", "--out", str(tmp_path / "out"))
    assert_refused(proc, f"train.lr: {message}")
    assert not (tmp_path / "out").exists()


def test_sweep_lists_every_problem_and_creates_nothing(tmp_path, monkeypatch):
    path = study(tmp_path, variants={"a": {"train.max_epochs": 0}, "b": {"model.d_model": True}})
    out = tmp_path / "out"
    env_before = os.environ.get("WANDB_MODE")
    monkeypatch.setenv("WANDB_MODE", "bogus")
    proc = ablate("sweep", str(path), "--out", str(out), "--storage", "mysql://u:pw@h/db", "--devices", "x")
    assert env_before != "bogus"
    assert_refused(
        proc,
        f"{path}: variants.a.train.max_epochs: Input should be greater than or equal to 1 (got 0)",
        f"{path}: variants.b.model.d_model: Input should be a valid integer (got True)",
        "--storage: mysql://u:***@h/db: the driver for mysql is not installed (MySQLdb)",
        "WANDB_MODE: expected online, offline or disabled (got 'bogus' from the environment)",
        "--devices: expected GPU indices like 0,1 (got 'x')",  # the local launcher's, after the command's own
    )
    assert not out.exists()


def test_a_large_grid_needs_allow_large(tmp_path):
    grid = {
        "train.lr": [0.001 * (i + 1) for i in range(101)],
        "model.dropout": [0.001 * i for i in range(100)],
    }
    path = study(tmp_path, factors=grid)
    proc = ablate("sweep", str(path), "--out", str(tmp_path / "out"))
    assert_refused(proc, f"{path}: factors: 10,100 trials (variants x seeds) exceed 10,000; "
                         "pass --allow-large to run them")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_corrupted_study_db_is_one_line_for_report_and_sweep(tmp_path):
    path = study(tmp_path, seeds=[0])
    db = tmp_path / "out" / "h" / "study.db"
    db.parent.mkdir(parents=True)
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    with open(db, "r+b") as f:
        f.write(b"\xa5" * 4096)
    line = f"storage sqlite:///{db}: cannot open (file is not a database)"
    assert_refused(ablate("report", "h", "--out", str(tmp_path / "out")), line)
    assert_refused(ablate("sweep", str(path), "--out", str(tmp_path / "out"), "--wandb", "disabled"), line)


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    for command in (["train"], ["sweep", str(study(tmp_path))], ["worker", str(study(tmp_path))]):
        assert_refused(
            ablate(*command, "--out", str(tmp_path / "file")), f"--out: {tmp_path / 'file'}: not a folder"
        )


def test_debug_shows_the_traceback(tmp_path):
    proc = ablate("--debug", "train", "--set", "train.lr=nan", "--out", str(tmp_path / "out"))
    assert (
        proc.returncode == 2
        and "Traceback" in proc.stderr
        and "train.lr: Input should be a finite number" in proc.stderr
    )


@pytest.mark.parametrize(
    "tree, problem",
    [
        ({"name": ""}, "name: must not be empty"),
        ({"name": "x" * 300}, "name: 300 bytes long; a name is at most 200 bytes (UTF-8)"),
        ({"name": "é" * 101}, "name: 202 bytes long; a name is at most 200 bytes (UTF-8)"),
        ({"name": "two\nlines"}, "name: must be one line of printable characters"),
        ({"variants": {"": {"preset": "lstm"}}}, "variants: variant '': must not be empty"),
        ({"variants": {"v" * 201: {}}}, f"variants: variant {'v' * 40!r}: 201 bytes long; a name is at most "
                                        "200 bytes (UTF-8)"),
    ],
)  # fmt: skip
def test_a_name_that_cannot_name_a_studys_outputs_is_refused(tmp_path, tree, problem):
    # A name becomes folders, Optuna study names, W&B groups and the argument its workers get.
    path = study(tmp_path, **tree)
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert (result.exit_code, result.output.splitlines()) == (2, [f"error: {path}: {problem}"])
    assert not (tmp_path / "out").exists()


def test_a_study_or_config_file_above_a_megabyte_is_refused_before_parsing(tmp_path):
    # One line, however the file goes on: an alias bomb past the bound is never expanded.
    path = study(tmp_path)
    with path.open("a") as f:
        f.write("bomb: &a [x, x, x, x, x, x, x, x, x, x]\n" + "#" * 1_000_000 + "\n")
    size = path.stat().st_size
    for command in (["sweep", str(path)], ["train", str(path)]):
        proc = ablate(*command, "--out", str(tmp_path / "out"))
        assert_refused(proc, f"{path}: {size:,} bytes; a config or study file is at most 1,000,000")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_train_that_diverges_fails_with_the_reason(tmp_path, device):
    # As a sweep's trial fails: exit 1 and why, not exit 0 with NaN metrics; on the CPU (GPUs hidden) and on
    # a GPU.
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(base()))
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    out = str(tmp_path / "out")
    proc = ablate("train", str(config), "train.lr=1e6", "--out", out, "--json", env=hidden)
    assert proc.returncode == 1, proc.stderr[-2000:]
    # Checked at the first validation (val_every 2): the first update already made the weights infinite.
    assert proc.stderr.splitlines() == ["error: diverged: train/loss is not finite (by step 2)"]
    assert proc.stdout == ""


CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.06 GiB "
    "is free. Including non-PyTorch memory, this process has 76.10 GiB memory in use. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management\n  (https://pytorch.org/docs/stable/notes)"
)
CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: {}: you tried to allocate {} bytes"
)
NUMPY_OOM = "Unable to allocate 64.0 GiB for an array with shape (8589934592,) and data type float64"


@pytest.mark.parametrize(
    "error, line",
    [
        (torch.cuda.OutOfMemoryError(CUDA_OOM),
         "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
         "3.06 GiB is free"),
        (RuntimeError(CPU_OOM.format("can't allocate memory", 2**33) + ". Error code 12 (Cannot allocate memory)"),
         "CPU out of memory. Tried to allocate 8.00 GiB"),
        (RuntimeError(CPU_OOM.format("not enough memory", 3 * 2**20) + "."),
         "CPU out of memory. Tried to allocate 3.00 MiB"),
        (MemoryError(), "out of memory"),
        (MemoryError(NUMPY_OOM), f"out of memory: {NUMPY_OOM}"),
    ],
    ids=["cuda", "torch-cpu-cant-allocate", "torch-cpu-not-enough", "python", "numpy"],
)  # fmt: skip
def test_out_of_memory_in_train_is_one_line(monkeypatch, capsys, error, line):
    # Raised by a training step, as the allocator raises it, and through the command's own main().
    def out_of_memory(self, batch, batch_idx):
        raise error

    monkeypatch.setattr("ablate.models.module.Seq2SeqModule.training_step", out_of_memory)
    sets = [f"{section}.{key}={value}" for section, keys in (("task", TINY_TASK), ("model", TINY_MODEL),
            ("train", TINY_TRAIN)) for key, value in keys.items()]  # fmt: skip
    monkeypatch.setattr("sys.argv", ["ablate", "train", "--preset", "transformer", *sets, "--json"])
    with pytest.raises(SystemExit) as exit:
        main()
    assert exit.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {line}; a smaller train.batch_size or model needs less"
    ]


def ablate_unprivileged(*args: str, home: Path) -> subprocess.CompletedProcess:
    """`ablate` without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. As root, setpriv drops them and stays root
    rather than becoming another user, who could not reach a checkout in a private home (/root is 0700)."""
    env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "WANDB_MODE": "disabled"}
    exe = ablate_exe()
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, exe, *args], capture_output=True, text=True, timeout=300, env=env)


def test_unreadable_study_file(tmp_path):
    path = study(tmp_path)
    path.chmod(0)
    proc = ablate_unprivileged("sweep", str(path), "--out", str(tmp_path / "out"), home=tmp_path)
    assert_refused(proc, f"{path}: permission denied")
    assert not (tmp_path / "out").exists()


def test_an_out_through_a_symlink_loop_or_an_unsearchable_folder_is_one_line_and_nothing_is_made(tmp_path):
    loop = symlink_loop(tmp_path)
    proc = ablate("sweep", "quickstart", "--out", str(loop / "runs"), cwd=tmp_path)
    assert_refused(proc, f"--out: {loop / 'runs'}: too many levels of symbolic links")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    proc = ablate_unprivileged("sweep", "quickstart", "--out", str(locked / "sub" / "runs"), home=tmp_path)
    assert_refused(proc, f"--out: {locked}: permission denied (not writable)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked", "loop"]


def test_unreadable_corpus_and_unwritable_out_are_listed_together(tmp_path):
    (tmp_path / "other.tsv").write_text(PAIRS)
    (tmp_path / "c.tsv").write_text(PAIRS)
    (tmp_path / "c.tsv").chmod(0)
    path = corpus_study(tmp_path, "c.tsv")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    proc = ablate_unprivileged("sweep", str(path), "--out", str(locked / "runs"), home=tmp_path)
    assert_refused(
        proc,
        f"{path}: base.task.path: {tmp_path / 'c.tsv'}: permission denied",
        f"--out: {locked}: permission denied (not writable)",
    )
    assert list(locked.iterdir()) == []
