"""Study files validated before anything runs; the queue of trials: filled once, claimed once, resumed,
retried after a dead worker. Trials here are instant (a stand-in objective); test_workers.py trains."""

from __future__ import annotations

import json
import multiprocessing
import time

import optuna
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN
from optuna.trial import TrialState
from typer.testing import CliRunner

from ablate.cli import app
from ablate.harness import compat
from ablate.harness.jobs import Job
from ablate.harness.study.queue import load_phase_study, prepare_study, study_progress
from ablate.harness.study.storage import open_storage
from ablate.harness.study.validate import load_study
from ablate.harness.workers import Worker
from ablate.schema.errors import ConfigError
from ablate.schema.spec import HeartbeatSpec, StudySpec
from ablate.schema.trials import EVAL, grid_point


def study_tree(**extra) -> dict:
    return {
        "name": "grid",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "factors": {"model.pos_encoding": ["sinusoidal", "none", "learned"]},
        "seeds": [0, 1, 2, 3],
        "metric": {"name": "test/tok_acc"},
        **extra,
    }


def write(tmp_path, tree, name="study.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"factors": {"model.bogus": [1, 2]}}, "factors.model.bogus: unknown config key"),
        ({"factors": {"model.pos_encoding": []}}, "factors.model.pos_encoding: empty list of values"),
        (
            {"factors": {"model.pos_encoding": ["sinusoidal", "wavelet"]}},
            "factors.model.pos_encoding: unknown kind 'wavelet'; known: none, sinusoidal",
        ),
        ({"fixed": {"train.nope": 1}}, "fixed.train.nope: unknown config key"),
        ({"seeds": []}, "seeds: must list at least one seed"),
        (
            {"tune": {"params": {"train.lr": {"log_uniform": [0.0, 1e-3]}}}},
            "tune.params.train.lr: log_uniform: bounds must be positive",
        ),
        (
            {"tune": {"params": {"model.pos_encoding": {"choice": ["none"]}}}},
            "tune.params.model.pos_encoding: is a factor of the study",
        ),
        (
            {"tune": {"params": {"train.lr": {"uniform": [1e-3, 1e-4]}}}},
            "tune.params.train.lr: uniform: expected [low, high] with low < high",
        ),
        ({"baseline": {"model.pos_encoding": "rope"}}, "baseline: no variant matches"),
    ],
)
def test_bad_study_is_one_line_error(tmp_path, extra, message):
    path = write(tmp_path, study_tree(**extra))
    with pytest.raises(ConfigError) as e:
        load_study(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_study_exits_2_before_creating_a_study(tmp_path):
    path = write(tmp_path, study_tree(factors={"model.bogus": [1]}))
    runs = tmp_path / "runs"
    for command in ("sweep", "worker"):
        result = CliRunner().invoke(app, [command, str(path), "--out", str(runs)])
        assert result.exit_code == 2
        assert result.stderr.strip().splitlines() == [
            f"error: {path}: factors.model.bogus: unknown config key"
        ]
    assert not runs.exists()


def prepared(tmp_path, **extra) -> tuple[StudySpec, str]:
    spec = StudySpec.model_validate(study_tree(**extra))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    prepare_study(spec, open_storage(url))
    return spec, url


def claim_all(url: str, spec: StudySpec, results) -> None:
    """A worker process that claims eval trials as fast as it can and completes each at once."""
    worker = Worker(spec, open_storage(url), runs_root=".", wandb_mode="disabled")
    while claims := worker.picker.claim():
        (claim,) = claims  # on a CPU, train.fuse_seeds: auto claims one trial at a time
        variant = claim.trial.suggest_categorical("variant", list(spec.variant_overrides()))
        results.put((claim.trial.number, grid_point(variant, claim.seed)))
        claim.study.tell(claim.trial, 1.0)


def test_concurrent_workers_claim_every_grid_point_exactly_once(tmp_path):
    spec, url = prepared(tmp_path)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=claim_all, args=(url, spec, results)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    claimed = [results.get(timeout=5) for _ in range(12)]
    assert results.empty()
    numbers = [n for n, _ in claimed]
    assert sorted(numbers) == list(range(12))  # nobody ran a trial twice
    points = sorted(p for _, p in claimed)
    expected = sorted(grid_point(v, s) for v in spec.variant_overrides() for s in spec.seeds)
    assert points == expected  # every grid point ran, none twice
    study = load_phase_study(spec, open_storage(url), EVAL)
    assert len(study.trials) == 12 and all(t.state == TrialState.COMPLETE for t in study.trials)


def prepare_in_process(url: str, spec: StudySpec) -> None:
    prepare_study(spec, open_storage(url))


def test_concurrent_starters_queue_the_grid_once(tmp_path):
    spec = StudySpec.model_validate(study_tree())
    url = f"sqlite:///{tmp_path / 'study.db'}"
    open_storage(url)  # tables exist, as after the first `ablate sweep` opened the file
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=prepare_in_process, args=(url, spec)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    study = load_phase_study(spec, open_storage(url), EVAL)
    assert len(study.trials) == 12
    assert all(t.state == TrialState.WAITING for t in study.trials)


def instant_results(monkeypatch, calls: list):
    """run_trial replaced by a stand-in that 'trains' instantly and scores lr's distance from 3e-3."""
    import math

    from ablate.harness.trial import TrialResult

    def fake_run_trial(cfg, out_dir=None, loggers=None, callbacks=None, progress=False, **resume):
        calls.append(cfg)
        if cfg.train.lr > 1:
            raise FloatingPointError("loss is nan")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "metrics.json").write_text(json.dumps({"seed": cfg.seed}))
        score = 1 - abs(math.log10(cfg.train.lr / 3e-3))
        metrics = {"test/tok_acc": score, "val/tok_acc": score}
        return TrialResult(metrics=metrics, params=7, wall_time=0.01, split_sizes={"train": 1})

    monkeypatch.setattr("ablate.harness.trial.run_trial", fake_run_trial)


def test_interrupted_sweep_resumes_without_rerunning_finished_trials(tmp_path, monkeypatch):
    spec, url = prepared(tmp_path, factors={"model.pos_encoding": ["sinusoidal", "none"]}, seeds=[0, 1])
    storage = open_storage(url)
    calls: list = []
    instant_results(monkeypatch, calls)
    worker = Worker(spec, storage, tmp_path / "runs", "disabled")
    worker.run_claimed(worker.picker.claim())  # one grid point finished

    def interrupted(claim):
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "objective", interrupted)
    claims = worker.picker.claim()
    worker.run_claimed(claims)
    (claim,) = claims
    assert worker.stopped.startswith(f"KeyboardInterrupt: eval trial {claim.trial.number} checkpointed")
    study = load_phase_study(spec, storage, EVAL)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states  # Ctrl-C leaves no zombie
    assert TrialState.FAIL not in states and len(states) == 4  # it waits again, as itself
    assert study.trials[claim.trial.number].state == TrialState.WAITING

    resumed = Worker(spec, storage, tmp_path / "runs", "disabled")
    resumed.run()
    assert len(calls) == 4  # 1 before the interruption + the 3 left; the finished one did not run again
    done = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["grid_point"] for t in done) == sorted(
        grid_point(v, s) for v in spec.variant_overrides() for s in spec.seeds
    )
    rows = study_progress(spec, storage)
    assert [(r.done, r.failed, r.running) for r in rows] == [(2, 0, 0), (2, 0, 0)]


def test_dead_workers_trial_is_retried_once_its_heartbeat_is_stale(tmp_path, monkeypatch):
    spec, url = prepared(tmp_path, factors={}, seeds=[0])
    storage = open_storage(url, heartbeat=HeartbeatSpec(interval=1, grace=2))
    dead = Worker(spec, storage, tmp_path / "runs", "disabled")
    (lost,) = dead.picker.claim()  # claimed, then the worker "dies": no heartbeat, no tell
    storage.record_heartbeat(compat.trial_id(lost.trial))
    time.sleep(2.5)
    calls: list = []
    instant_results(monkeypatch, calls)
    Worker(spec, storage, tmp_path / "runs", "disabled").run()
    study = load_phase_study(spec, storage, EVAL)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert study.trials[1].system_attrs["retry_history"] == [0]
    assert len(calls) == 1
    (row,) = study_progress(spec, storage)
    assert (row.done, row.failed) == (1, 0)  # the retried trial is not counted as a failure


def test_tuned_best_params_are_the_ones_eval_uses(tmp_path, monkeypatch):
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-1]}}, "trials": 6, "pruner": "median"}
    spec, url = prepared(
        tmp_path, factors={"model.pos_encoding": ["sinusoidal", "none"]}, seeds=[0, 1], tune=tune
    )
    storage = open_storage(url)
    calls: list = []
    instant_results(monkeypatch, calls)
    Worker(spec, storage, tmp_path / "runs", "disabled").run()
    assert len(calls) == 2 * 6 + 2 * 2
    # Tuning ran on the first seed only, before any eval trial of its variant.
    assert {c.seed for c in calls[:12]} == {0}
    eval_study = load_phase_study(spec, storage, EVAL)
    for variant in spec.variant_overrides():
        tune_study = optuna.load_study(study_name=f"grid:tune:{variant}", storage=storage)
        assert len(tune_study.trials) == 6
        best = tune_study.best_trial
        evals = [t for t in eval_study.trials if t.params["variant"] == variant]
        assert len(evals) == 2
        for t in evals:
            assert t.state == TrialState.COMPLETE
            assert t.user_attrs["tuned"] == best.params and t.user_attrs["tune_trial"] == best.number
            assert t.user_attrs["config"]["train.lr"] == best.params["train.lr"]


def test_tuned_on_the_baseline_every_variant_trains_with_the_baselines_best(tmp_path, monkeypatch):
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-1]}}, "trials": 5, "pruner": "median", "arm": "baseline"}
    factors = {"model.pos_encoding": ["sinusoidal", "none", "learned"]}
    spec, url = prepared(tmp_path, factors=factors, seeds=[0, 1], tune=tune, baseline={"model.pos_encoding": "none"})
    storage = open_storage(url)
    calls: list = []
    instant_results(monkeypatch, calls)
    Worker(spec, storage, tmp_path / "runs", "disabled").run()
    # Five tune trials of the baseline alone, all before any eval trial, then the grid once.
    assert len(calls) == 5 + 3 * 2
    assert {c.model.pos_encoding for c in calls[:5]} == {"none"}
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    assert names == {"grid:eval", "grid:tune:pos_encoding=none"}
    best = optuna.load_study(study_name="grid:tune:pos_encoding=none", storage=storage).best_trial
    evals = load_phase_study(spec, storage, EVAL).trials
    assert {t.params["variant"] for t in evals} == set(spec.variant_overrides())
    for t in evals:
        assert t.state == TrialState.COMPLETE and t.user_attrs["tune_trial"] == best.number
        assert t.user_attrs["config"]["train.lr"] == best.params["train.lr"]
    assert sum(row.tune_total for row in study_progress(spec, storage)) == 5


def test_workers_claiming_tune_trials_at_once_draw_different_points(tmp_path):
    """Each worker holds its own sampler: seeded per variant alone, two workers claiming a tune trial each
    before either finished drew the same random start point. Seeded per trial, they differ, and a worker
    that claims the same trial number draws its point again."""
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-1]}}, "trials": 6}
    spec, url = prepared(tmp_path, factors={}, variants={"only": {}}, seeds=[0], tune=tune)
    workers = [Worker(spec, open_storage(url), tmp_path / "runs", "disabled") for _ in range(2)]
    claims = [worker.picker.claim()[0] for worker in workers]
    lrs = [job(worker, claim).cfg.train.lr for worker, claim in zip(workers, claims)]
    assert claims[0].trial.number != claims[1].trial.number and lrs[0] != lrs[1]
    again = prepared(tmp_path / "again", factors={}, variants={"only": {}}, seeds=[0], tune=tune)
    worker = Worker(again[0], open_storage(again[1]), tmp_path / "again" / "runs", "disabled")
    assert job(worker, worker.picker.claim()[0]).cfg.train.lr == lrs[0]


def job(worker: Worker, claim) -> Job:
    """The claimed trial made ready to run, as the worker's objective prepares it."""
    return Job.prepare(worker.spec, worker.picker.variants, worker.storage, worker.root, worker.store, claim)


def test_tuning_on_the_baseline_needs_one(tmp_path):
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-1]}}, "arm": "baseline"}
    tree = study_tree(tune=tune, baseline="no-such-variant")
    with pytest.raises(ConfigError, match=r"tune.arm: baseline: the study names no baseline variant to tune on"):
        load_study(write(tmp_path, tree))


def test_tuning_on_the_baseline_alone_says_why_when_claims_compare_it(tmp_path):
    """A rate chosen on one arm favours it in each claim against it: the study must say why it tunes so."""
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-1]}}, "arm": "baseline"}
    factors = {"model.pos_encoding": ["sinusoidal", "none"]}
    claim = {"text": "t", "compare": {"model.pos_encoding": "none"}, "to": {"model.pos_encoding": "sinusoidal"},
             "expect": "lower", "margin": 0.1}  # fmt: skip
    tree = study_tree(factors=factors, tune=tune, baseline={"model.pos_encoding": "sinusoidal"}, claims=[claim])
    with pytest.raises(ConfigError, match=r"tune.why: tune.arm: baseline chooses every arm's parameters on one "):
        load_study(write(tmp_path, tree))
    said = {**tune, "why": "the paper keeps the standard recipe's rate for every arm"}
    assert load_study(write(tmp_path, {**tree, "tune": said})).tune.why.startswith("the paper keeps")
    load_study(write(tmp_path, {**tree, "claims": []}))  # no claim to favour: no reason needed


def test_failed_trial_keeps_its_reason_and_the_sweep_goes_on(tmp_path, monkeypatch):
    spec, url = prepared(tmp_path, factors={}, variants={"ok": {}, "hot": {"train.lr": 1e6}}, seeds=[0])
    storage = open_storage(url)
    calls: list = []
    instant_results(monkeypatch, calls)
    Worker(spec, storage, tmp_path / "runs", "disabled").run()
    trials = {t.params["variant"]: t for t in load_phase_study(spec, storage, EVAL).trials}
    assert trials["ok"].state == TrialState.COMPLETE
    assert trials["hot"].state == TrialState.FAIL
    assert trials["hot"].user_attrs["fail_reason"] == "FloatingPointError: loss is nan"
    assert trials["ok"].user_attrs["artifacts"].keys() == {"metrics.json"}


def test_a_factor_reaches_its_layer_by_the_route_the_architecture_names(tmp_path):
    """docs/ARCHITECTURE.md's route of one factor, model.pos_encoding, from the study file to its layer,
    followed hop by hop: what each hop hands on is what the next one reads."""
    from ablate.harness.trial import Prepared
    from ablate.models import positional_layers

    spec = load_study(write(tmp_path, study_tree(factors={"model.pos_encoding": ["sinusoidal", "alibi"]})))  # 1
    variants = spec.variant_overrides()  # 2: what the queue stores and Job.prepare reads back
    assert list(variants.values()) == [{"model.pos_encoding": "sinusoidal"}, {"model.pos_encoding": "alibi"}]
    cfg = spec.config_for(variants["pos_encoding=alibi"], seed=0)  # 3: as Job.prepare builds it
    assert cfg.model.pos_encoding == "alibi"
    module = Prepared.of(cfg).module  # 4: run_trial's module, Seq2SeqModule(cfg.model, ...)
    model = module.model  # 5: build_model's family for model.arch
    positions = model.positions  # 6: build_positions, from the registry's entry for alibi
    assert isinstance(positions.score_bias["src"], positional_layers.ALiBi)
    assert isinstance(positions.embedding, positional_layers.NoEncoding) and positions.rotary is None
