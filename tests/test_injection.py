"""Hostile names and paths in the command lines and scripts the project builds: a study's name, the --out
folder and the working folder reach `ablate worker`, sbatch and srun as the values they are, never as an
option or a shell line; what sbatch cannot carry is refused before anything is made.

The SLURM cases run the batch script as a job would (bash, with a stand-in `srun` and `scontrol` on PATH
that record their arguments) for every hostile fragment in every place, so a value that became shell
would run `touch PWNED`. The real cluster's case is in tests/test_launchers.py."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ablate, study_trials
from optuna.trial import TrialState
from test_launchers import recorded_args, write_study

from ablate.harness.launchers import slurm
from ablate.harness.launchers.commands import worker_args
from ablate.harness.study.validate import load_study
from ablate.schema.spec import StudySpec

# What shell, sbatch's #SBATCH lines or its filename patterns would misread: a line break followed by a
# command, quotes, command substitution, blanks, comment and pattern characters, a glob, non-ASCII, a byte
# that is no UTF-8 (as Python names it in a path), and what reads as an option.
LINE_BREAK, NOT_UTF8 = "\ntouch PWNED;", "\udcff"
FRAGMENTS = [LINE_BREAK, "'", '"', "$(touch PWNED)", "`touch PWNED`", " ", "#", ";", "*", "%", "%A", "\\",
             "é→", NOT_UTF8, "-", "--help"]  # fmt: skip
PLACES = ["name", "out", "workdir", "sbatch item"]
# Refused before anything is made: by the study's name check, the launcher's options, or its problems().
REFUSED = {*itertools.product(["name", "sbatch item"], [LINE_BREAK, NOT_UTF8]), ("out", "\\")}
URL = "postgresql://ablate@db.example:5432/studies"

OPTION_LIKE_NAMES = ["--help", "-h", "--no-report", "--out=x"]


# Names that read as options ----------------------------------------------------------------------------


# The first name by default, the others (11 s of processes each on 2 cores) under -m slow.
@pytest.mark.parametrize(
    "name", [OPTION_LIKE_NAMES[0], *(pytest.param(n, marks=pytest.mark.slow) for n in OPTION_LIKE_NAMES[1:])]
)
def test_a_study_named_like_an_option_runs_every_trial(tmp_path, name):
    """Its workers are started as `ablate worker [options] -- NAME`: without the `--`, a study named --help
    printed the worker's help, exited 0 and left its trials WAITING."""
    study = write_study(tmp_path / "study.yaml", name=name, factors={}, seeds=[0, 1])
    runs = tmp_path / "runs"
    done = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--workers", "1",
                  "--no-report")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    url = f"sqlite:///{runs / load_study(study).slug / 'study.db'}"
    assert [t.state for t in study_trials(study, url)] == [TrialState.COMPLETE] * 2


@pytest.mark.parametrize("name", [*OPTION_LIKE_NAMES, "--", "-", "grid"])
@pytest.mark.parametrize("runs", ["-runs", "--help", "a b=c"])
def test_worker_arguments_parse_back_to_the_values_given(name, runs):
    from typer.main import get_command

    from ablate.cli import app

    args = worker_args(name, runs, "disabled", 2, "s3://bucket/-x")
    params = get_command(app).commands["worker"].make_context("worker", args[1:]).params
    assert (params["study"], params["out"], params["artifacts"]) == (name, Path(runs), "s3://bucket/-x")
    assert (params["threads"], params["no_report"], params["stored"]) == ("2", True, True)


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_study_named_like_a_file_is_the_stored_one_whatever_files_lie_about(tmp_path):
    """A worker started for study `named.yaml` runs it, not the study in a file of that name in its folder."""
    study = write_study(tmp_path / "study.yaml", name="named.yaml", factors={}, seeds=[0])
    write_study(tmp_path / "named.yaml", name="decoy", factors={}, seeds=[0])
    runs = tmp_path / "runs"
    done = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--workers", "1",
                  "--no-report", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    url = f"sqlite:///{runs / load_study(study).slug / 'study.db'}"
    assert [t.state for t in study_trials(study, url)] == [TrialState.COMPLETE]
    assert not (runs / "decoy").exists()


# SLURM ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_srun(fake_sbatch) -> Path:
    """`srun` and `scontrol` beside the fake sbatch, recording their arguments as it does; srun exits with
    FAKE_SRUN_EXIT (0 unless set)."""
    bin_dir, record = fake_sbatch.parent / "bin", fake_sbatch.parent / "job-record"
    for command, code in (("srun", "${FAKE_SRUN_EXIT:-0}"), ("scontrol", "0")):
        record_and_exit = f"printf '%s\\0' \"$@\" > {record}.{command}\nexit {code}\n"
        (bin_dir / command).write_text(f"#!/bin/sh\n{record_and_exit}")
        (bin_dir / command).chmod(0o755)
    return record


def run_as_a_job(script: Path, folder: Path, srun_exit: int) -> subprocess.CompletedProcess:
    """The batch script as SLURM runs it for array task 0 of job 4242, in `folder`."""
    env = {**os.environ, "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "0",
           "FAKE_SRUN_EXIT": str(srun_exit)}  # fmt: skip
    return subprocess.run(["bash", str(script)], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("place", "fragment"), [p for p in itertools.product(PLACES, FRAGMENTS) if p not in REFUSED]
)
def test_hostile_values_reach_sbatch_and_srun_intact_and_nothing_runs(
    tmp_path, monkeypatch, fake_sbatch, fake_srun, place, fragment
):  # fmt: skip
    name = f"{fragment}grid{fragment}" if place == "name" else "grid"
    out = tmp_path / (f"runs{fragment}x" if place == "out" else "runs")
    workdir = tmp_path / (f"work{fragment}x" if place == "workdir" else "work")
    item = f"--comment=c{fragment}" if place == "sbatch item" else "--comment=c"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    spec = load_study(write_study(tmp_path / "study.yaml", name=name))
    options = slurm.Options(workers=2, cpus=3, sbatch=[item])
    assert slurm.problems(options, URL, out) == []
    assert item in recorded_args(fake_sbatch, "test-args")  # one argument of the check, as given

    slurm.start(spec, URL, out, "disabled", None, options)
    logs = out.resolve() / spec.slug / "slurm"
    args = recorded_args(fake_sbatch)
    assert f"--output={str(logs).replace('%', '%%')}/%A_%a.log" in args  # '%%': sbatch's literal '%'
    assert f"--chdir={workdir}" in args and item in args and args[-1] == str(logs / "job.sh")
    assert f"--job-name=ablate-{spec.slug}" in args

    script = logs / "job.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    job = run_as_a_job(script, tmp_path, srun_exit=143)  # the workers stopped by SIGTERM: the task requeues
    assert job.returncode == 0, job.stderr
    worker = [sys.executable, "-P", "-m", "ablate.cli", "worker", "--stored", f"--out={out.resolve()}",
              "--wandb=disabled", "--threads=3", "--", name]  # fmt: skip
    assert recorded_args(fake_srun, "srun") == ["--kill-on-bad-exit=0", *worker]
    assert recorded_args(fake_srun, "scontrol") == ["requeue", "4242_0"]
    assert not [p for p in tmp_path.rglob("PWNED")], "a value ran as a command"


def test_what_sbatch_cannot_carry_is_refused_before_anything_is_made(tmp_path, fake_sbatch):
    """A backslash in the log folder turns off sbatch's %A_%a (no task would write its log); a line break or
    a byte that is no text in an `sbatch` item, or an item that is not one long option, or one that gives
    what the launcher decides."""
    runs = tmp_path / "back\\slash"
    study = write_study(tmp_path / "study.yaml")
    refused = ablate("sweep", str(study), "--out", str(runs), "--launcher", "slurm", "--wandb", "disabled",
                     "--storage", URL)  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: --out: {runs}: slurm cannot carry a backslash in the log folder's path; choose a folder "
        "without one"
    ]
    assert not runs.exists() and not Path(f"{fake_sbatch}.args").exists()

    for item, reason in [
        ("--comment=a\n#SBATCH --wrap=x", "each item is one sbatch option"),
        ("--comment=a\udcff", "each item is one sbatch option"),
        ("-A lab", "each item is one sbatch option"),
        ("--mem 16G", "each item is one sbatch option"),
        ("--wrap=touch PWNED", "'--wrap=touch PWNED': the launcher decides --wrap"),
        ("--out=/x", "'--out=/x': the launcher decides --output"),  # sbatch takes a prefix of a name
        ("--arr=0-9", "'--arr=0-9': the key tasks sets --array"),
        ("--no-requeue", "'--no-requeue': the launcher decides --no-requeue"),  # would outvote --requeue
        ("--wait", "'--wait': the launcher decides --wait"),  # sbatch would block past its timeout
        ("--export-file=/x", "the launcher decides --export-file"),  # the job's environment is the sweep's
        ("--comment", "'--comment': give its value as --comment=VALUE"),  # would take the script as its value
    ]:
        with pytest.raises(ValueError, match="sbatch") as e:
            slurm.Options(sbatch=[item])
        assert reason in str(e.value), item
    assert slurm.Options(sbatch=["--exclusive", "--hold"]).sbatch == ["--exclusive", "--hold"]  # flags
    for word in ("gpu debug", "gpu\n#SBATCH --wrap=x", ""):
        with pytest.raises(ValueError, match="expected one word"):
            slurm.Options(partition=word)


def test_a_study_name_stays_inside_the_batch_scripts_comment(tmp_path, fake_srun):
    """The name is written in the comment as Python writes a string, on one line: a line break in it cannot
    end the comment, nor start an #SBATCH line among the comments before the first command, where sbatch
    reads its options. The study file refuses such a name first; the script does not rely on it."""
    name = "x\n#SBATCH --wrap='touch PWNED'\ntouch PWNED"
    with pytest.raises(ValueError, match="name"):
        StudySpec.model_validate({"name": name, "base": {"task": {"name": "reverse"}}, "seeds": [0]})
    script = tmp_path / "job.sh"
    script.write_text(slurm.batch_script(name, ["w", "--", name], slurm.Options()))
    assert f"for study {name!r}: each" in script.read_text()
    lines = script.read_text().splitlines()
    header = itertools.takewhile(lambda line: not line.strip() or line.startswith("#"), lines)
    assert not [line for line in header if line.startswith("#SBATCH")]
    assert run_as_a_job(script, tmp_path, srun_exit=0).returncode == 0
    assert recorded_args(fake_srun, "srun") == ["--kill-on-bad-exit=0", "w", "--", name]
    assert not [p for p in tmp_path.rglob("PWNED")], "the name ran as a command"


def test_an_sbatch_answering_in_another_encoding_is_still_one_line(tmp_path, monkeypatch):
    """sbatch's complaint in Latin-1 (a site's locale) is read, undecodable bytes replaced, not a traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_bytes(b"#!/bin/sh\nprintf 'sbatch: error: partition caf\\351 unknown\\n' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ((where, what),) = slurm.scheduler_problems(slurm.Options())
    assert where == "--launcher" and what == "slurm: sbatch --test-only refuses the job: partition caf\ufffd unknown"
