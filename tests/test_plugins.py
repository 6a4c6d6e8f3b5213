"""Plug-ins: registry entries from installed packages' entry points (models/plugins.py). A package is
installed here as pip leaves one (a module and its .dist-info with entry_points.txt) on a folder put on
PYTHONPATH, and the console script runs in a process of its own, so the registries load with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate

PACKAGE = '''
from typing import Annotated

from pydantic import Field

from ablate.models.kinds import Family, Norm
from ablate.models.plugins import Settings, settings
from ablate.models.positional import PositionalKind
from ablate.models.transformer_scores import ScoreKind
from ablate.schema.tasks import Task


class QuarterSettings(Settings):
    factor: float = Field(0.25, gt=0.0, le=4.0)


# q·k at a fixed factor (a quarter unless its setting says), whatever d_k: a score none of the built-ins has.
QUARTER = ScoreKind(lambda a, cfg: a.ScaledDotProduct(settings(cfg, "quarter").factor), scale_words=("sqrt",),
                    scale_means="fixed at model.plugin.quarter.factor",
                    reference=lambda score, q, k, cfg: settings(cfg, "quarter").factor * q @ k.transpose(-2, -1))
# A score whose module does not follow the formula it gives: every contract check passes, the reference fails.
SLIP = ScoreKind(lambda a, cfg: a.ScaledDotProduct(0.3), scale_words=("sqrt",), scale_means="fixed at 1/4",
                 reference=lambda score, q, k, cfg: 0.25 * q @ k.transpose(-2, -1))


class EchoSettings(Settings):
    reverse: bool = False  # output = input reversed


class Unset(Settings):
    factor: float  # no default


class Loose(Settings):
    width: int = 3  # no bounds


class Listed(Settings):
    slopes: list[Annotated[float, Field(ge=0.0, le=1.0)]] = [0.5]  # a list: no config could be hashed


class Outside(Settings):
    width: int = Field(0, ge=1, le=5)  # a default its own range refuses


class Mirror(Settings):
    flip: bool = False
# ALiBi's bias on the decoder only, under a name of its own.
MIRROR = PositionalKind(score_bias=lambda layers, cfg, bidirectional: layers.ALiBi(cfg.heads))
RMS_POST = Norm("post", rms=True)
BAG = Family("my_attention.family:BagOfWords", eager=None)
BAG_ALONE = Family("my_attention.family:BagOfWords", fuses=False)  # each seed trains alone, eager
NUMBER = 3


# Planted bugs, for `ablate check` to find: a score whose key j reads key j + 1 (a later or padded one), one
# scaled by how many keys there are (padded ones too), and a positional embedding that adds the mean of the
# whole sequence. (A key plus the sum of every later key would leak nothing: under the mask it shifts each
# visible score of a query by the same amount, which softmax ignores.)
def peek(a, cfg):
    class Peek(a.ScaledDotProduct):
        def key(self, k):
            return k + k.roll(-1, dims=2)  # (B, H, S, d_k)

    return Peek(cfg.scale_factor)


def stretch(a, cfg):
    class Stretch(a.ScaledDotProduct):
        def key(self, k):
            return k * 8 / k.size(2)

    return Stretch(cfg.scale_factor)


def leak(layers, cfg):
    class Leak(layers.NoEncoding.__base__):
        def forward(self, x, offset=0):
            return x + x.mean(dim=1, keepdim=True)

    return Leak()


def explode(a, cfg):
    class Explode(a.ScaledDotProduct):
        def key(self, k):
            return k[..., :1]  # (B, H, S, 1): the wrong width

    return Explode(cfg.scale_factor)


EXPLODE = ScoreKind(explode, scale_words=("sqrt", "none"), scale_means="as dot")
PEEK = ScoreKind(peek, scale_words=("sqrt", "none"), scale_means="as dot")
STRETCH = ScoreKind(stretch, scale_words=("sqrt", "none"), scale_means="as dot")
LEAK = PositionalKind(embedding=leak)
# A task of its own: copying, built by the plug-in's builder (my_attention/tasks.py).
ECHO = Task("my_attention.tasks:build", "output = input, from a plug-in",
            ("min_len", "max_len", "test_max_len", "n_train", "n_valid", "n_test", "vocab_size"), aligned=True)
'''
FAMILY = '''
import contextlib

import torch
from torch import nn

from ablate.models.ensemble import Ensemble


class BagOfWords(nn.Module):
    """A family none of the built-ins is: each target embedding plus the mean of the source's."""

    def __init__(self, cfg, src_vocab, tgt_vocab, pad_id=0, ensemble=1):
        super().__init__()
        self.cfg, self.vocab, self.pad_id = cfg, (src_vocab, tgt_vocab), pad_id
        self.ensemble = ens = Ensemble(ensemble)
        self.src_embed = ens.embedding(src_vocab, cfg.d_model, padding_idx=pad_id)
        self.tgt_embed = ens.embedding(tgt_vocab, cfg.d_model, padding_idx=pad_id)
        self.out = ens.linear(cfg.d_model, tgt_vocab)

    def context(self, src):
        real = (src != self.pad_id).unsqueeze(-1)
        return (self.src_embed(src) * real).sum(1) / real.sum(1).clamp(min=1)  # (B, d)

    def forward(self, src, tgt_in, need_weights=False):
        logits = self.out(torch.tanh(self.tgt_embed(tgt_in) + self.context(src)[:, None]))
        return (logits, {}) if need_weights else logits

    @contextlib.contextmanager
    def record_states(self):
        yield {}

    def init_state(self, src):
        return {"context": self.context(src)}

    def step(self, state, prev):
        return self.out(torch.tanh(self.tgt_embed(prev) + state["context"])), state
'''
TASKS = '''
from ablate.harness.tasks.synthetic import copy_task, reverse_task
from ablate.models.plugins import settings


def build(cfg, seed):
    return (reverse_task if settings(cfg, "echo").reverse else copy_task)(cfg, seed)
'''
ENTRY_POINTS = """
[ablate.score]
quarter = my_attention:QUARTER
dot = my_attention:QUARTER
peek = my_attention:PEEK
explode = my_attention:EXPLODE
stretch = my_attention:STRETCH
badset = my_attention:QUARTER
noset = my_attention:QUARTER
loose = my_attention:QUARTER
listed = my_attention:QUARTER
outside = my_attention:QUARTER
copy = my_attention:QUARTER
slip = my_attention:SLIP

[ablate.pos_encoding]
mirror-alibi = my_attention:MIRROR
broken = my_attention.missing:KIND
leak = my_attention:LEAK

[ablate.arch]
bag = my_attention:BAG
bag-alone = my_attention:BAG_ALONE

[ablate.norm]
rms_post = my_attention:RMS_POST
number = my_attention:NUMBER

[ablate.task]
echo = my_attention:ECHO

[ablate.settings]
quarter = my_attention:QuarterSettings
echo = my_attention:EchoSettings
badset = my_attention:NUMBER
noset = my_attention:Unset
loose = my_attention:Loose
listed = my_attention:Listed
outside = my_attention:Outside
copy = my_attention:Mirror
mirror-alibi = my_attention:Mirror
orphan = my_attention:EchoSettings
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The environment of a process with the package `my-attention` installed."""
    site = tmp_path_factory.mktemp("site")
    (site / "my_attention").mkdir()
    (site / "my_attention" / "__init__.py").write_text(PACKAGE)
    (site / "my_attention" / "tasks.py").write_text(TASKS)
    (site / "my_attention" / "family.py").write_text(FAMILY)
    info = site / "my_attention-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-attention\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "COLUMNS": "250", "WANDB_MODE": "disabled"}


def test_plugins_are_listed_with_their_package_and_faults_said_by_name(installed):
    proc = ablate("list", env=installed)
    assert proc.returncode == 0, proc.stderr
    rows = [" ".join(line.replace("│", " ").split()) for line in proc.stdout.splitlines()]
    assert "model.score quarter my-attention loaded" in rows
    assert "model.norm rms_post my-attention loaded" in rows
    assert "model.pos_encoding mirror-alibi my-attention loaded" in rows
    assert "task.name echo my-attention loaded" in rows
    assert "model.arch bag my-attention loaded" in rows
    said = "\n".join(rows)
    assert "plug-in 'dot' of my-attention (ablate.score = my_attention:QUARTER): the name is taken (built in)" in said
    assert ("plug-in 'broken' of my-attention (ablate.pos_encoding = my_attention.missing:KIND): failed to "
            "import: ModuleNotFoundError") in said  # fmt: skip
    assert "plug-in 'number' of my-attention (ablate.norm = my_attention:NUMBER): is a int, not a Norm" in said
    # The keys accept the loaded names beside the built-in ones.
    assert any(row.startswith("model.score 'dot' dot | cosine | explode | peek | quarter | slip | stretch") for row in rows), rows


def config(tmp_path: Path, **model) -> list[str]:
    sets = {**{f"task.{k}": v for k, v in TINY_TASK.items()}, **{f"model.{k}": v for k, v in TINY_MODEL.items()},
            **{f"train.{k}": v for k, v in TINY_TRAIN.items()}, **{f"model.{k}": v for k, v in model.items()}}  # fmt: skip
    return ["train", *(f"{k}={v}" for k, v in sets.items()), "--out", str(tmp_path / "run"), "--json"]


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_plugged_score_positional_kind_norm_and_task_train_and_clash_with_nothing(installed, tmp_path):
    args = config(tmp_path, score="quarter", pos_encoding="mirror-alibi", norm="rms_post")
    proc = ablate(*args, "task.name=echo", env=installed)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert metrics["test/loss"] > 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["model"]["score"], saved["model"]["pos_encoding"], saved["model"]["norm"]) == (
        "quarter", "mirror-alibi", "rms_post"
    )
    assert saved["task"]["name"] == "echo"
    # The name the plug-in could not take still builds the built-in entry.
    assert ablate(*config(tmp_path / "dot", score="dot"), env=installed).returncode == 0


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_plugged_family_trains_learns_is_checked_and_ignores_the_other_families_switches(installed, tmp_path):
    shared = [f"task.{k}={v}" for k, v in TINY_TASK.items()] + [f"train.{k}={v}" for k, v in TINY_TRAIN.items()]
    args = ["train", "model.arch=bag", "model.d_model=16", "model.dropout=0.0", *shared, "train.val_every=100",
            "task.name=echo", "--json"]  # fmt: skip
    losses = []
    for steps in (1, 200):
        proc = ablate(*args, f"train.max_steps={steps}", "--out", str(tmp_path / f"bag{steps}"), env=installed)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses.append(json.loads(proc.stdout.strip().splitlines()[-1])["test/loss"])
    # A bag of words cannot copy in order, but learns which tokens the output holds.
    assert losses[1] < losses[0] - 0.3, losses
    proc = ablate(*args, "model.heads=2", "--out", str(tmp_path / "heads"), env=installed)
    assert (proc.returncode, proc.stderr.strip()) == (2, "error: model.heads: has no effect (a Transformer setting; model.arch is bag)")
    proc = ablate("check", "model.arch=bag", "model.d_model=16", env=installed)
    assert proc.returncode == 0 and proc.stdout.count(": pass") == 6, proc.stdout + proc.stderr
    assert "reference: not run, no entry of this model gives its formula" in proc.stdout
    # A family that says it does not fuse: not checked fused, refused where a study asks for fusion.
    proc = ablate("check", "model.arch=bag-alone", "model.d_model=16", env=installed)
    assert proc.returncode == 0 and "fused: not run, model.arch=bag-alone does not fuse seeds (its Family says so)" in proc.stdout
    study = tmp_path / "alone.yaml"
    study.write_text(json.dumps({"name": "alone", "base": {"task": dict(TINY_TASK), "model": {"arch": "bag-alone"},
                                                           "train": {**TINY_TRAIN, "fuse_seeds": True}},
                                 "variants": {"bag": {}}, "seeds": [0, 1]}))  # fmt: skip
    proc = ablate("sweep", str(study), "--out", str(tmp_path / "runs"), env=installed)
    said = "train.fuse_seeds: true, but model.arch=bag-alone does not fuse seeds (its Family says so)"
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "model, said",
    [
        ({"pos_encoding": "broken"}, "error: model.pos_encoding: plug-in 'broken' of my-attention "
                                     "(ablate.pos_encoding = my_attention.missing:KIND): failed to import: "
                                     "ModuleNotFoundError: No module named 'my_attention.missing'"),
        ({"norm": "number"}, "error: model.norm: plug-in 'number' of my-attention (ablate.norm = "
                             "my_attention:NUMBER): is a int, not a Norm"),
    ],
)  # fmt: skip
def test_a_config_naming_a_broken_plugin_is_one_line_naming_it(installed, tmp_path, model, said):
    proc = ablate(*config(tmp_path, **model), env=installed)
    assert proc.returncode == 2 and proc.stderr.strip() == said, proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_plugins_settings_are_listed_checked_up_front_and_read_by_the_plugin(installed, tmp_path):
    rows = [" ".join(line.replace("│", " ").split()) for line in ablate("list", env=installed).stdout.splitlines()]
    assert "model.plugin.quarter.factor 0.25 number > 0, <= 4" in rows and "task.plugin.echo.reverse False true | false" in rows
    faults = {"noset": "plug-in 'noset' of my-attention (ablate.settings = my_attention:Unset): settings without a default: factor",
              "badset": "plug-in 'badset' of my-attention (ablate.settings = my_attention:NUMBER): its settings are a int, not a Settings",
              "orphan": "settings 'orphan' of my-attention (ablate.settings = my_attention:EchoSettings): names no plug-in of my-attention",
              "loose": "plug-in 'loose' of my-attention (ablate.settings = my_attention:Loose): a number without both ends in its schema: width",
              "listed": "plug-in 'listed' of my-attention (ablate.settings = my_attention:Listed): a setting that cannot be hashed (a list, dict or set); use a tuple",
              "outside": "plug-in 'outside' of my-attention (ablate.settings = my_attention:Outside): a default its own schema refuses: width:",
              "copy": "plug-in 'copy' of my-attention (ablate.settings = my_attention:Mirror): a plug-in with settings cannot be named 'copy', a name pydantic models keep for their own"}  # fmt: skip
    assert all(any(why in row for row in rows) for why in faults.values()), rows
    # The plug-in reads what the config holds: its score's factor, its task's direction.
    script = """
from ablate.schema.config import load_config
from ablate.models import build_model
from ablate.harness.tasks import build_task
cfg = load_config(None, None, ["model.score=quarter", "model.plugin.quarter.factor=0.5", "model.d_model=16",
                               "model.heads=2", "task.name=echo", "task.plugin.echo.reverse=true"])
print(sorted({m.scale for m in build_model(cfg.model, 12, 12).modules() if type(m).__name__ == "ScaledDotProduct"}))
print(all(ex.tgt == ex.src[::-1] for ex in build_task(cfg.task, 0).splits["train"]))
"""
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, **installed}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.stdout.split() == ["[0.5]", "True"], proc.stderr[-3000:]
    proc = ablate(*config(tmp_path / "set", score="quarter"), "model.plugin.quarter.factor=0.5", env=installed)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "set" / "run" / "config.json").read_text())["model"]["plugin"]["quarter"] == {"factor": 0.5}
    for sets, said in [
        (["model.score=quarter", "model.plugin.quarter.nope=1"], "model.plugin.quarter.nope: unknown config key"),
        (["model.score=quarter", "model.plugin.quarter.factor=-1"], "model.plugin.quarter.factor: Input should be greater than 0 (got -1)"),
        (["model.plugin.quarter.factor=0.5"], "model.plugin.quarter.factor: has no effect (a setting of plug-in quarter, which this model does not use)"),
        (["task.plugin.echo.reverse=true"], "task.plugin.echo.reverse: has no effect (a setting of task echo; task.name is reverse)"),
        (["model.score=noset"], f"model.score: {faults['noset']}"),
        # A plug-in's name with '-' stays in the key an error names.
        (["model.pos_encoding=mirror-alibi", "model.plugin.mirror-alibi.nokey=1"], "model.plugin.mirror-alibi.nokey: unknown config key"),
        (["model.pos_encoding=mirror-alibi", "model.plugin.mirror-alibi.flip=3"], "model.plugin.mirror-alibi.flip: Input should be a valid boolean, unable to interpret input"),
    ]:  # fmt: skip
        proc = ablate(*config(tmp_path / "bad"), *sets, env=installed)
        assert proc.returncode == 2 and f"error: {said}" in proc.stderr.splitlines(), (sets, proc.stderr)
        assert not (tmp_path / "bad").exists()
    # A plug-in named by a key its model ignores is not used: its settings have no effect either.
    lstm = ["train", *(f"task.{k}={v}" for k, v in TINY_TASK.items()), "model.arch=lstm", "model.d_model=16",
            "model.pos_encoding=mirror-alibi", "model.plugin.mirror-alibi.flip=true", "--out", str(tmp_path / "bad")]
    proc = ablate(*lstm, env=installed)
    said = "error: model.plugin.mirror-alibi.flip: has no effect (a setting of plug-in mirror-alibi, which this model does not use) (1 more)"
    assert proc.returncode == 2 and proc.stderr.strip() == said, proc.stderr
    # Written as nested YAML, as by --set: a setting of a plug-in not in use is refused.
    nested = tmp_path / "nested.yaml"
    nested.write_text(json.dumps({"model": {"plugin": {"quarter": {"factor": 0.5}}}}))
    proc = ablate("train", str(nested), "--out", str(tmp_path / "bad"), env=installed)
    said = "error: model.plugin.quarter.factor: has no effect (a setting of plug-in quarter, which this model does not use)"
    assert proc.returncode == 2 and proc.stderr.strip() == said, proc.stderr
    # A study's variants set them as any key, checked before anything is made.
    study = tmp_path / "settings.yaml"
    study.write_text(json.dumps({
        "name": "settings", "base": {"task": dict(TINY_TASK), "model": {**TINY_MODEL, "score": "quarter"}, "train": dict(TINY_TRAIN)},
        "factors": {"model.plugin.quarter.factor": [0.25, 1.0], "model.plugin.quarter.width": [1]}, "seeds": [0]}))  # fmt: skip
    proc = ablate("sweep", str(study), "--out", str(tmp_path / "runs"), env=installed)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {study}: factors.model.plugin.quarter.width: unknown config key"
    assert not (tmp_path / "runs").exists()


def test_without_the_package_a_plugged_name_is_an_unknown_value(tmp_path):
    proc = ablate(*config(tmp_path, score="quarter"), env={"COLUMNS": "250"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: model.score: Input should be 'dot' or 'cosine' (got 'quarter')")


def test_a_plugged_model_trains_fused_as_each_seed_alone(installed):
    """Plug-in parts are built through the same Ensemble as built-in ones: K seeds fused train as each
    alone (tests/test_fused.py's check, run where the package is installed)."""
    tests = Path(__file__).parent
    for switches in ({"score": "quarter", "pos_encoding": "mirror-alibi", "norm": "rms_post"}, {"arch": "bag"}):
        script = (f"import sys; sys.path.insert(0, {str(tests)!r}); import test_fused; "
                  f"test_fused.test_fused_seeds_train_as_each_seed_alone({switches!r}); print('equal')")  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, **installed}, capture_output=True,
                              text=True, timeout=300, cwd=tests.parent)  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip() == "equal", (switches, proc.stderr[-3000:])


@pytest.mark.parametrize(
    "key, value",
    [("model.score", "my_attention:QUARTER"), ("model.pos_encoding", "os:system"), ("task.name", "os:system"),
     ("model.norm", "my_attention.missing:KIND")],
)  # fmt: skip
def test_a_study_file_cannot_name_code_to_import(tmp_path, key, value):
    """Values name registry entries: a module path in a study file is an unknown value, and nothing is
    imported, installed or not (my_attention is importable here, and stays unimported)."""
    site = tmp_path / "site"
    (site / "my_attention").mkdir(parents=True)
    (site / "my_attention" / "__init__.py").write_text("raise SystemExit('imported')\n")
    study = tmp_path / "study.yaml"
    study.write_text(json.dumps({"name": "s", "base": {"task": dict(TINY_TASK), "model": dict(TINY_MODEL),
                                                       "train": dict(TINY_TRAIN)},
                                 "variants": {"v": {key: value}}, "seeds": [0]}))  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    proc = ablate("sweep", str(study), "--out", str(tmp_path / "runs"), env=env)
    assert proc.returncode == 2 and "imported" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.startswith(f"error: {study}: variants.v.{key}: "), proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_study_of_plugged_entries_is_swept_reported_and_judged(installed, tmp_path):
    study = tmp_path / "plugged.yaml"
    study.write_text(json.dumps({
        "name": "plugged", "base": {"task": {**TINY_TASK, "name": "echo"}, "model": dict(TINY_MODEL),
                                    "train": dict(TINY_TRAIN)},
        "variants": {"quarter": {"model.score": "quarter"}, "dot": {"model.score": "dot"},
                     "explode": {"model.score": "explode"}, "bag": {"model.arch": "bag"}},
        "seeds": [0, 1], "baseline": "dot",
        "claims": [{"text": "A quarter scale trains as well as 1/sqrt(d_k).", "compare": {"model.score": "quarter"},
                    "to": {"model.score": "dot"}, "metric": "test/tok_acc", "expect": "higher", "margin": 0.0},
                   {"text": "Attention copies better than a bag of words.", "compare": {"model.score": "dot"},
                    "to": {"model.arch": "bag"}, "metric": "test/tok_acc",
                    "expect": "higher", "margin": 0.0}],
    }))  # fmt: skip
    proc = ablate("sweep", str(study), "--workers", "1", "--out", str(tmp_path / "runs"), env=installed, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "runs" / "plugged" / "report" / "report.md").read_text()
    assert "| quarter |" in report and "| bag |" in report and "A quarter scale trains as well as 1/sqrt(d_k)." in report
    assert "Attention copies better than a bag of words." in report
    assert "2 tests of published findings: 2 " in report, report[:1500]
    # A plug-in that fails while training fails its trials, named with its package; the others ran.
    url = f"sqlite:///{tmp_path / 'runs' / 'plugged' / 'study.db'}"  # read as Optuna stores it: no plug-in here
    failed = [t for t in optuna.load_study(study_name="plugged:eval", storage=url).trials if t.state.name == "FAIL"]
    assert {t.user_attrs["grid_point"].split("/")[0] for t in failed} == {"explode"}
    named = "plug-ins model.score=explode of my-attention, task.name=echo of my-attention: RuntimeError: "
    assert all(t.user_attrs["fail_reason"].startswith(named) for t in failed), failed[0].user_attrs["fail_reason"]


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_ablate_check_passes_each_plugin_that_conforms_and_fails_each_planted_bug(installed):
    proc = ablate("check", "model.score=quarter", "model.pos_encoding=mirror-alibi", "model.norm=rms_post",
                  "model.d_model=16", "model.heads=2", env=installed)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.count(": pass") == 7, proc.stdout + proc.stderr
    for planted, failing in (("model.score=peek", {"padding", "causal mask"}), ("model.score=stretch", {"padding"}),
                             ("model.pos_encoding=leak", {"padding", "causal mask"}), ("model.score=slip", {"reference"})):
        proc = ablate("check", planted, "model.d_model=16", "model.heads=2", env=installed)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        failed = {line.partition(":")[0] for line in proc.stdout.splitlines() if ": FAIL, " in line}
        assert failed == failing, proc.stdout
        said = {"padding": "padding: FAIL, row 0 alone differs from its padded self in the batch at (",
                "causal mask": "causal mask: FAIL, an output before position 3 reads a later target token: at (",
                "reference": "reference: FAIL, score slip differs from its reference at ("}
        assert all(any(line.startswith(said[check]) for line in proc.stdout.splitlines()) for check in failing)
