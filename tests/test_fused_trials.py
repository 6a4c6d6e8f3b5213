"""Eval trials of one variant trained fused (harness/fused.py) against the same trials run alone
(harness/trial.py's run_trial), and the worker that claims them together.

Each seed of a fused group must get the numbers it gets alone: every test metric, every validation row of
its history, its best step, its step count, with dropout drawing masks, clipping that clips and early
stopping that stops seeds at different steps. One seed that diverges fails alone; a group stopped by a
signal resumes each seed from its own checkpoint to the numbers of an uninterrupted run.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal

import optuna
import pytest
import torch
from optuna.trial import TrialState

from ablate.harness import signals
from ablate.harness.checkpoints import FUSED_STATE, RESUME_ATTR, Preempted, resume_point
from ablate.harness.fused import FusedGroup, Member, run_fused
from ablate.harness.grouping import why_not_fused
from ablate.harness.rules import TrialFailed
from ablate.harness.study.queue import load_phase_study, prepare_study, queue_grid_points
from ablate.harness.study.storage import open_storage
from ablate.harness.trial import run_trial
from ablate.harness.workers import Worker
from ablate.models.ensemble import seed_axis
from ablate.reports.render import build_report
from ablate.schema.config import build_config
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL

pytestmark = pytest.mark.usefixtures("single_thread")

SEEDS = [3, 4, 5]
TASK = {"name": "reverse", "min_len": 3, "max_len": 7, "test_max_len": 9, "vocab_size": 10, "n_train": 400,
        "n_valid": 64, "n_test": 64}  # fmt: skip
MODEL = {"d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "dropout": 0.2}
# grad_clip 0.5 clips (the gradient norm starts above 1); patience 1 with a validation every 4 steps stops
# one of the Transformer's seeds at step 32, the others at the budget.
TRAIN = {"batch_size": 32, "lr": 0.01, "max_steps": 40, "val_every": 4, "grad_clip": 0.5, "patience": 1}
TOL = 1e-5


# A classifier's task: texts of cues whose label it pools attention for (its explanation measures too).
CUES = {"name": "cues", "min_len": 3, "max_len": 7, "test_max_len": 9, "vocab_size": 10, "n_train": 400,
        "n_valid": 64, "n_test": 64}  # fmt: skip


# A captioner's: strips of one or two handwritten digits (its doubly stochastic penalty in each seed's loss).
DIGITS = {"name": "digits", "min_len": 1, "max_len": 2, "test_max_len": 3, "n_train": 400, "n_valid": 64,
          "n_test": 64}  # fmt: skip


def config(seed: int, preset: str, **train):
    task = CUES if preset.startswith("classifier") else DIGITS if preset.startswith("captioner") else TASK
    return build_config({"preset": preset, "task": task, "model": MODEL, "train": {**TRAIN, **train},
                         "seed": seed})  # fmt: skip


def after_step(monkeypatch, step: int, then) -> None:
    """Calls then(group) once a fused group's training step `step` has run."""
    train_step = FusedGroup.train_step

    def stepped(group: FusedGroup) -> None:
        train_step(group)
        if group.step == step:
            then(group)

    monkeypatch.setattr(FusedGroup, "train_step", stepped)


def assert_same_trial(fused, alone) -> None:
    assert set(fused.metrics) == set(alone.metrics)
    for name, value in alone.metrics.items():
        # The adversary keeps the farthest of its iterates within a hard bound on the output: weights equal
        # to 1e-6 can put one iterate on the other side of it, a step of about 1e-4 in the mean.
        tol = 1e-3 if name.endswith("/adv_jsd") else TOL
        assert fused.metrics[name] == pytest.approx(value, rel=tol, abs=tol), name
    assert [row["step"] for row in fused.history] == [row["step"] for row in alone.history]
    for fused_row, alone_row in zip(fused.history, alone.history):
        assert fused_row == pytest.approx(alone_row, rel=TOL, abs=TOL)
    assert (fused.best_step, fused.steps, fused.params) == (alone.best_step, alone.steps, alone.params)
    assert fused.split_sizes == alone.split_sizes
    assert len(fused.attention) == len(alone.attention)


@pytest.mark.parametrize("preset", ["transformer", "lstm", "classifier-additive", "captioner-soft"])
def test_each_fused_seed_gets_the_numbers_it_gets_alone(preset, tmp_path):
    # A convolution grouped by seed rounds otherwise than the plain one (about 1e-7 a step, from step 16 on),
    # which 40 steps at lr 0.01 grow to 1e-5: the captioner's trials stop at 20.
    train = {"max_steps": 20} if preset.startswith("captioner") else {}
    alone = [run_trial(config(seed, preset, **train)) for seed in SEEDS]
    fused = run_fused([Member(config(seed, preset, **train), tmp_path / str(seed)) for seed in SEEDS])
    for f, a in zip(fused, alone):
        assert_same_trial(f, a)
    if preset == "transformer":  # early stopping ended seeds apart: the group did not move in lockstep
        assert len({a.steps for a in alone}) > 1
    assert (tmp_path / "3" / "checkpoints" / "best.ckpt").is_file()
    assert (tmp_path / "3" / "metrics.json").is_file()


@pytest.mark.slow  # trials alone and fused over two epochs: about 10 s on 2 cores
def test_an_epoch_budget_validates_at_each_epochs_end_as_alone():
    train = {"max_epochs": 2, "max_steps": 1000, "patience": None}  # 400 examples: 13 batches an epoch
    alone = [run_trial(config(seed, "transformer", **train)) for seed in SEEDS[:2]]
    fused = run_fused([Member(config(seed, "transformer", **train)) for seed in SEEDS[:2]])
    for f, a in zip(fused, alone):
        assert_same_trial(f, a)
    assert [row["step"] for row in alone[0].history] == [13, 26]


def test_a_diverging_seed_fails_alone_and_the_others_train_on(monkeypatch):
    alone = {seed: run_trial(config(seed, "transformer", patience=None)) for seed in (3, 5)}

    def poison(group: FusedGroup) -> None:  # seed 4's weights stop being finite, and so does its next loss
        with torch.no_grad():
            seed_axis(next(group.model.parameters()), group.k)[1].fill_(math.nan)

    after_step(monkeypatch, 10, poison)
    first, failed, last = run_fused([Member(config(seed, "transformer", patience=None)) for seed in SEEDS])
    assert isinstance(failed, TrialFailed)
    assert str(failed) == "diverged: train/loss is not finite (by step 12)"
    assert_same_trial(first, alone[3])
    assert_same_trial(last, alone[5])


def test_a_stopped_group_resumes_each_seed_from_its_checkpoint(tmp_path, monkeypatch):
    train = {"checkpoint_every": 12, "patience": None}
    whole = run_fused([Member(config(seed, "lstm", **train)) for seed in SEEDS])
    dirs = [tmp_path / str(seed) for seed in SEEDS]
    published: list[tuple[str, int]] = []
    after_step(monkeypatch, 20, lambda group: monkeypatch.setattr(signals, "received", lambda: signal.SIGTERM))
    members = [Member(config(seed, "lstm", **train), d, publish=lambda d, s: published.append((d.parent.name, s)))
               for seed, d in zip(SEEDS, dirs)]  # fmt: skip
    with pytest.raises(Preempted) as stop:
        run_fused(members)
    assert stop.value.step == 20
    assert sorted(published) == sorted([(str(seed), s) for seed in SEEDS for s in (12, 20)])
    monkeypatch.undo()
    resumed = run_fused([
        Member(config(seed, "lstm", **train), d, resume_from=d / "checkpoints" / "resume.ckpt")
        for seed, d in zip(SEEDS, dirs)
    ])  # fmt: skip
    for r, w in zip(resumed, whole):
        assert r.resumed_from_step == 20
        assert r.metrics == pytest.approx(w.metrics, rel=TOL, abs=TOL)
        assert [row["step"] for row in r.history] == [row["step"] for row in w.history]
        for a, b in zip(r.history, w.history):
            assert a == pytest.approx(b, rel=TOL, abs=TOL)


@pytest.mark.slow  # a group stopped and resumed: about 10 s on 2 cores
def test_a_seed_that_failed_before_a_stop_stays_failed_when_its_group_resumes(tmp_path, monkeypatch):
    train = {"checkpoint_every": 0, "patience": None}
    dirs = [tmp_path / str(seed) for seed in SEEDS]

    def poison_then_stop(group: FusedGroup) -> None:
        with torch.no_grad():
            seed_axis(next(group.model.parameters()), group.k)[1].fill_(math.nan)
        after_step(monkeypatch, 10, lambda group: monkeypatch.setattr(signals, "received", lambda: signal.SIGTERM))

    after_step(monkeypatch, 2, poison_then_stop)
    with pytest.raises(Preempted):
        run_fused([Member(config(seed, "lstm", **train), d) for seed, d in zip(SEEDS, dirs)])
    monkeypatch.undo()
    first, failed, last = run_fused([
        Member(config(seed, "lstm", **train), d, resume_from=d / "checkpoints" / "resume.ckpt")
        for seed, d in zip(SEEDS, dirs)
    ])  # fmt: skip
    assert isinstance(failed, TrialFailed) and str(failed) == "diverged: train/loss is not finite (by step 4)"
    assert first.steps == last.steps == TRAIN["max_steps"] and first.resumed_from_step == 10


def test_fuse_seeds_true_where_seeds_cannot_fuse_is_refused_up_front(tmp_path):
    from ablate.harness.study.validate import load_study
    from ablate.schema.errors import ConfigError

    study = tmp_path / "s.yaml"
    study.write_text(json.dumps({
        "name": "s", "seeds": [0, 1], "metric": {"name": "test/tok_acc", "direction": "maximize"},
        "base": {"preset": "transformer", "task": TASK, "model": MODEL,
                 "train": {"fuse_seeds": True, "batch_tokens": 64}},
    }))  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        load_study(study, read_data=False)
    assert "train.fuse_seeds: true, but train.batch_tokens gives each seed batches of its own sizes" in str(
        refused.value
    )


def test_what_cannot_train_fused_is_said():
    base = config(0, "transformer")
    assert why_not_fused([base, config(1, "transformer")]) is None
    assert why_not_fused([base, config(1, "lstm")]) == "the trials are not one variant"
    assert "batch_tokens" in why_not_fused([config(0, "transformer", batch_tokens=200)])
    assert why_not_fused([config(0, "transformer", precision="bf16-mixed")]) is None
    assert why_not_fused([config(0, "transformer", compile=True)]) is None
    assert "precision" in why_not_fused([config(0, "transformer", precision="16-mixed")])


# The worker ------------------------------------------------------------------------------------------------


def study(tmp_path, fuse_seeds, seeds=(0, 1, 2), presets=("transformer", "lstm"), **train):
    tree = {
        "name": "fz", "seeds": list(seeds), "metric": {"name": "test/tok_acc", "direction": "maximize"},
        "base": {"task": TASK, "model": MODEL,
                 "train": {**TRAIN, "max_steps": 16, "fuse_seeds": fuse_seeds, **train}},
        "variants": {preset: {"preset": preset} for preset in presets},
    }  # fmt: skip
    return prepared(tmp_path, tree)


def prepared(tmp_path, tree: dict):
    """The study of `tree`, queued in a SQLite storage under tmp_path: (its spec, the storage)."""
    spec = StudySpec.model_validate(tree)
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", create_dir=True)
    prepare_study(spec, storage)
    return spec, storage


def test_a_worker_claims_a_variants_waiting_seeds_together_and_looks_fuse_theirs(tmp_path):
    spec, storage = study(tmp_path, fuse_seeds=True)
    worker = Worker(spec, storage, tmp_path / "runs", "disabled")
    group = worker.picker.claim()
    assert [(c.variant, c.seed) for c in group] == [("transformer", 0), ("transformer", 1), ("transformer", 2)]
    # A seed whose checkpoint is Lightning's resumes alone; fused seeds of one step resume together.
    study_ = load_phase_study(spec, storage, EVAL)
    lstm = [t for t in study_.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    storage.set_trial_user_attr(lstm[0]._trial_id, RESUME_ATTR, {"step": 8, "key": "k", "state": "s"})
    for t in lstm[1:]:
        storage.set_trial_user_attr(t._trial_id, RESUME_ATTR, {"step": 8, "key": "k", "state": "s",
                                                                "kind": FUSED_STATE})  # fmt: skip
    assert [resume_point(t.user_attrs) for t in storage.get_all_trials(study_._study_id)[3:]] == [
        ("lightning", 8), (FUSED_STATE, 8), (FUSED_STATE, 8)]
    assert [c.seed for c in worker.picker.claim()] == [0]
    assert [c.seed for c in worker.picker.claim()] == [1, 2]
    # An adaptive look's new seeds are queued together and claimed as one group.
    queue_grid_points(spec, study_, {"transformer": [7, 8]})
    assert [c.seed for c in worker.picker.claim()] == [7, 8]


def test_a_full_disk_as_a_fused_group_is_stored_queues_it_again_with_what_it_resumes_from(
    tmp_path, monkeypatch
):
    """The disk fills up as the second seed's files are stored, the first seed's stored already: the whole
    group waits again, no seed's resume checkpoints discarded, and once space is freed it completes."""
    from ablate.harness import jobs

    spec, storage = study(
        tmp_path, fuse_seeds=True, seeds=(0, 1), presets=("transformer",), checkpoint_every=8
    )
    real_upload, uploads = jobs.upload_trial_files, []

    def upload(trial, out_dir, store):
        uploads.append(trial.number)
        if len(uploads) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out_dir))
        return real_upload(trial, out_dir, store)

    monkeypatch.setattr(jobs, "upload_trial_files", upload)
    stopped = Worker(spec, storage, tmp_path / "runs", "disabled")
    stopped.run()
    assert stopped.stopped.startswith("no space left on device") and uploads == [0, 1]
    phase = load_phase_study(spec, storage, EVAL)
    assert [t.state for t in phase.get_trials()] == [TrialState.WAITING] * 2
    assert all(RESUME_ATTR in t.user_attrs for t in phase.get_trials())
    Worker(spec, storage, tmp_path / "runs", "disabled").run()  # space freed
    assert [t.state for t in phase.get_trials()] == [TrialState.COMPLETE] * 2


@pytest.mark.slow  # whole studies through a worker, twice: about 30 s on 2 cores
def test_a_fused_study_records_what_an_unfused_one_records(tmp_path):
    records, reports = {}, {}
    for fuse in (True, False):
        spec, storage = study(tmp_path / str(fuse), fuse_seeds=fuse, seeds=(0, 1))
        worker = Worker(spec, storage, tmp_path / str(fuse) / "runs", "disabled")
        worker.run()
        trials = optuna.load_study(study_name="fz:eval", storage=storage).get_trials()
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
        records[fuse] = {t.user_attrs["grid_point"]: t for t in trials}
        report = build_report(spec, storage, tmp_path / str(fuse) / "runs")
        md = (report / "report.md").read_text()
        reports[fuse] = ({p.relative_to(report) for p in report.rglob("*")},
                         [line.split("|")[1] for line in md.splitlines() if line.startswith("|")])  # fmt: skip
        # How the seeds trained, said in the report's provenance: fused, or alone and why.
        assert f"- Seeds trained: {'fused' if fuse else 'alone: train.fuse_seeds: false'} (" in md
    # The same files, and the same table rows (the first cell of each: variants, seeds, metrics) in order.
    assert reports[True] == reports[False]
    for point, fused in records[True].items():
        alone = records[False][point]
        assert set(fused.user_attrs) - {"worker"} == set(alone.user_attrs) - {"worker"}
        assert fused.user_attrs["metrics"] == pytest.approx(alone.user_attrs["metrics"], rel=TOL, abs=TOL)
        assert fused.value == pytest.approx(alone.value, rel=TOL, abs=TOL)
        assert sorted(fused.intermediate_values) == sorted(alone.intermediate_values)


def tuned_study(tmp_path, seeds):
    tree = {
        "name": "tz", "seeds": [0, 1], "metric": {"name": "test/tok_acc", "direction": "maximize"},
        "base": {"preset": "transformer", "task": TASK, "model": MODEL,
                 "train": {**TRAIN, "max_steps": 12, "patience": None}},
        "tune": {"params": {"train.lr": {"log_uniform": [0.001, 0.01]}}, "trials": 1, "pruner": "none",
                 "seeds": seeds},
    }  # fmt: skip
    return prepared(tmp_path, tree)


@pytest.mark.slow  # a tune trial of two seeds and both seeds alone: about 15 s on 2 cores
def test_a_tune_candidate_is_scored_on_the_mean_of_its_seeds_each_as_alone(tmp_path):
    spec, storage = tuned_study(tmp_path, seeds=2)
    assert spec.tune_seeds == [2, 3]  # after the eval seeds: none of them tunes
    worker = Worker(spec, storage, tmp_path / "runs", "disabled")
    (claim,) = worker.picker.claim()
    assert claim.phase == "tune"
    assert worker.run_claimed([claim])
    (trial,) = optuna.load_study(study_name="tz:tune:base", storage=storage).get_trials()
    assert trial.state == TrialState.COMPLETE
    lr = trial.params["train.lr"]
    alone = [run_trial(spec.config_for({}, seed, {"train.lr": lr})).metrics["val/tok_acc"] for seed in (2, 3)]
    assert trial.user_attrs["seed_values"] == pytest.approx({"2": alone[0], "3": alone[1]}, rel=TOL, abs=TOL)
    assert trial.value == pytest.approx(sum(alone) / 2, rel=TOL, abs=TOL)
    # Each validation reported the seeds' mean, at the step it ran.
    assert sorted(trial.intermediate_values) == [4, 8, 12]
    assert (tmp_path / "runs" / "tz" / "trials" / "tune").is_dir()


def test_a_tune_candidate_pruned_on_its_seeds_mean_is_pruned(tmp_path, monkeypatch):
    spec, storage = tuned_study(tmp_path, seeds=[40, 41])
    monkeypatch.setattr(optuna.Trial, "should_prune", lambda self: True)
    worker = Worker(spec, storage, tmp_path / "runs", "disabled")
    assert worker.run_claimed(worker.picker.claim())
    (trial,) = optuna.load_study(study_name="tz:tune:base", storage=storage).get_trials()
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [4]


def test_tune_seeds_that_are_eval_seeds_or_cannot_fuse_are_refused(tmp_path):
    from ablate.harness.study.validate import tune_problems

    spec = StudySpec.model_validate({
        "name": "tz", "seeds": [0, 1], "metric": {"name": "test/tok_acc", "direction": "maximize"},
        "base": {"preset": "transformer", "task": TASK, "model": MODEL, "train": {"batch_tokens": 64}},
        "tune": {"params": {"train.lr": {"log_uniform": [0.001, 0.01]}}, "seeds": [1, 5]},
    })  # fmt: skip
    assert tune_problems(spec, spec.tune) == [
        ("tune.seeds", "1 is an eval seed too; tune on others"),
        ("tune.seeds", "a candidate's seeds train fused, but train.batch_tokens gives each seed batches of its "
                       "own sizes in variant 'base'"),
    ]  # fmt: skip


@pytest.mark.slow  # whole studies through a worker, twice: about 30 s on 2 cores
def test_a_stopped_fused_worker_queues_its_group_and_the_next_resumes_each_seed(tmp_path, monkeypatch):
    def trials(storage):
        return sorted(optuna.load_study(study_name="fz:eval", storage=storage).get_trials(),
                      key=lambda t: t.user_attrs["grid_point"])  # fmt: skip

    def fused_study(root):
        return study(root, fuse_seeds=True, seeds=(0, 1), presets=("lstm",), checkpoint_every=4, patience=None)

    spec, whole = fused_study(tmp_path / "whole")
    Worker(spec, whole, tmp_path / "whole" / "runs", "disabled").run()

    spec, storage = fused_study(tmp_path / "stopped")
    after_step(monkeypatch, 10, lambda group: monkeypatch.setattr(signals, "received", lambda: signal.SIGTERM))
    stopped = Worker(spec, storage, tmp_path / "stopped" / "runs", "disabled")
    stopped.run()
    monkeypatch.undo()
    assert stopped.stopped == "SIGTERM: eval trial 0, 1 checkpointed and queued again at step 10"
    assert [t.state for t in trials(storage)] == [TrialState.WAITING] * 2
    assert [resume_point(t.user_attrs) for t in trials(storage)] == [(FUSED_STATE, 10)] * 2

    resumed = Worker(spec, storage, tmp_path / "stopped" / "runs", "disabled")
    resumed.run()
    for again, uninterrupted in zip(trials(storage), trials(whole)):
        assert again.state == TrialState.COMPLETE and again.user_attrs["resumed_from_step"] == 10
        assert again.user_attrs["metrics"] == pytest.approx(uninterrupted.user_attrs["metrics"], rel=TOL, abs=TOL)
