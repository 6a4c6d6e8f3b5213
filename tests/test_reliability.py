"""What long sweeps on shared machines need: a worker killed mid-trial costs one retry and nothing else,
faults end as FAIL with their reason while the sweep goes on, W&B without network never blocks and never
leaks the key, the same config and seed give the same numbers in two processes, and the faults that scale
brings (more workers than the machine holds, a killed sweep, a full storage disk, an unreachable artifact
store, a stop on a loaded machine) end in one line, with no trial left RUNNING where one can be saved.

The crash scenario runs here on the SQLite default and in test_postgres.py on PostgreSQL."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy.exc
import torch
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, ablate_exe, study_trials
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState
from test_workers import tiny_spec

from ablate.harness import jobs as harness_jobs
from ablate.harness import provenance, tracking
from ablate.harness import trial as harness_trial
from ablate.harness import workers as harness_workers
from ablate.harness.study.queue import load_phase_study, prepare_study
from ablate.harness.study.storage import open_storage
from ablate.harness.study.validate import load_study
from ablate.harness.workers import run_worker
from ablate.models.module import Seq2SeqModule
from ablate.reports.render import build_report
from ablate.schema.errors import ConfigError
from ablate.schema.trials import EVAL, grid_point


def start_worker(study: Path, runs: Path, *extra: str) -> subprocess.Popen:
    """`ablate worker` in the background, as a user on another shell or machine would start it."""
    command = [ablate_exe(), "worker", str(study), "--out", str(runs), "--wandb", "disabled",
               "--threads", "1"]  # fmt: skip
    return background([*command, *extra])


def sigint_as_a_terminal_gives_it() -> None:
    """A script's `cmd &` or nohup starts its children with SIGINT ignored, and Python then raises no
    KeyboardInterrupt; Ctrl-C and a notebook's stop button meet a process whose SIGINT is the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def background(command: list[str]) -> subprocess.Popen:
    log = tempfile.TemporaryFile("w+")  # not a pipe: nobody reads a process's output until it is done
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=sigint_as_a_terminal_gives_it,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    proc.log = log
    return proc


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    """Waits for a worker; its output, which must show a clean exit."""
    proc.wait(timeout=timeout)
    proc.log.seek(0)
    out = proc.log.read()
    assert proc.returncode == 0, out[-3000:]
    return out


def write_study(path: Path, max_steps: int = 60, **extra) -> Path:
    # Periodic checkpoints at steps 20 and 40; deterministic, so a resumed trial can match a whole one.
    train = {
        **TINY_TRAIN,
        "max_steps": max_steps,
        "val_every": 10,
        "checkpoint_every": 20,
        "deterministic": True,
    }
    tree = {
        "name": "crash",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": train},
        "seeds": [0, 1, 2],
        "metric": {"name": "test/tok_acc"},
        # A dead worker's trial is noticed after 3 s instead of the default minute.
        "heartbeat": {"interval": 1, "grace": 3},
        **extra,
    }
    path.write_text(yaml.safe_dump(tree))
    return path


def wait_for(condition, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def resume_record(url: str, study: Path, number: int) -> dict | None:
    """Trial `number`'s stored resume checkpoint, once the worker has created the study and the trial."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None
    # KeyError: the study is not created yet; a locked database (the worker is writing): look again next poll.
    with contextlib.suppress(KeyError, ConfigError, sqlalchemy.exc.OperationalError, StorageInternalError):
        trials = study_trials(study, url)
        return trials[number].user_attrs.get("resume") if len(trials) > number else None
    return None


def uninterrupted_history(study: Path, seed: int) -> list[dict]:
    """The validation history of the study's trial for `seed`, run here without interruption."""
    spec = load_study(study)
    torch.set_num_threads(1)  # as the workers run
    return harness_trial.run_trial(spec.config_for(spec.variant_overrides()["base"], seed)).history


def kill_mid_trial_and_recover(tmp_path: Path, storage_url: str | None) -> None:
    """Worker A completes trial 0 and is SIGKILLed while trial 1 trains (its first periodic checkpoint
    stored); worker B, started at once, runs trial 2, waits out the grace period, fails trial 1 and runs its
    retry, which resumes at that checkpoint's step and ends exactly where an uninterrupted run does.
    `storage_url` None: the study's default SQLite file."""
    study, runs = write_study(tmp_path / "crash.yaml"), tmp_path / "runs"
    extra = ("--storage", storage_url) if storage_url else ()
    url = storage_url or f"sqlite:///{runs / 'crash' / 'study.db'}"
    a = start_worker(study, runs, *extra)
    try:
        killed_at = wait_for(lambda: resume_record(url, study, 1), 240, "trial 1's checkpoint", poll=0.1)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        a.kill()
    spec, storage = load_study(study), open_storage(url, create_dir=False)
    before = {t.number: t for t in load_phase_study(spec, storage, EVAL).get_trials()}
    assert before[0].state == TrialState.COMPLETE and before[1].state == TrialState.RUNNING

    started = time.monotonic()
    b = start_worker(study, runs, *extra)
    finish(b)
    assert time.monotonic() - started < 240

    trials = load_phase_study(spec, storage, EVAL).get_trials()
    assert TrialState.RUNNING not in [t.state for t in trials]  # no zombie
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["grid_point"] for t in done) == [grid_point("base", s) for s in (0, 1, 2)]
    # The completed trial is untouched; the killed one failed once and its retry (by B) completed.
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == before[0].value
    assert trials[0].user_attrs["artifacts"] == before[0].user_attrs["artifacts"]
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["worker"].endswith(f":{a.pid}")
    (retry,) = [t for t in trials if t.system_attrs.get("retry_history")]
    assert retry.system_attrs["retry_history"] == [1] and retry.state == TrialState.COMPLETE
    assert retry.user_attrs["grid_point"] == trials[1].user_attrs["grid_point"]
    assert retry.user_attrs["worker"].endswith(f":{b.pid}")
    assert len(trials) == 4
    resumed = json.loads((runs / f"crash/trials/eval/{retry.number:04d}/metrics.json").read_text())
    # The last checkpoint A stored: the first (or, if A got that far before the kill landed, the second).
    assert resumed["resumed_from_step"] == trials[1].user_attrs["resume"]["step"] in (killed_at["step"], 40)
    assert resumed["steps"] == 60
    assert resumed["history"] == uninterrupted_history(study, 1)  # val/loss at every step, bit for bit


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_killed_worker_trial_is_retried_on_sqlite(tmp_path):
    kill_mid_trial_and_recover(tmp_path, None)


@pytest.mark.slow  # about 1.5 min each on 2 busy cores
@pytest.mark.parametrize(
    ("command", "signum"),
    [("worker", signal.SIGTERM), ("worker", signal.SIGINT), ("sweep", signal.SIGTERM)],
)
def test_stop_signal_checkpoints_the_trial_and_the_same_command_resumes_it(tmp_path, command, signum):
    """A scheduler's SIGTERM (or Ctrl-C) mid-trial: the trial saves its state and waits again (never
    FAILED), the process says so in one line within 30 s, and the same command finishes from there."""
    study, runs = write_study(tmp_path / "crash.yaml", max_steps=200, seeds=[0]), tmp_path / "runs"
    url = f"sqlite:///{runs / 'crash' / 'study.db'}"
    start = start_worker if command == "worker" else start_sweep
    proc = start(study, runs)
    wait_for(lambda: resume_record(url, study, 0), 240, "the first periodic checkpoint", poll=0.1)
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=30)
    assert time.monotonic() - sent < 30
    proc.log.seek(0)
    lines = proc.log.read().strip().splitlines()
    assert proc.returncode == 128 + signum, lines[-5:]
    assert "checkpointed" in lines[-1] and signum.name in lines[-1], lines[-5:]
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.WAITING
    stopped_at = trial.user_attrs["resume"]["step"]
    assert 20 <= stopped_at < 200

    again = start(study, runs)
    finish(again)
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["resumed_from_step"] == stopped_at
    metrics = json.loads((runs / "crash/trials/eval/0000/metrics.json").read_text())
    assert metrics["steps"] == 200 and metrics["resumed_from_step"] == stopped_at
    # A finished trial's resume checkpoints are gone, locally and from the artifact store.
    assert not list(runs.rglob("resume.ckpt")) and not list((runs / "crash/artifacts").glob("resume-*"))


@pytest.mark.slow  # a minute or two: a trial longer than its command's time limit, in several commands
def test_a_trial_longer_than_a_time_limit_finishes_in_commands_that_each_continue_the_last(tmp_path):
    """`ablate sweep --time-limit`: each command stops its worker at the limit (the trial checkpointed and
    queued, exit 75, one line saying so) and the same command continues it, until one finishes (exit 0)."""
    study, runs = write_study(tmp_path / "crash.yaml", max_steps=8000, seeds=[0]), tmp_path / "runs"
    tree = yaml.safe_load(study.read_text())
    tree["base"]["train"].update(val_every=1000, checkpoint_every=1000)  # some seconds of steps between
    study.write_text(yaml.safe_dump(tree))
    url = f"sqlite:///{runs / 'crash' / 'study.db'}"
    command = [ablate_exe(), "sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--no-report",
               "--time-limit", "20"]  # fmt: skip
    stops = []
    for _ in range(12):
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
        if done.returncode == 0:
            break
        assert done.returncode == 75, done.stderr[-2000:]
        assert "--time-limit 20 s reached with 1 trial(s) left" in done.stderr.strip().splitlines()[-1]
        (trial,) = study_trials(study, url)
        assert trial.state == TrialState.WAITING
        stops.append((trial.user_attrs.get("resume") or {}).get("step", 0))
    else:
        raise AssertionError(f"not finished after 12 commands; stopped at steps {stops}")
    assert stops and stops == sorted(stops) and stops[-1] > 0  # each continued the last
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["resumed_from_step"] == stops[-1]
    metrics = json.loads((runs / "crash/trials/eval/0000/metrics.json").read_text())
    assert metrics["steps"] == 8000


def start_sweep(study: Path, runs: Path) -> subprocess.Popen:
    """`ablate sweep` in the background: one worker process, no report."""
    return background(
        [ablate_exe(), "sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--no-report"]
    )


def open_at(url: str, start: float) -> None:
    while time.time() < start:  # all processes open the new database at the same moment
        pass
    open_storage(url)


def test_workers_opening_a_new_database_together_all_succeed(tmp_path):
    """Each process opening a new storage creates Optuna's tables; the ones that lose that race open it
    again instead of failing (on PostgreSQL: test_postgres.py's three workers)."""
    ctx = multiprocessing.get_context("fork")
    for attempt in range(4):
        url, start = f"sqlite:///{tmp_path / f'new{attempt}.db'}", time.time() + 0.5
        procs = [ctx.Process(target=open_at, args=(url, start)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * 4


# Faults ---------------------------------------------------------------------------------------------------

# Which variant meets which fault: the variants differ only in weight decay, which the injected faults read.
FAULTS = {"ok": 0.01, "oom": 0.011, "boom": 0.012, "unwritable": 0.013, "store_down": 0.014}


def test_faults_fail_with_their_reason_and_the_report_shows_them(tmp_path, monkeypatch, single_thread):
    real_step, real_write = Seq2SeqModule.training_step, harness_trial.write_artifacts

    def faulty_step(self, batch, batch_idx):
        if self.optim.weight_decay == FAULTS["oom"] and batch_idx == 1:
            # What the CUDA caching allocator raises, raised on the CPU.
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        if self.optim.weight_decay == FAULTS["boom"]:
            raise RuntimeError("boom <in the variant's own code>")
        return real_step(self, batch, batch_idx)

    def unwritable(out, cfg, result, loggers):
        if cfg.train.weight_decay in (FAULTS["unwritable"], FAULTS["store_down"]):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(out / "metrics.json"))
        return real_write(out, cfg, result, loggers)

    def unreachable_store(trial, out_dir, store):
        if trial.user_attrs["config"]["train.weight_decay"] == FAULTS["store_down"]:
            raise OSError(errno.ECONNREFUSED, "artifact store unreachable (simulated)")
        return real_upload(trial, out_dir, store)

    real_upload = harness_jobs.upload_trial_files
    monkeypatch.setattr(Seq2SeqModule, "training_step", faulty_step)
    monkeypatch.setattr("ablate.harness.trial.write_artifacts", unwritable)
    monkeypatch.setattr("ablate.harness.jobs.upload_trial_files", unreachable_store)
    variants = {name: {"train.weight_decay": wd} for name, wd in FAULTS.items()}
    spec = tiny_spec(variants={**variants, "nan": {"train.lr": 1.0e6}})
    runs = tmp_path / "runs"
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    run_worker(spec, storage, runs, "disabled")

    trials = {t.params["variant"]: t for t in load_phase_study(spec, storage, EVAL).trials}
    assert {v: t.state for v, t in trials.items()} == {
        "ok": TrialState.COMPLETE, "oom": TrialState.FAIL, "boom": TrialState.FAIL,
        "unwritable": TrialState.FAIL, "store_down": TrialState.FAIL, "nan": TrialState.FAIL,
    }  # fmt: skip
    reasons = {v: t.user_attrs.get("fail_reason") for v, t in trials.items() if v != "ok"}
    assert reasons["oom"].startswith("OutOfMemoryError: CUDA out of memory.")
    assert reasons["boom"] == "RuntimeError: boom <in the variant's own code>"
    assert reasons["unwritable"].startswith("OSError: [Errno 5] Input/output error")
    assert reasons["nan"].startswith("TrialFailed: diverged: ")
    # A failed trial keeps what it wrote before failing (the checkpoints), for a post-mortem.
    assert "checkpoints/last.ckpt" in trials["unwritable"].user_attrs["artifacts"]
    # When storing them fails too, the trial's own error stays the reason.
    store_down = trials["store_down"].user_attrs
    assert reasons["store_down"].startswith("OSError: [Errno 5]") and "artifacts" not in store_down
    assert "artifacts could not be stored either: ConnectionRefusedError" in store_down["traceback"]

    out = build_report(spec, storage, runs)
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    for variant, reason in reasons.items():
        row = next(line for line in md.splitlines() if line.startswith(f"| {trials[variant].number} |"))
        assert "| fail |" in row and reason.split("<")[0].strip() in row, row
    assert "boom &lt;in the variant&#39;s own code&gt;" in html
    table = pd.read_csv(out / "results.csv").set_index("variant")
    assert (table["state"] == "FAIL").sum() == 5 and table.loc["ok", "state"] == "COMPLETE"


def test_full_disk_queues_the_trial_again_and_stops_until_space_is_freed(
    tmp_path, monkeypatch, single_thread
):
    """The disk under --out fills up while a trial writes: the trial waits again as it was (every later
    trial would fail the same way), the worker stops saying so, and once space is freed the study completes."""
    real_write, full = harness_trial.write_artifacts, [True]

    def full_disk(out, cfg, result, loggers):
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "metrics.json"))
        return real_write(out, cfg, result, loggers)

    monkeypatch.setattr("ablate.harness.trial.write_artifacts", full_disk)
    spec, runs = tiny_spec(seeds=[0, 1]), tmp_path / "runs"
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    stopped = harness_workers.Worker(spec, storage, runs, "disabled")
    stopped.run()
    assert stopped.stopped == f"no space left on device under {runs / 'tiny'}; trial 0 queued again"
    study = load_phase_study(spec, storage, EVAL)
    assert [t.state for t in study.get_trials()] == [TrialState.WAITING, TrialState.WAITING]

    full[0] = False  # space freed
    again = harness_workers.Worker(spec, storage, runs, "disabled")
    again.run()
    assert again.stopped is None
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs (root only); skipped where it cannot be mounted."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or 'mount failed'}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow  # two sweeps, about 2 min on 2 busy cores
def test_sweep_on_a_full_disk_stops_with_one_line_and_completes_once_space_is_freed(tmp_path, small_tmpfs):
    study = write_study(tmp_path / "crash.yaml", seeds=[0])
    url = f"sqlite:///{tmp_path / 'study.db'}"  # the storage elsewhere: only --out fills up
    filler = small_tmpfs / "filler"
    free = shutil.disk_usage(small_tmpfs).free
    filler.write_bytes(b"\0" * (free - 48 * 1024))  # a trial's checkpoints need more than what is left
    command = ("sweep", str(study), "--out", str(small_tmpfs), "--storage", url, "--wandb", "disabled",
               "--no-report")  # fmt: skip
    full = ablate(*command, timeout=300)
    assert full.returncode == 1, full.stderr[-2000:]
    assert full.stderr.strip().splitlines()[-1] == (
        f"error: --out: no space left on device under {small_tmpfs}; free some, then run the same command"
    )
    assert "Traceback" not in full.stderr
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.WAITING

    filler.unlink()
    done = ablate(*command, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (trial,) = study_trials(study, url)
    assert trial.state == TrialState.COMPLETE


# W&B without network ------------------------------------------------------------------------------------

FAKE_KEY = "local-test-key-" + "0123456789abcdef" * 3  # 40+ characters, as W&B requires
NO_SERVER = "http://127.0.0.1:9"  # the discard port on loopback: refused at once, never a real server


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_online_wandb_without_network_goes_offline_once_and_never_leaks_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", NO_SERVER)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    study = write_study(tmp_path / "study.yaml", name="offline", seeds=[0, 1])
    runs = tmp_path / "runs"
    started = time.monotonic()
    proc = ablate("sweep", str(study), "--out", str(runs), "--wandb", "online", "--workers", "2",
                  "--set", "train.max_steps=4", timeout=300)  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = (proc.stdout + proc.stderr).count("W&B: cannot reach http://127.0.0.1:9")
    assert said == 1, proc.stderr[-3000:]
    assert "logging offline" in proc.stderr and "W&B offline" in proc.stderr
    # Two trials, each kept offline from the start: no run waited out W&B's connection timeout.
    assert "cannot start an online run" not in proc.stderr
    assert len(list((runs / "offline" / "wandb").glob("offline-run-*"))) == 2
    assert elapsed < 240

    for path in (runs / "offline").rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path
    assert FAKE_KEY not in proc.stdout + proc.stderr


def test_lost_network_mid_sweep_falls_back_once(tmp_path, monkeypatch, capfd):
    """The server answered the first probe and then went away: the first run waits out its (shortened)
    init timeout and falls back; later runs of the process go offline at once, without a second message."""
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", NO_SERVER)
    monkeypatch.setattr(tracking, "INIT_TIMEOUT_S", 5)
    monkeypatch.setattr(tracking, "_offline_reason", None)
    durations = []
    for seed in (0, 1):
        started = time.monotonic()
        with tracking.wandb_logger(
            "online", tmp_path, "g", f"run{seed}", "eval", [], {"seed": seed}
        ) as logger:
            logger.log_metrics({"val/loss": 1.0}, step=1)
        durations.append(time.monotonic() - started)
    err = capfd.readouterr().err
    assert err.count("W&B: cannot start an online run") == 1, err
    assert durations[0] >= tracking.INIT_TIMEOUT_S > durations[1]  # the second run did not wait
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2
    assert FAKE_KEY not in err


def test_wandb_probe_gives_up_on_a_server_that_never_answers():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections, never answers them
        started = time.monotonic()
        reason = tracking.server_unreachable(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=2)
        elapsed = time.monotonic() - started
    assert reason is not None and "timed out" in reason
    assert 2 <= elapsed < 4


# Determinism ------------------------------------------------------------------------------------------------


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_same_config_and_seed_give_identical_metrics_in_two_processes(tmp_path):
    """Two `ablate train` processes with different hash seeds (string-keyed vocabularies must not depend
    on them) on a word-level corpus; the in-process check with train.deterministic is in test_module.py."""
    corpus = tmp_path / "pairs.tsv"
    words = ["red", "green", "blue", "big", "small", "cat", "dog", "bird"]
    lines = [f"{words[i % 8]} {words[(i * 3) % 8]}\t{words[(i * 3) % 8]} {words[i % 8]}" for i in range(60)]
    corpus.write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "exp.yaml"
    task = {"name": "parallel", "path": str(corpus), "tokenizer": "word"}
    cfg.write_text(yaml.safe_dump({"preset": "transformer", "task": task, "model": TINY_MODEL,
                                   "train": {**TINY_TRAIN, "max_steps": 6}}))  # fmt: skip
    summaries = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([ablate_exe(), "train", str(cfg), "--json"], capture_output=True, text=True,
                              env=env, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    timing = {"wall_time", "tokens_per_sec", "peak_mem_mb"}
    first, second = ({k: v for k, v in s.items() if k not in timing} for s in summaries)
    assert first == second
    assert "test/loss" in first and first["steps"] == 6


def test_each_trial_records_its_torch_threads_which_its_numbers_depend_on():
    # One worker on two cores trains with two threads, two workers with one each: the sums' order differs,
    # so a seed's numbers repeat only at the same count, and the report's Reproducibility line must say it.
    before = torch.get_num_threads()
    try:
        for threads, said in ((1, "1 torch thread"), (2, "2 torch threads")):
            torch.set_num_threads(threads)
            assert provenance.hardware().split(", ")[2] == said
    finally:
        torch.set_num_threads(before)


# Faults that scale brings -----------------------------------------------------------------------------------


def test_more_workers_than_the_machine_holds_are_refused_up_front(tmp_path):
    study, runs = write_study(tmp_path / "crash.yaml"), tmp_path / "runs"
    count = max(64, (os.cpu_count() or 1) + 1)
    refused = ablate("sweep", str(study), "--out", str(runs), "--workers", str(count), "--wandb", "disabled")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: --workers: {count} worker processes exceed this machine (")
    assert "at most" in line
    assert not runs.exists()


def processes(parent: int) -> list[int]:
    """The live (not zombie) children of `parent`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@pytest.mark.slow  # about a minute on 2 busy cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_a_killed_sweep_leaves_no_worker_behind_and_no_trial_running(tmp_path):
    """The OOM killer's SIGKILL to `ablate sweep`, which no handler sees: each worker gets SIGTERM as its
    parent dies, checkpoints its trial, queues it again and exits, instead of training on as an orphan."""
    study, runs = write_study(tmp_path / "crash.yaml", max_steps=400, seeds=[0, 1]), tmp_path / "runs"
    url = f"sqlite:///{runs / 'crash' / 'study.db'}"
    sweep = background([ablate_exe(), "sweep", str(study), "--out", str(runs), "--wandb", "disabled",
                        "--no-report", "--workers", "2"])  # fmt: skip
    workers = []
    try:
        checkpointed = lambda: resume_record(url, study, 0) or resume_record(url, study, 1)  # noqa: E731
        wait_for(checkpointed, 300, "a checkpoint", poll=0.2)
        workers = processes(sweep.pid)
        assert len(workers) == 2
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=30)
        wait_for(lambda: not any(alive(pid) for pid in workers), 60, "the orphaned workers to stop")
    finally:
        sweep.kill()
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)
    states = [t.state for t in stored_trials(study, url)]
    assert TrialState.RUNNING not in states and TrialState.WAITING in states


def test_storages_without_a_heartbeat_are_refused(tmp_path):
    """Optuna's journal storages and gRPC proxy record no heartbeat: a dead worker's trial would never run
    again, with one worker or many. Refused before anything is created."""
    study, runs = write_study(tmp_path / "crash.yaml"), tmp_path / "runs"
    for url in ("grpc://127.0.0.1:13000", "redis://127.0.0.1:6379/0", str(tmp_path / "journal.log")):
        refused = ablate("sweep", str(study), "--out", str(runs), "--storage", url, "--workers", "2")
        assert refused.returncode == 2
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith(f"error: --storage: {url}: Optuna's journal storages and gRPC proxy keep no ")
        assert line.endswith("would stay RUNNING for good, never retried; use SQLite or PostgreSQL")
    assert not runs.exists()


def test_an_unreachable_artifact_store_stops_sweep_and_worker_before_any_trial(tmp_path, monkeypatch):
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install '.[s3]')")
    aws = {"AWS_ENDPOINT_URL": NO_SERVER, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    study, runs = write_study(tmp_path / "crash.yaml"), tmp_path / "runs"
    for command in ("sweep", "worker"):
        refused = ablate(command, str(study), "--out", str(runs), "--artifacts", "s3://trials/team",
                         "--wandb", "disabled", timeout=120)  # fmt: skip
        assert refused.returncode == 2, refused.stderr[-2000:]
        (line,) = refused.stderr.strip().splitlines()
        endpoint = f'Could not connect to the endpoint URL: "{NO_SERVER}/trials"'
        assert line == f"error: --artifacts: s3://trials/team: {endpoint}"
    assert not runs.exists()  # no study, no trial


@pytest.mark.slow  # three sweeps, about 2 min on 2 busy cores
def test_storage_on_a_full_disk_stops_the_sweep_in_one_line_with_no_trial_left_running(tmp_path, small_tmpfs):
    study = write_study(tmp_path / "crash.yaml", max_steps=20, seeds=[0, 1, 2])
    url = f"sqlite:///{small_tmpfs / 'study.db'}"  # the storage on the small disk, --out elsewhere
    command = [ablate_exe(), "sweep", str(study), "--out", str(tmp_path / "runs"), "--storage", url,
               "--wandb", "disabled", "--no-report"]  # fmt: skip
    filler = small_tmpfs / "filler"

    def fill() -> None:
        filler.write_bytes(b"\0" * shutil.disk_usage(small_tmpfs).free)

    # Full before the study exists: nothing can be created.
    fill()
    full = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert full.returncode == 1
    assert full.stderr.strip().splitlines() == [
        f"error: storage {url}: no space left on device; free some, then run the same command"
    ]
    filler.unlink()

    # Full while the first trial runs.
    sweep = background(command)
    running = lambda: any(t.state == TrialState.RUNNING for t in stored_trials(study, url))  # noqa: E731
    wait_for(running, 300, "a trial to run")
    fill()
    sweep.wait(timeout=300)
    sweep.log.seek(0)
    out = sweep.log.read()
    assert sweep.returncode == 1, out[-3000:]
    assert out.strip().splitlines()[-1] == (
        f"error: --storage: no space left on device for {url}; free some, then run the same command"
    )
    assert "Traceback" not in out
    filler.unlink()
    assert TrialState.RUNNING not in [t.state for t in stored_trials(study, url)], out[-4000:]

    # Space freed: the same command finishes the study.
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [t.state for t in stored_trials(study, url)] == [TrialState.COMPLETE] * 3


def stored_trials(study: Path, url: str) -> list:
    # A locked database (a worker is writing): nothing to see yet, look again next poll.
    with contextlib.suppress(KeyError, ConfigError, sqlalchemy.exc.OperationalError, StorageInternalError):
        return study_trials(study, url)
    return []


STOP_BOUND_S = 30  # the README's: a stopped sweep exits within this, however loaded the machine


@pytest.mark.slow  # about 2 min: workers start slowly on a machine kept busy
def test_sigterm_stops_a_sweep_within_the_bound_on_a_loaded_machine(tmp_path):
    """SIGTERM while both workers train and every core is kept busy by another process: the sweep exits 143
    within STOP_BOUND_S (workers get 25 s to checkpoint, then are killed), and no trial is FAILED."""
    study, runs = write_study(tmp_path / "crash.yaml", max_steps=2000, seeds=[0, 1]), tmp_path / "runs"
    url = f"sqlite:///{runs / 'crash' / 'study.db'}"
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        sweep = background([ablate_exe(), "sweep", str(study), "--out", str(runs), "--wandb", "disabled",
                            "--no-report", "--workers", "2"])  # fmt: skip
        training = lambda: resume_record(url, study, 0) and resume_record(url, study, 1)  # noqa: E731
        wait_for(training, 600, "both trials to train")
        sent = time.monotonic()
        sweep.send_signal(signal.SIGTERM)
        sweep.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        for busy in load:
            busy.kill()
    print(f"SIGTERM to exit: {took:.1f} s with {len(load)} busy processes")
    sweep.log.seek(0)
    assert sweep.returncode == 143, sweep.log.read()[-3000:]
    assert took < STOP_BOUND_S
    assert TrialState.FAIL not in [t.state for t in stored_trials(study, url)]
