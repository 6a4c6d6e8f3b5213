"""End to end: a study file through `ablate sweep` to the three report files, then `ablate report` from
the storage alone."""

from __future__ import annotations

import json
import re
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.request

import optuna
import pandas as pd
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, ablate_exe
from test_tracking import offline_run
from typer.testing import CliRunner

from ablate.cli import app


def write_study(path, **extra):
    study = {
        "name": "tiny",
        "description": "two variants, two seeds, a few steps",
        "base": {"task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "variants": {"lstm": {"preset": "lstm"}, "transformer": {"preset": "transformer"}},
        "seeds": [0, 1],
        "metric": {"name": "test/tok_acc", "direction": "maximize"},
        **extra,
    }
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_workers_do_not_import_from_the_working_folder(tmp_path):
    """`--out .` makes a study named `bottleneck` a folder in the working folder, which pandas imports as its
    optional `bottleneck` module in a worker started with `python -m` (cwd first on sys.path); a stray
    `torch.py` there would shadow torch the same way. Workers start with -P, so neither is seen."""
    study = write_study(tmp_path / "bottleneck.yaml", name="bottleneck", variants={"lstm": {"preset": "lstm"}},
                        seeds=[0])  # fmt: skip
    cwd = tmp_path / "cwd"
    (cwd / "bottleneck").mkdir(parents=True)
    (cwd / "torch.py").write_text('raise ImportError("torch.py of the working folder was imported")\n')
    proc = ablate("sweep", str(study), "--out", ".", "--wandb", "disabled", "--workers", "1", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (cwd / "bottleneck" / "report" / "results.csv").is_file()


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_sweep_writes_report_and_report_rebuilds_from_storage(tmp_path):
    study = write_study(tmp_path / "tiny.yaml")
    runs = tmp_path / "runs"
    proc = ablate("sweep", str(study), "--out", str(runs), "--wandb", "offline", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]

    report = runs / "tiny" / "report"
    for name in ("report.html", "report.md", "results.csv", "metric_by_variant.png"):
        assert (report / name).stat().st_size > 0, name
    df = pd.read_csv(report / "results.csv")
    assert sorted(zip(df["variant"], df["seed"])) == [
        ("lstm", 0),
        ("lstm", 1),
        ("transformer", 0),
        ("transformer", 1),
    ]
    assert (df["state"] == "COMPLETE").all()
    assert df["test/tok_acc"].between(0, 1).all() and df["params"].gt(0).all()
    # The workers say one line per finished trial, with its metric, and none of Lightning's notices.
    for variant, seed, value in zip(df["variant"], df["seed"], df["test/tok_acc"]):
        assert f"{variant}/seed={seed}: test/tok_acc = {value:.4g} (" in proc.stdout
    assert "GPU available" not in proc.stdout + proc.stderr and "Restoring states" not in proc.stderr
    assert "Symlinked" not in proc.stderr
    md = (report / "report.md").read_text()
    assert "| lstm | 2 |" in md and "| transformer | 2 |" in md

    # Two worker processes shared the grid: every trial has its own offline W&B run, grouped by study,
    # named variant + seed, tagged and configured with the trial's factors and full config.
    storage = f"sqlite:///{runs / 'tiny' / 'study.db'}"
    trials = optuna.load_study(study_name="tiny:eval", storage=storage).trials
    assert sorted(t.user_attrs["grid_point"] for t in trials) == [
        "lstm/seed=0", "lstm/seed=1", "transformer/seed=0", "transformer/seed=1"
    ]  # fmt: skip
    wandb_runs = {r["name"]: r for r in map(offline_run, (runs / "tiny" / "wandb").glob("offline-run-*"))}
    assert len(wandb_runs) == 4
    for run_dir in (runs / "tiny" / "wandb").glob("offline-run-*"):  # the attention arrays travel along
        assert sorted(p.name for p in (run_dir / "files" / "attention").glob("*.npz"))[0] == "probe0_test.npz"
    for t in trials:
        run = wandb_runs[f"{t.params['variant']}-seed{t.user_attrs['seed']}"]
        assert (run["group"], run["job_type"], run["exit_code"]) == ("tiny", "eval", 0)
        assert run["config"] == t.user_attrs["config"] and run["config"]["seed"] == t.user_attrs["seed"]

    proc = ablate("status", "tiny", "--out", str(runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"lstm\s.*2/2\s.*0\s.*0\s.*0", proc.stdout) and "finished" in proc.stdout

    # The storage alone rebuilds the report: remove the report and every trial folder first.
    shutil.rmtree(report)
    shutil.rmtree(runs / "tiny" / "trials")
    proc = ablate("report", "tiny", "--out", str(runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"report built in \d+\.\d s:", proc.stderr), proc.stderr  # the console writes to stderr
    rebuilt = pd.read_csv(report / "results.csv")
    pd.testing.assert_frame_equal(rebuilt, df)

    # Resuming a finished sweep runs nothing new.
    proc = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--no-report")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with sqlite3.connect(runs / "tiny" / "study.db") as db:
        assert db.execute("select count(*) from trials").fetchone()[0] == 4


def test_bad_study_fails_before_creating_anything(tmp_path):
    runs = tmp_path / "runs"
    bad = write_study(tmp_path / "bad.yaml", variants={"x": {"model.heads": 3}})
    proc = ablate("sweep", str(bad), "--out", str(runs))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {bad}: variants.x.model.heads: must divide d_model=16 (got heads=3)"
    ]
    assert not runs.exists()

    proc = ablate("report", "nothing-here", "--out", str(runs))
    assert proc.returncode == 2 and "nothing-here" in proc.stderr
    assert not runs.exists()


def test_train_json_prints_metrics_last(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump({"task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN}))
    out = tmp_path / "run"
    proc = ablate("train", str(cfg), "--preset", "transformer", "--set", "train.max_steps=3", "--json",
                  "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"test/seq_acc", "test/tok_acc", "test_long/seq_acc", "val/loss", "params", "wall_time"} <= set(
        summary
    )
    assert summary["split_sizes"] == {"train": 64, "valid": 16, "test": 16, "test_long": 16}
    assert 0.0 <= summary["padding_fraction"] < 1.0
    # The run keeps what reads its outputs: the vocabularies, ids 0-3 the specials.
    assert json.loads((out / "data" / "tgt_vocab.json").read_text())[:4] == ["<pad>", "<s>", "</s>", "<unk>"]

    proc = ablate("train", "--set", "model.bogus=1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: model.bogus: unknown config key"


def test_dashboard_names_the_study_storage_and_artifacts(tmp_path):
    runs = tmp_path / "runs"
    (runs / "tiny").mkdir(parents=True)
    (runs / "tiny" / "study.db").touch()
    result = CliRunner().invoke(app, ["dashboard", "--out", str(runs), "--port", "8123", "--dry-run"])
    assert result.exit_code == 0, result.output
    db, files = (runs / "tiny" / "study.db").resolve(), runs / "tiny" / "artifacts"
    assert result.stdout.strip() == (
        f"optuna-dashboard on http://127.0.0.1:8123: storage sqlite:///{db}, artifacts {files}"
    )
    result = CliRunner().invoke(app, ["dashboard", "missing", "--out", str(runs), "--dry-run"])
    assert result.exit_code == 2 and "no such database" in result.stderr
    # A password, from the option or the environment, is never printed.
    url = "postgresql://ablate:s3cret@db.example/studies"
    for args, env in ((["--storage", url], {}), ([], {"ABLATE_STORAGE": url})):
        args += ["--artifacts", "s3://b/p", "--dry-run"]
        result = CliRunner().invoke(app, ["dashboard", "tiny", *args], env=env)
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == (
            "optuna-dashboard on http://127.0.0.1:8080: storage postgresql://ablate:***@db.example/studies, "
            "artifacts s3://b/p/tiny"
        )


@pytest.mark.slow
def test_dashboard_serves_the_study_on_loopback(tmp_path):
    runs = tmp_path / "runs"
    (runs / "tiny").mkdir(parents=True)
    optuna.create_study(study_name="tiny:eval", storage=f"sqlite:///{runs / 'tiny' / 'study.db'}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [ablate_exe(), "dashboard", "tiny", "--out", str(runs), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline, body = time.monotonic() + 60, ""
        while time.monotonic() < deadline and "tiny:eval" not in body:
            try:
                body = (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2).read().decode()
                )
            except OSError:
                time.sleep(0.5)
        assert "tiny:eval" in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # The server was `ablate` itself: stopping it stopped the server (a child process would serve on).
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2)
