"""`ablate plan` (harness/study/cost.py, harness/step_cost.py): kernels and FLOPs counted as torch dispatches
them, the device's constants fitted to its measured steps (and how far the held-out one is off), a study's trials grouped as a
GPU runs them (fused per look, tune trials per candidate), and the commands of `--time-limit` it takes.
`ablate sweep --time-limit` itself: test_reliability.py."""

from __future__ import annotations

import importlib.util
import json
from functools import partial

import pytest
import torch
import yaml
from conftest import REPO, TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate
from typer.testing import CliRunner

from ablate.cli import app
from ablate.harness import step_cost
from ablate.harness.signals import STOP_GRACE_S
from ablate.harness.study import cost
from ablate.harness.study.validate import load_study
from ablate.models.config import ModelConfig
from ablate.schema.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def test_a_matmul_is_one_kernel_of_its_flops_and_views_launch_nothing():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    work = step_cost.counted(lambda: (a.t().t() @ b).view(32).relu())
    assert work == step_cost.Work(kernels=2, flops=2 * 8 * 16 * 4)  # mm and relu; two transposes and a view


def test_the_fit_reproduces_its_anchors_and_says_how_far_the_held_out_one_is():
    """The quickstart's steps fix a kernel's time, the profile's two batches the FLOP rate (their difference);
    the profile's own step is then predicted, not fitted."""
    device = step_cost.h100()

    def predicted(name: str) -> float:
        anchor = step_cost.ANCHORS[name]
        work = anchor.work()
        kernel_s = device.captured_kernel_s if anchor.captured else device.eager_kernel_s
        return work.kernels * kernel_s + work.flops / device.flops_per_s

    for name in ("quickstart, eager", "quickstart, captured"):
        assert predicted(name) == pytest.approx(step_cost.ANCHORS[name].seconds, rel=1e-9), name
    one, four = "profile, captured", "profile x4, captured"
    assert predicted(four) - predicted(one) == pytest.approx(
        step_cost.ANCHORS[four].seconds - step_cost.ANCHORS[one].seconds, rel=1e-9
    )
    assert step_cost.HELD_OUT == one and device.held_out == (
        pytest.approx(predicted(one)),
        step_cost.ANCHORS[one].seconds,
    )
    assert abs(device.held_out[0] / device.held_out[1] - 1) < 0.25  # 6.8 ms against 7.9 when this was written
    # A captured kernel costs a tenth of an eager one; fp32 below the H100's 67 TFLOP/s.
    assert device.captured_kernel_s < device.eager_kernel_s / 5
    assert 5e12 < device.flops_per_s < 67e12


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_a_fused_step_of_k_seeds_is_extrapolated_from_two_and_three(arch):
    """A Transformer's fused seeds share every kernel (FLOPs grow, kernels do not); an LSTM's decoder runs
    its K stacks in turn. Either way, two and three seeds predict five."""
    cfg = ModelConfig(arch=arch, d_model=16, layers=1, heads=2, d_ff=32, dropout=0.0, attention="additive")
    tokens = torch.randint(4, 10, (4, 7))
    batch = {"src": tokens[:, 1:], "tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}
    one, two, three, five = (step_cost.step_work(cfg, (10, 10), batch, k) for k in (1, 2, 3, 5))
    counted = cost.Counted(one, two, three, captured=False, validation_s=0.0, test_s=0.0)
    assert counted.step(1) == one and counted.step(5).kernels == five.kernels
    assert counted.step(5).flops == pytest.approx(five.flops, rel=1e-6)
    assert five.flops == pytest.approx(5 * one.flops, rel=0.02)
    if arch == "transformer":
        assert five.kernels == three.kernels == two.kernels
    else:
        assert five.kernels > three.kernels > two.kernels


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_a_batch_counted_on_two_rows_gives_the_whole_batchs_kernels_and_flops(arch):
    cfg = ModelConfig(arch=arch, d_model=16, layers=1, heads=2, d_ff=32, dropout=0.0, attention="general")
    tokens = torch.randint(4, 10, (8, 9))
    tokens[3, 5:] = 0
    batch = {"src": tokens[:, 1:], "tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}
    for seeds in (1, 2):
        whole = step_cost.step_work(cfg, (10, 10), batch, seeds)
        sampled = step_cost.on_rows(partial(step_cost.step_work, cfg, (10, 10), seeds=seeds), batch)
        assert sampled.kernels == whole.kernels and sampled.flops == pytest.approx(whole.flops, rel=1e-9)


def test_an_lstm_layer_over_packed_sequences_is_counted_as_cudnn_runs_it():
    """On a CPU a packed LSTM layer runs position by position; cuDNN runs it whole. Counted as cuDNN runs it,
    an LSTM without attention (its decoder one LSTM call too) launches as many kernels at 30 positions as at 6,
    padded or not, and its FLOPs grow with the length."""
    cfg = ModelConfig(arch="lstm", d_model=16, layers=2, dropout=0.0, attention="none")
    works = []
    for length in (6, 30):
        tokens = torch.randint(4, 10, (4, length + 1))
        tokens[0, length // 2 :] = 0  # a padded row: the encoder packs the batch
        works.append(step_cost.step_work(cfg, (10, 10), {"src": tokens[:, 1:], "tgt_in": tokens[:, :-1],
                                                    "tgt_out": tokens[:, 1:]}, 1))  # fmt: skip
    short, long = works
    assert short.kernels == long.kernels < 300 and long.flops > 4 * short.flops


def tiny_study(tmp_path, task=TINY_TASK, **extra):
    tree = {"name": "tiny", "base": {"preset": "transformer", "task": task, "model": TINY_MODEL,
            "train": {**TINY_TRAIN, "max_steps": 100, "val_every": 50}},
            "metric": {"name": "test/seq_acc"}, **extra}  # fmt: skip
    if "variants" not in tree:
        tree["factors"] = {"model.heads": [1, 2]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_a_study_runs_fused_per_look_and_its_tune_trials_per_candidate(tmp_path):
    spec = load_study(tiny_study(tmp_path, seeds={"min": 2, "max": 4},
                                 tune={"params": {"train.lr": {"log_uniform": [1e-3, 1e-2]}}, "trials": 3,
                                       "seeds": 2}))  # fmt: skip
    found = cost.estimate(spec)
    for variant in ("heads=1", "heads=2"):
        runs = {(g.phase, g.seeds): g for g in found.groups if g.variant == variant}
        # the first look's two seeds fused, then one seed a look; three tune candidates of two seeds each
        assert {k: g.count for k, g in runs.items()} == {("tune", 2): 3, ("eval", 2): 1, ("eval", 1): 2}
        assert all(g.steps == 100 and g.captured for g in runs.values())
        assert runs["eval", 2].step_s >= runs["eval", 1].step_s > 0
        assert runs["eval", 2].test_s == pytest.approx(2 * runs["eval", 1].test_s)
    assert found.total_s == pytest.approx(
        step_cost.WORKER_S
        + 2 * cost.GRAPHS * step_cost.COMPILE_S
        + sum(g.count * g.run_s for g in found.groups)
    )
    assert found.parts(500) == 1
    with pytest.raises(ConfigError, match="--time-limit 60: leaves nothing to train"):
        found.parts(60)


@pytest.mark.parametrize(
    ("preset", "task", "captured"),
    [("lstm-bahdanau", TINY_TASK, False), ("classifier-additive", {**TINY_TASK, "name": "cues", "max_len": 8}, False),
     ("captioner-soft", {"name": "digits", "min_len": 1, "max_len": 2, "n_train": 32, "n_valid": 8, "n_test": 8},
      True)],
)  # fmt: skip
def test_every_family_is_priced_fused_and_alone(tmp_path, preset, task, captured):
    """The LSTM's decoder runs step by step, eager (its encoder packs by lengths read on the host); a
    classifier decodes one label; a captioner reads an image, its step compiled whole: each is counted through
    its own step functions and decoding."""
    spec = load_study(tiny_study(tmp_path, task, seeds=[0, 1], variants={"only": {"preset": preset}}))
    (group,) = cost.estimate(spec).groups
    assert group.seeds == 2 and group.captured is captured and group.why_alone is None
    assert group.step_s >= step_cost.HOST_S and group.validation_s > 0 and group.test_s > 0


def test_a_long_study_takes_as_many_commands_as_its_time_needs(tmp_path):
    spec = load_study(tiny_study(tmp_path, seeds=[0, 1]))
    found = cost.estimate(spec)
    usable = 500 - step_cost.WORKER_S - cost.GRAPHS * step_cost.COMPILE_S - STOP_GRACE_S
    found.groups[0].count = round(3 * usable / found.groups[0].run_s)  # about three commands' worth
    assert found.parts(500) in (3, 4)
    assert found.parts(500) == -(-(found.total_s - step_cost.WORKER_S) // usable)


def test_plan_prints_the_estimate_and_its_commands(tmp_path, monkeypatch):
    study = tiny_study(tmp_path, seeds=[0, 1])
    done = ablate("plan", str(study), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["commands"] == 1 and found["command"] == f"ablate sweep --time-limit 500 {study}"
    assert [(g["variant"], g["seeds"]) for g in found["groups"]] == [("heads=1", 2), ("heads=2", 2)]
    assert found["total_s"] > step_cost.WORKER_S and found["assumed"] == list(cost.ASSUMED)
    shown = CliRunner().invoke(app, ["plan", str(study), "--time-limit", "300"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "expected on one H100" in text and "--time-limit 300" in text and "held-out step predicted" in text
    # A study named like an option, or holding what a shell would run, is pasted back as one argument.
    odd = tmp_path / "-x $(touch y)"
    odd.mkdir()
    named = tiny_study(odd, seeds=[0, 1])
    quoted = CliRunner().invoke(app, ["plan", "--json", "--", str(named)])
    assert quoted.exit_code == 0, quoted.output
    assert json.loads(quoted.stdout)["command"] == f"ablate sweep --time-limit 500 '{named}'"
    monkeypatch.chdir(odd)
    (odd / "-tiny.yaml").write_text(named.read_text())
    dashed = CliRunner().invoke(app, ["plan", "--json", "--", "-tiny.yaml"])
    assert dashed.exit_code == 0, dashed.output
    assert json.loads(dashed.stdout)["command"] == "ablate sweep --time-limit 500 -- -tiny.yaml"
    short = CliRunner().invoke(app, ["plan", str(study), "--time-limit", "60"])
    assert short.exit_code == 2 and short.stderr.startswith("error: --time-limit 60: leaves nothing to train")
    wrong = CliRunner().invoke(app, ["plan", str(study), "--device", "tpu"])
    assert wrong.exit_code == 2 and wrong.stderr.strip() == "error: --device: 'tpu' is not one of h100"


def test_every_gpu_profile_states_its_expected_time_as_benchmarks_tables_it():
    """Each bundled study file says above its `gpu:` profile what `ablate plan` gave for it, and BENCHMARKS.md's
    table has the same row (both written by scripts/gpu_plans.py, which prices them again)."""
    spec = importlib.util.spec_from_file_location("gpu_plans", REPO / "scripts" / "gpu_plans.py")
    plans = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plans)
    text = plans.BENCHMARKS.read_text()
    section = text[text.index(plans.SECTION) :].split("\n## ")[0]
    rows = {cells[0]: cells for r in section.splitlines() if r.startswith("| ")
            for cells in [[c.strip() for c in r.strip("|").split("|")]]}  # fmt: skip
    assert rows.pop("study") == [c.strip() for c in plans.HEADER.strip("|").split("|")]
    rows.pop("---")
    assert sorted(rows) == plans.gpu_studies() and len(rows) >= 17
    for name in plans.gpu_studies():
        lines = (plans.STUDIES / f"{name}.yaml").read_text().splitlines()
        stated = plans.LINE.match(lines[next(i for i, t in enumerate(lines) if t.startswith("  gpu:")) - 1])
        assert stated, f"{name}.yaml: no line above its gpu profile saying what it costs"
        minutes, commands = int(stated[1]), int(stated[2])
        assert rows[name][4:] == [f"{minutes} min", str(commands)], name
