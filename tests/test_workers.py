"""Workers with real (tiny) training: a diverging variant fails with its reason while the others complete,
artifacts come back from the store, tuning prunes through Lightning, a worker paused past its heartbeat
leaves its trial to the retry; spawned workers keep the storage password off their command lines."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN
from optuna.artifacts import download_artifact
from optuna.trial import TrialState

from ablate.harness import compat
from ablate.harness.artifacts import artifact_store
from ablate.harness.launchers import local
from ablate.harness.study import leases
from ablate.harness.study.queue import load_phase_study, prepare_study
from ablate.harness.study.storage import open_storage
from ablate.harness.workers import run_worker
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL


def tiny_study(**extra) -> dict:
    return {
        "name": "tiny",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "seeds": [0],
        "metric": {"name": "test/tok_acc"},
        **extra,
    }


def tiny_spec(**extra) -> StudySpec:
    return StudySpec.model_validate(tiny_study(**extra))


def download_trial_files(trial, store, dest: Path) -> Path:
    """A finished trial's files as they were in its folder, restored under `dest` from the artifact store
    alone (its 'artifacts' user attr maps each file's path to its artifact id)."""
    for rel, artifact_id in trial.user_attrs.get("artifacts", {}).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        download_artifact(artifact_store=store, file_path=str(target), artifact_id=artifact_id)
    return dest


def test_diverging_variant_fails_with_its_reason_and_the_rest_completes(tmp_path):
    spec = tiny_spec(variants={"hot": {"train.lr": 1.0e6}, "ok": {}})
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    worker = run_worker(spec, storage, tmp_path / "runs", "disabled")
    assert worker.finished_last  # it ran the study's last trial: `ablate worker` writes the report

    trials = {t.params["variant"]: t for t in load_phase_study(spec, storage, EVAL).trials}
    assert all("seed" not in t.params and t.user_attrs["seed"] == 0 for t in trials.values())
    assert trials["hot"].state == TrialState.FAIL
    assert trials["hot"].user_attrs["fail_reason"].startswith("TrialFailed: diverged: ")
    assert trials["ok"].state == TrialState.COMPLETE
    attrs = trials["ok"].user_attrs
    assert 0 <= trials["ok"].value == attrs["metrics"]["test/tok_acc"] <= 1
    assert attrs["config"]["train.lr"] == TINY_TRAIN.get("lr", 1e-3) and attrs["params"] > 0

    # The trial's folder comes back from the artifact store alone.
    restored = download_trial_files(
        trials["ok"], artifact_store(spec.slug, tmp_path / "runs"), tmp_path / "restored"
    )
    files = {p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()}
    assert {"config.json", "metrics.json", "checkpoints/best.ckpt", "checkpoints/last.ckpt"} <= files
    assert any(f.startswith("attention/") and f.endswith(".npz") for f in files)
    original = tmp_path / "runs" / "tiny" / "trials" / "eval" / f"{trials['ok'].number:04d}" / "metrics.json"
    assert (restored / "metrics.json").read_bytes() == original.read_bytes()
    # Beside each probe's arrays, its heatmap as a PNG, which the dashboard shows inline.
    assert {f.removesuffix(".png") for f in files if f.endswith(".png")} == {
        f.removesuffix(".npz") for f in files if f.endswith(".npz")
    }

    # The eval trial reported val/tok_acc at each validation (steps 2 and 4), as its history logged it.
    history = json.loads(original.read_text())["history"]
    assert trials["ok"].intermediate_values == {row["step"]: row["val/tok_acc"] for row in history}
    assert sorted(trials["ok"].intermediate_values) == [2, 4]


@pytest.mark.slow
def test_tuning_prunes_by_step_and_eval_runs_the_best(tmp_path):
    train = {**TINY_TRAIN, "max_steps": 12, "val_every": 2, "checkpoint_every": 2}
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 3e-2]}}, "trials": 6, "pruner": "median"}
    spec = tiny_spec(base={"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": train},
                     tune=tune)  # fmt: skip
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    run_worker(spec, storage, tmp_path / "runs", "disabled")

    tuned = optuna.load_study(study_name="tiny:tune:base", storage=storage)
    # The pruning callback reported at training steps 2, 4, ...
    assert all(set(t.intermediate_values) <= set(range(2, 13, 2)) for t in tuned.trials)
    assert len(tuned.trials[0].intermediate_values) == 6
    assert tuned.metric_names == ["val/tok_acc"]
    (evaluated,) = load_phase_study(spec, storage, EVAL).trials
    assert evaluated.user_attrs["config"]["train.lr"] == tuned.best_params["train.lr"]
    # A pruned trial is never resumed: its resume checkpoints are gone, locally and from the artifact store.
    pruned = [t for t in tuned.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "the median pruner stopped none of six trials"
    for t in pruned:
        assert "resume" in t.user_attrs  # it did publish resume checkpoints while it ran
        assert not any("resume" in name for name in t.user_attrs["artifacts"])
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.name.startswith(("resume-", "resume.ckpt"))]


def test_spawned_workers_get_the_storage_url_from_the_environment_not_their_command_line(monkeypatch):
    """Any user on the machine can read a process's command line (`ps`); its environment only its owner."""
    started = []
    monkeypatch.setattr(local.subprocess, "Popen", lambda command, env, **_: started.append((command, env)))
    url = "postgresql://ablate:s3cret@db.example:5432/studies"
    local.spawn_workers("grid", url, "runs", "disabled", [{"CUDA_VISIBLE_DEVICES": "0"}, {}])
    assert len(started) == 2
    for command, env in started:
        assert "s3cret" not in " ".join(command) and "--storage" not in command
        assert env["ABLATE_STORAGE"] == url and command[-2:] == ["--", "grid"]
    assert started[0][1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_storage_comes_from_ablate_storage_when_no_option_names_it(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ablate.cli import app

    monkeypatch.setenv("ABLATE_STORAGE", "postgresql://ablate:s3cret@127.0.0.1:9/studies")
    result = CliRunner().invoke(app, ["status", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 2
    # The port-9 server cannot be reached: the message names the environment's URL, password masked.
    assert "ablate:***@127.0.0.1:9/studies: cannot open" in result.output and "s3cret" not in result.output


@pytest.mark.parametrize("paused", ["while training", "after training"])
def test_a_worker_paused_past_its_heartbeat_leaves_its_trial_to_the_retry_and_goes_on(
    tmp_path, monkeypatch, paused
):  # fmt: skip
    """A worker stopped (SIGSTOP) past its heartbeat's grace and resumed finds its trial failed by another
    worker and queued again under a new number: one line, no traceback, nothing of its copy recorded, and
    it goes on to claim the retry, whose result is the one kept. The pause is made as the other worker sees
    it, without timing: the trial failed and its copy queued as fail_stale_trials does, while the trial
    trains or once its training is done."""
    from typer.testing import CliRunner

    from ablate.cli import app
    from ablate.harness import trial as harness_trial

    study, runs = tmp_path / "tiny.yaml", tmp_path / "runs"
    study.write_text(yaml.safe_dump(tiny_study()))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    phase = load_phase_study(prepare_study(tiny_spec(), storage), storage, EVAL)
    real_run_trial, paused_trials = harness_trial.run_trial, []

    def fail_as_stale() -> None:
        (running,) = phase.get_trials(states=(TrialState.RUNNING,))
        storage.set_trial_state_values(compat.trial_id(running), TrialState.FAIL)
        storage.get_heartbeat_stale_trial_callback()(phase, storage.get_trial(compat.trial_id(running)))
        paused_trials.append(running.number)

    def run_trial_paused_once(*args, **kwargs):
        if paused_trials:
            return real_run_trial(*args, **kwargs)
        if paused == "while training":
            fail_as_stale()
            return real_run_trial(*args, **kwargs)
        result = real_run_trial(*args, **kwargs)
        fail_as_stale()
        return result

    monkeypatch.setattr(harness_trial, "run_trial", run_trial_paused_once)
    done = CliRunner().invoke(app, ["worker", str(study), "--out", str(runs), "--storage", url,
                                    "--wandb", "disabled", "--no-report"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    said = [line for line in done.output.splitlines() if "retried elsewhere" in line]
    assert said == ["eval trial 0 was retried elsewhere while this worker was paused (its heartbeat went "
                    "stale); its result here is discarded"]  # fmt: skip

    first, retry = phase.get_trials()
    assert paused_trials == [0] and first.state == TrialState.FAIL
    assert not {"metrics", "artifacts"} & set(first.user_attrs)  # nothing of the paused copy was recorded
    assert retry.state == TrialState.COMPLETE and retry.system_attrs["retry_history"] == [0]
    assert retry.value == retry.user_attrs["metrics"]["test/tok_acc"]
    restored = download_trial_files(retry, artifact_store("tiny", runs), tmp_path / "restored")
    kept = runs / "tiny" / "trials" / "eval" / "0001" / "metrics.json"
    assert (restored / "metrics.json").read_bytes() == kept.read_bytes()


def test_a_heartbeat_that_cannot_be_recorded_says_so_in_one_line_and_beats_on(capsys):
    """The database blinked: each missed beat is one line on stderr, never a thread's traceback, and the
    thread keeps beating until the trial ends."""

    class BlinkingStorage:
        beats = 0

        def record_heartbeat(self, trial_id: int) -> None:
            self.beats += 1
            raise optuna.exceptions.StorageInternalError("database is locked")

        def get_heartbeat_interval(self) -> float:
            return 0.01

    storage = BlinkingStorage()
    with leases.heartbeat(storage, 7):
        while storage.beats < 3:
            time.sleep(0.01)
    err = capsys.readouterr().err
    assert set(err.splitlines()) == {"heartbeat of trial 7 not recorded (StorageInternalError); retrying"}


def test_a_worker_given_a_file_that_differs_from_the_stored_study_is_refused(tmp_path):
    """`ablate worker FILE` joins the study as `ablate sweep` does: a storage that holds the study under
    the same name with another spec is refused before any trial runs, not run with the stored spec."""
    from typer.testing import CliRunner

    from ablate.cli import app

    url = f"sqlite:///{tmp_path / 'study.db'}"
    prepare_study(tiny_spec(), open_storage(url))
    changed = tmp_path / "tiny.yaml"
    changed.write_text(yaml.safe_dump(tiny_study(seeds=[0, 1])))
    done = CliRunner().invoke(app, ["worker", str(changed), "--out", str(tmp_path / "runs"), "--storage", url,
                                    "--wandb", "disabled", "--no-report"])  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "already holds study 'tiny' with a different seeds" in done.output
    phase = load_phase_study(tiny_spec(), open_storage(url), EVAL)
    assert [t.state for t in phase.get_trials()] == [TrialState.WAITING]
