"""The Python API (ablate/api.py): the command line's operations as calls, for notebooks and scripts."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from conftest import REPO, TINY_TRAIN, study_trials
from optuna.trial import TrialState
from test_reliability import background, finish, resume_record, wait_for
from test_reliability import write_study as write_long_study
from test_sweep import write_study
from typer.testing import CliRunner

import ablate
from ablate.cli import app
from ablate.harness.study.validate import load_study as load_spec
from ablate.schema.config import ExperimentConfig

CLAIM = {"text": "The Transformer scores a higher token accuracy than the LSTM.", "compare": {"preset": "transformer"},
         "to": {"preset": "lstm"}, "expect": "higher", "margin": 0.05}  # fmt: skip


def test_import_ablate_leaves_torch_and_optuna_unimported():
    """`import ablate` and reaching the API's names is quick: torch comes only with a run."""
    code = ("import sys, ablate; ablate.load_study, ablate.Study, ablate.train, ablate.ConfigError; "
            "print(sorted(m for m in ('torch', 'optuna', 'lightning', 'pandas') if m in sys.modules))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ablate.nope  # noqa: B018


def test_a_bundled_study_loads_by_name_and_by_path_with_profile_and_sets(tmp_path):
    by_name = ablate.load_study("quickstart", sets={"train.max_steps": 50}, out=tmp_path)
    path = REPO / "ablations" / "quickstart.yaml"
    by_path = ablate.load_study(path, sets={"train.max_steps": 50}, out=tmp_path)
    assert by_name.spec == by_path.spec == load_spec(path, sets={"train.max_steps": 50})
    assert by_name.name == "quickstart" and by_name.spec.fixed["train.max_steps"] == 50
    assert by_name.report_path == tmp_path / "quickstart" / "report" / "report.html"
    assert repr(by_name).startswith("<Study quickstart: 3 variants x ")
    gpu = ablate.load_study("bottleneck", profile="gpu", out=tmp_path)
    assert gpu.name == "bottleneck-gpu" and gpu.report_path.parent.parent.name == "bottleneck-gpu"
    assert not any(tmp_path.iterdir())  # loading creates nothing


def test_bad_input_raises_config_error_naming_what_and_where_and_creates_nothing(tmp_path):
    with pytest.raises(ablate.ConfigError, match=r"^nope: no such study file$"):
        ablate.load_study("nope")
    study = write_study(tmp_path / "bad.yaml", variants={"a": {"preset": "lstm"}, "b": {"train.max_tim": 3}})
    with pytest.raises(ablate.ConfigError) as e:
        ablate.load_study(study, out=tmp_path / "runs")
    assert f"{study}: variants.b.train.max_tim: unknown config key" in str(e.value)
    with pytest.raises(ablate.ConfigError, match=r"--out: .*not a folder"):
        (tmp_path / "file").write_text("")
        ablate.load_study(write_study(tmp_path / "tiny.yaml"), out=tmp_path / "file" / "runs")

    good = ablate.load_study(tmp_path / "tiny.yaml", out=tmp_path / "runs")
    with pytest.raises(
        ablate.ConfigError, match=r"^--wandb: expected online, offline or disabled \(got 'on'\)"
    ):
        good.run(workers=1, wandb="on")
    with pytest.raises(ablate.ConfigError, match=r"^--workers: give either --workers .* or --devices"):
        good.run(workers=1, devices="0")
    with pytest.raises(ablate.ConfigError, match=r"^storage sqlite:///.*study\.db: no such database$"):
        good.results()
    assert not (tmp_path / "runs").exists()

    with pytest.raises(ablate.ConfigError, match=r"^model\.nope: unknown config key$"):
        ablate.train({"preset": "lstm"}, sets={"model.nope": 1})
    with pytest.raises(ablate.ConfigError, match=r"^preset: "):
        ablate.train(preset="lstm-nope")
    # A key the model ignores is refused as `ablate train` refuses it, in `sets` and in the tree.
    with pytest.raises(ablate.ConfigError, match=r"^model\.d_ff: has no effect \(a Transformer setting"):
        ablate.train({"preset": "lstm"}, sets={"model.d_ff": 64})
    with pytest.raises(ablate.ConfigError, match=r"^model\.d_ff: has no effect .*\(1 more\)$"):
        ablate.train({"preset": "lstm", "model": {"heads": 2, "d_ff": 64}})


# Counts of processes no run takes: zero and below, not finite, not whole, not a number; the API's are
# Python values, checked strictly (a bool or a numeric string is no count), the command line's its text.
BAD_COUNTS = [0, -1, -3, -(2**63), math.inf, -math.inf, math.nan, 2.5, 1.0, True, "2", [2]]
BAD_COUNT_TEXTS = ["0", "-1", "-3", str(-(2**63)), "inf", "-inf", "nan", "2.5", "1e3", "0x10", "two", ""]


@pytest.mark.parametrize("option", ["workers", "per_device"])
@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_a_count_out_of_range_is_a_config_error_naming_it_before_anything_is_created(tmp_path, option, value):
    study = ablate.load_study(write_study(tmp_path / "tiny.yaml"), out=tmp_path / "runs")
    with pytest.raises(ablate.ConfigError, match=f"^--{option.replace('_', '-')}: "):
        study.run(**{option: value}, wandb="disabled")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", ["--workers", "--per-device"])
@pytest.mark.parametrize("value", BAD_COUNT_TEXTS)
def test_the_command_line_refuses_the_same_counts_in_one_line(tmp_path, flag, value):
    study = write_study(tmp_path / "tiny.yaml")
    result = CliRunner().invoke(app, ["sweep", str(study), flag, value, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {flag}: ")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", [["worker", "tiny"], ["bench", "--quick"]], ids=["worker", "bench"])
@pytest.mark.parametrize("value", BAD_COUNT_TEXTS)
def test_threads_out_of_range_are_one_line_as_every_count(tmp_path, command, value):
    """--threads of worker and bench: one line from the same kind of schema, not click's usage box."""
    result = CliRunner().invoke(app, [*command, "--threads", value, "--out", str(tmp_path / "runs")]
                                if command[0] == "worker" else [*command, "--threads", value])  # fmt: skip
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --threads: ")
    assert not (tmp_path / "runs").exists()


def test_more_workers_than_any_machine_holds_are_refused_by_both(tmp_path):
    study, huge = write_study(tmp_path / "tiny.yaml"), 10**30
    with pytest.raises(ablate.ConfigError, match=f"^--workers: {huge} worker processes exceed this machine"):
        ablate.load_study(study, out=tmp_path / "runs").run(workers=huge)
    result = CliRunner().invoke(
        app, ["sweep", str(study), "--workers", str(huge), "--out", str(tmp_path / "runs")]
    )
    assert result.exit_code == 2 and result.stderr.startswith(
        f"error: --workers: {huge} worker processes exceed"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf"])
def test_a_time_limit_that_is_no_positive_number_of_seconds_is_refused_by_both(tmp_path, value):
    study = write_study(tmp_path / "tiny.yaml")
    result = CliRunner().invoke(app, ["sweep", str(study), "--time-limit", value, "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: --time-limit: ")
    number = {"0": 0, "-5": -5}.get(value)
    if number is not None:
        with pytest.raises(ablate.ConfigError, match="^--time-limit: Input should be greater than 0"):
            ablate.load_study(study, out=tmp_path / "runs").run(time_limit=number)
    assert not (tmp_path / "runs").exists()


def test_a_time_limit_is_for_the_workers_a_sweep_starts_not_a_schedulers(tmp_path):
    study = write_study(tmp_path / "tiny.yaml")
    result = CliRunner().invoke(app, ["sweep", str(study), "--time-limit", "500", "--launcher", "slurm",
                                      "--out", str(tmp_path / "runs")])  # fmt: skip
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.strip() == (
        "error: --time-limit: stops the workers this command starts (the local launcher); slurm's scheduler "
        "holds its own time limit"
    )
    assert not (tmp_path / "runs").exists()


def test_options_of_the_wrong_type_are_config_errors_naming_them(tmp_path):
    study = write_study(tmp_path / "tiny.yaml")
    with pytest.raises(ablate.ConfigError, match=r"^--storage: Input should be a valid string"):
        ablate.load_study(study, storage=3, out=tmp_path / "runs")
    with pytest.raises(ablate.ConfigError, match=r"^--allow-large: Input should be a valid boolean"):
        ablate.load_study(study, allow_large="yes", out=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A two-variant, two-seed study with one claim, run through the API with two workers."""
    root = tmp_path_factory.mktemp("api")
    study = ablate.load_study(write_study(root / "tiny.yaml", claims=[CLAIM]), out=root / "runs")
    report = study.run(workers=2, wandb="disabled")
    return study, report


@pytest.mark.slow
def test_a_run_gives_every_trial_once_the_claims_the_report_gives_and_its_report(tiny_run):
    study, report = tiny_run
    assert report == study.report_path and report.is_file()
    df = study.results()
    assert isinstance(df, pd.DataFrame)
    done = df[df["state"] == "COMPLETE"]
    assert sorted(zip(done["variant"], done["seed"])) == [("lstm", 0), ("lstm", 1), ("transformer", 0),
                                                          ("transformer", 1)]  # fmt: skip
    assert done["test/tok_acc"].between(0, 1).all() and done["test/seq_acc"].between(0, 1).all()
    # The report's table holds the same trials and numbers.
    csv = pd.read_csv(report.parent / "results.csv").set_index("trial")
    for column in ("variant", "seed", "state", "test/tok_acc"):
        assert csv.loc[df["trial"], column].tolist() == df[column].tolist(), column

    (claim,) = study.claims()
    assert claim.claim.text == CLAIM["text"] and claim.n_compare == claim.n_to == 2
    assert claim.ci_low <= claim.diff <= claim.ci_high
    row = next(line for line in (report.parent / "report.md").read_text().splitlines()
               if line.startswith(f"| {CLAIM['text']} |"))  # fmt: skip
    assert re.search(r"\| \*\*(.+?)\*\* \|", row)[1] == claim.verdict


@pytest.mark.slow
def test_running_again_resumes_and_runs_nothing_twice(tiny_run):
    study, _ = tiny_run
    before = study.results()
    again = ablate.load_study(study.source, out=study.options.out)
    again.run(workers=1, wandb="disabled", report=False)
    assert again.results()[["trial", "state"]].equals(before[["trial", "state"]])
    (study.report_path.parent / "report.md").unlink()
    assert study.report() == study.report_path and (study.report_path.parent / "report.md").is_file()


@pytest.mark.slow
def test_a_storage_holding_another_version_of_the_study_is_refused(tiny_run):
    study, _ = tiny_run
    changed = write_study(study.options.out.parent / "changed.yaml", seeds=[0, 1, 2])
    with pytest.raises(ablate.ConfigError, match=r"already holds study 'tiny' with a different seeds"):
        ablate.load_study(changed, out=study.options.out).run(workers=1, wandb="disabled")


def test_train_returns_the_metrics_ablate_train_json_prints(tmp_path, tiny_tree):
    metrics = ablate.train(
        tiny_tree, preset="transformer", sets={"seed": 3}, out=tmp_path / "t", progress=False
    )
    assert 0 <= metrics["test/seq_acc"] <= metrics["test/tok_acc"] <= 1
    assert metrics["steps"] == TINY_TRAIN["max_steps"] and metrics["params"] > 0
    assert (tmp_path / "t" / "metrics.json").is_file()
    config = tmp_path / "lstm.yaml"
    lstm_model = {k: v for k, v in tiny_tree["model"].items() if k not in ("heads", "d_ff")}
    config.write_text(yaml.safe_dump({**tiny_tree, "model": lstm_model, "preset": "lstm"}))
    from_file = ablate.train(config, sets={"train.max_steps": 2}, progress=False)
    assert from_file["steps"] == 2 and from_file["params"] != metrics["params"]
    # A built config holds every key; only what is set on top of it is checked.
    built = ablate.train(ExperimentConfig.model_validate({**tiny_tree, "model": {**lstm_model, "arch": "lstm"}}),
                         sets={"train.max_steps": 2}, progress=False)  # fmt: skip
    assert built["steps"] == 2


@pytest.mark.slow
def test_interrupting_a_run_checkpoints_its_trials_and_the_same_call_resumes_them(tmp_path):
    """A notebook's stop button is SIGINT to the kernel alone: the run forwards it to its workers, whose
    trial checkpoints and waits again (never FAILED), and raises KeyboardInterrupt; the same call resumes."""
    study, runs = write_long_study(tmp_path / "crash.yaml", max_steps=200, seeds=[0]), tmp_path / "runs"
    url = f"sqlite:///{runs / 'crash' / 'study.db'}"
    call = f"import ablate; ablate.load_study({str(study)!r}, out={str(runs)!r}).run(1, wandb='disabled')"
    proc = background([sys.executable, "-c", call])
    wait_for(lambda: resume_record(url, study, 0), 240, "the first periodic checkpoint", poll=0.1)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.monotonic() - sent < 30
    proc.log.seek(0)
    out = proc.log.read()
    assert proc.returncode != 0 and out.rstrip().endswith("KeyboardInterrupt"), out[-2000:]
    said = "interrupted: workers checkpointed their trials and stopped; the same call resumes them"
    assert said in " ".join(out.split()), out[-2000:]  # rich wraps lines at 80 columns off a terminal
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.WAITING
    stopped_at = trial.user_attrs["resume"]["step"]

    finish(background([sys.executable, "-c", call]))
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["resumed_from_step"] == stopped_at


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_ablate_worker_and_study_run_join_run_and_report_by_one_path(tmp_path, monkeypatch):
    """`ablate worker FILE` and Study.run join the study with sweep.join_study and write the report with
    sweep.write_report, and Study.run's workers are `ablate worker` processes (ablate.worker.work): a path
    of either's own would miss these records."""
    from ablate import sweep as sweep_module
    from ablate import worker as worker_module
    from ablate.harness.launchers.commands import worker_args

    joined, reported, worked = [], [], []
    for module in (sweep_module, worker_module):
        join, report = module.join_study, module.write_report
        monkeypatch.setattr(module, "join_study", lambda *a, join=join: joined.append(a[1].name) or join(*a))
        monkeypatch.setattr(module, "write_report", lambda *a, report=report: reported.append(a[2]) or report(*a))
    work = worker_module.work
    monkeypatch.setattr(worker_module, "work", lambda *a: worked.append(a[0]) or work(*a))
    study = write_study(tmp_path / "tiny.yaml", variants={"transformer": {"preset": "transformer"}}, seeds=[0])

    alone = CliRunner().invoke(app, ["worker", str(study), "--out", str(tmp_path / "worker"), "--wandb", "disabled"])
    assert alone.exit_code == 0, alone.output
    assert (joined, reported, worked) == (["tiny"], [tmp_path / "worker"], [str(study)])

    html = ablate.load_study(study, out=tmp_path / "run").run(workers=1, wandb="disabled")
    assert (joined, reported) == (["tiny", "tiny"], [tmp_path / "worker", tmp_path / "run"])
    assert html == tmp_path / "run" / "tiny" / "report" / "report.html" and html.is_file()
    assert worker_args("tiny", tmp_path, "disabled", 1)[0] == "worker"  # the command the local launcher runs
