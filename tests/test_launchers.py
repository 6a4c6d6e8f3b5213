"""Launchers: a study's workers started by SLURM (a job array) or Ray instead of on this machine.

The batch script, the submission and the launcher settings are checked everywhere, a stand-in `sbatch`
recording what it was given. The end-to-end tests need a SLURM cluster (.ci/slurm.sh starts a one-node one on
loopback and exports SLURM_CONF) or Ray (the [ray] extra), and skip saying which is missing. Their storage is
the PostgreSQL server of .ci/services.sh, as a cluster's would be, else SQLite on this one node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, ablate_exe, study_trials
from optuna.trial import TrialState
from test_postgres import URL_VARIABLE, postgres_url  # noqa: F401 (a fixture)
from test_reliability import resume_record, wait_for

from ablate.harness import trial as harness_trial
from ablate.harness.launchers import Launch, local, plan, slurm
from ablate.harness.study.validate import load_study
from ablate.schema.config import build_config, read_yaml
from ablate.schema.errors import ConfigError, RunFailed
from ablate.schema.trials import grid_point

SECRET = "not-a-real-password"


def write_study(path: Path, launcher: dict | None = None, **extra) -> Path:
    """Two variants x two seeds of a tiny model: four grid points, a few seconds each."""
    tree = {
        "name": "cluster",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "factors": {"model.pos_encoding": ["sinusoidal", "none"]},
        "seeds": [0, 1],
        "metric": {"name": "test/tok_acc"},
        "heartbeat": {"interval": 1, "grace": 3},
        **({"launcher": launcher} if launcher else {}),
        **extra,
    }
    path.write_text(yaml.safe_dump(tree))
    return path


# The batch script and its submission -------------------------------------------------------------------


def recorded_args(record: Path, call: str = "args") -> list[str]:
    """The arguments the fake sbatch (or srun) recorded, as the file system's names decode them."""
    return [os.fsdecode(arg) for arg in Path(f"{record}.{call}").read_bytes().split(b"\0")[:-1]]


def test_batch_script_asks_for_what_the_options_say():
    options = slurm.Options(tasks=3, workers=4, gpus=2, cpus=5, partition="gpu", time="4:00:00",
                            sbatch=["--mem=16G", "--account=lab"])  # fmt: skip
    command = slurm.sbatch_command(Path("/shared/runs/grid/slurm/job.sh"), "grid", options,
                                   Path("/shared/runs/grid/slurm"), Path("/shared"))  # fmt: skip
    for option in ("--array=0-2", "--ntasks=4", "--cpus-per-task=5", "--gres=gpu:2", "--partition=gpu",
                   "--time=4:00:00", "--signal=USR1@90", "--requeue", "--chdir=/shared", "--mem=16G",
                   "--account=lab", "--output=/shared/runs/grid/slurm/%A_%a.log", "--job-name=ablate-grid",
                   "--export=ALL"):  # fmt: skip
        assert option in command
    assert command[0] == "sbatch" and command[-1] == "/shared/runs/grid/slurm/job.sh"

    script = slurm.batch_script("grid", ["python", "-m", "ablate.cli", "worker", "--", "grid"], options)
    lines = script.splitlines()
    assert not any(line.startswith("#SBATCH") for line in lines)  # every option is on sbatch's command line
    # Four workers on two GPUs: each sees one, by its rank on the node.
    (run,) = [line for line in lines if line.startswith("srun ")]
    assert "CUDA_VISIBLE_DEVICES=${gpus[SLURM_LOCALID / 2]}" in run
    assert run.endswith("python -m ablate.cli worker -- grid")
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in script

    cpu = slurm.sbatch_command(Path("/l/job.sh"), "grid", slurm.Options(), Path("/l"), Path("/w"))
    assert "--array=0-0" in cpu and not any(o.startswith(("--gres", "--time")) for o in cpu)
    cpu_script = slurm.batch_script("grid", ["w"], slurm.Options()).splitlines()
    assert any(line.startswith("export CUDA_VISIBLE_DEVICES= ") for line in cpu_script)  # no GPU to see
    # bash accepts it as it is written
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_submission_passes_the_storage_in_the_jobs_environment_only(tmp_path, fake_sbatch, capsys):
    url = f"postgresql://ablate:{SECRET}@db.example:5432/studies"
    spec = load_study(write_study(tmp_path / "cluster.yaml"))
    slurm.start(spec, url, tmp_path / "runs", "offline", None, slurm.Options(tasks=4, cpus=2))
    printed = capsys.readouterr().out
    args = recorded_args(fake_sbatch)
    script = Path(f"{fake_sbatch}.script").read_text()
    assert args[:2] == ["--parsable", "--export=ALL"]
    assert Path(f"{fake_sbatch}.storage").read_text() == url  # the job's environment carries it
    assert SECRET not in script and SECRET not in " ".join(args) and SECRET not in printed
    assert "ABLATE_STORAGE" not in script.replace("ABLATE_STORAGE in the job's environment", "")
    assert script == (tmp_path / "runs" / "cluster" / "slurm" / "job.sh").read_text()
    assert f"--out={tmp_path / 'runs'}" in script and "--threads=2" in script and "--no-report" not in script
    assert "SLURM job 4242: 4 array task(s)" in printed and "postgresql://ablate:***@db.example" in printed
    assert f"logs: {tmp_path / 'runs' / 'cluster' / 'slurm'}/4242_<task>.log" in printed
    assert f"ablate status --stored --out {tmp_path / 'runs'} -- cluster (with --storage" in printed


def test_slurm_refuses_a_sqlite_file_unless_told_every_task_runs_on_one_node(tmp_path, fake_sbatch):
    study, runs = write_study(tmp_path / "cluster.yaml"), tmp_path / "runs"
    refused = ablate("sweep", str(study), "--out", str(runs), "--launcher", "slurm", "--wandb", "disabled")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: --storage: {runs / 'cluster' / 'study.db'} is a SQLite file")
    assert "single_node=true" in line
    assert not runs.exists()  # nothing created

    submitted = ablate("sweep", str(study), "--out", str(runs), "--launcher", "slurm",
                       "--launch", "single_node=true", "--wandb", "disabled")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert "SLURM job 4242" in submitted.stdout
    url = f"sqlite:///{runs / 'cluster' / 'study.db'}"
    assert [t.state for t in study_trials(study, url)] == [TrialState.WAITING] * 4  # queued for the tasks
    assert Path(f"{fake_sbatch}.storage").read_text() == url


def test_launcher_settings_come_from_the_study_file_then_the_command_line(tmp_path):
    block = {"slurm": {"tasks": 2, "partition": "debug", "sbatch": ["--mem=1G"]}, "ray": {"workers": 3}}
    study = str(write_study(tmp_path / "cluster.yaml", launcher=block))
    launch, problems = plan("slurm", study, ["tasks=8", "sbatch=--qos=low", "single_node=true"], launchers=block)
    assert problems == [] and launch.name == "slurm"
    assert launch.options == slurm.Options(tasks=8, partition="debug", sbatch=["--mem=1G", "--qos=low"],
                                           single_node=True)  # fmt: skip
    assert plan("ray", study, [], launchers=block)[0].options.workers == 3
    # Without a name, the local launcher with `ablate sweep`'s own flags; the study's blocks are not read.
    assert plan(None, study, [], {"workers": 2}) == (Launch("local", local.Options(workers=2)), [])

    _, problems = plan("slurm", study, ["tasks=0", "bogus=1", "nokey"], launchers=block)
    assert ("--launch tasks", "Input should be greater than or equal to 1 (got '0')") in problems
    assert ("--launch bogus", f"unknown setting (known: {', '.join(slurm.Options.model_fields)})") in problems
    assert ("--launch", "'nokey': expected key=value, e.g. tasks=4") in problems
    refused = [("--launch", "give --launcher too")]
    assert plan(None, study, ["tasks=2"]) == (Launch("local", local.Options()), refused)
    assert plan("pbs", study, [])[1] == [("--launcher", "unknown launcher 'pbs' (known: slurm, ray, local)")]

    # YAML reads an unquoted 4:00:00 as 14400: said, not submitted as 14400 minutes.
    unquoted = tmp_path / "unquoted.yaml"
    unquoted.write_text((tmp_path / "cluster.yaml").read_text().replace("partition: debug", "time: 4:00:00"))
    _, problems = plan("slurm", str(unquoted), [], launchers=read_yaml(unquoted)["launcher"])
    quote = 'quote it, e.g. "4:00:00" (got the number 14400; YAML reads 4:00:00 as 14400)'
    assert problems == [(f"{unquoted}: launcher.slurm.time", quote)]


@pytest.mark.parametrize(
    ("launcher", "setting", "said"),
    [
        ("slurm", "tasks=4000001", "Input should be less than or equal to 4000000 (got '4000001')"),
        ("slurm", "warning=0", "Input should be greater than or equal to 1 (got '0')"),
        ("slurm", "warning=65536", "Input should be less than or equal to 65535 (got '65536')"),
        ("slurm", "timeout=inf", "Input should be a finite number"),
        ("slurm", "timeout=0", "Input should be greater than 0 (got '0')"),
        ("ray", "cpus=inf", "Input should be a finite number"),
        ("ray", "cpus=nan", "Input should be a finite number"),
        ("ray", "gpus=-0.5", "Input should be greater than or equal to 0 (got '-0.5')"),
        ("ray", "timeout=1e9", "Input should be less than or equal to 600 (got '1e9')"),
        ("local", "workers=0", "Input should be greater than or equal to 1 (got '0')"),
        ("local", "per_device=1.5", "Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_every_number_a_launcher_takes_is_checked_against_its_range(tmp_path, launcher, setting, said):
    """cpus=inf reached math.ceil (OverflowError) and sbatch took any --signal time it was given."""
    study = str(write_study(tmp_path / "cluster.yaml"))
    key = setting.split("=")[0]
    assert plan(launcher, study, [setting]) == (None, [(f"--launch {key}", said)])


def test_a_launcher_block_does_not_change_the_stored_study(tmp_path):
    """Where the workers run is not part of the study: changing it keeps the stored study the same one."""
    plain = load_study(write_study(tmp_path / "a.yaml"))
    assert load_study(write_study(tmp_path / "b.yaml", launcher={"slurm": {"tasks": 9}})) == plain


def test_a_sweep_reads_its_study_file_once_and_says_the_command_lines_problems_first(tmp_path, monkeypatch):
    """The launcher's block and the study come from one read; a file that cannot be read is said after
    --workers / --devices, as before."""
    from ablate.harness.study import validate
    from ablate.schema import config
    from ablate.sweep import SweepOptions, load_sweep

    read = []
    for module in (config, validate):
        monkeypatch.setattr(module, "read_yaml", lambda path: read.append(path) or read_yaml(path))
    study = write_study(tmp_path / "cluster.yaml", launcher={"slurm": {"tasks": 2}})
    _, launch = load_sweep(study, None, None, SweepOptions(out=tmp_path / "runs", launcher="slurm"))
    assert read == [study] and launch.options.tasks == 2
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="^--workers: give either --workers"):
        load_sweep(missing, None, None, SweepOptions(workers=1, devices="0"))
    with pytest.raises(ConfigError, match=f"^{missing}: no such study file$"):
        load_sweep(missing, None, None, SweepOptions(launcher="slurm", launch=("tasks=0",)))


# A scheduler or cluster that does not answer ----------------------------------------------------------


def test_an_sbatch_that_never_answers_is_one_line_before_anything_is_made(tmp_path, fake_sbatch, monkeypatch):
    """The controller is asked up front (`sbatch --test-only`, which submits nothing) within `timeout`
    seconds: a hung sbatch was a 54-line TimeoutExpired after 120 s, with the study already made."""
    monkeypatch.setenv("FAKE_SBATCH_HANGS", "test-only")
    study, runs = write_study(tmp_path / "cluster.yaml"), tmp_path / "runs"
    refused = ablate("sweep", str(study), "--out", str(runs), "--launcher", "slurm", "--wandb", "disabled",
                     "--launch", "single_node=true", "--launch", "timeout=1")  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --launcher: slurm: sbatch did not answer within 1 s: is the SLURM controller up (sinfo)? "
        "--launch timeout=SECONDS waits longer"
    ]
    assert not runs.exists()


def test_an_sbatch_that_stops_answering_at_submission_is_one_line(tmp_path, fake_sbatch, monkeypatch):
    monkeypatch.setenv("FAKE_SBATCH_HANGS", "submit")
    spec = load_study(write_study(tmp_path / "cluster.yaml"))
    options = slurm.Options(timeout=0.5)
    assert slurm.problems(options, "postgresql://db/x", tmp_path / "runs") == []  # it answered the check
    with pytest.raises(RunFailed) as failed:
        slurm.start(spec, "postgresql://db/x", tmp_path / "runs", "disabled", None, options)
    assert str(failed.value) == (
        "sbatch did not answer within 0.5 s: is the SLURM controller up (sinfo)? --launch timeout=SECONDS "
        "waits longer; squeue says whether the job was queued, and the same command submits it again if not"
    )


def test_sbatch_refusing_the_jobs_resources_is_said_before_anything_is_made(tmp_path, fake_sbatch):
    """What the controller says of a partition, a time or an `sbatch` item, asked with --test-only."""
    (fake_sbatch.parent / "bin" / "sbatch").write_text(
        '#!/bin/sh\necho "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n'
    )
    found = slurm.problems(slurm.Options(partition="nope"), "postgresql://db/x", tmp_path / "runs")
    said = "slurm: sbatch --test-only refuses the job: invalid partition specified: nope"
    assert found == [("--launcher", said)]


@pytest.fixture
def ray_launcher():
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from ablate.harness.launchers import ray as ray_launcher

    return ray_launcher


@pytest.fixture
def closed_port() -> int:
    """A port on this machine where nothing listens."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_with_nothing_there_is_one_line_within_its_timeout(
    ray_launcher, closed_port, monkeypatch
):  # fmt: skip
    """A plain connection is tried first: ray.init retried there for minutes, printing C++ warnings. A
    refused connection is said at once; an address that never answers (TEST-NET-1) after `timeout`."""
    import time

    import ray

    url, out = "postgresql://db/x", Path("runs")
    for address in (f"127.0.0.1:{closed_port}", f"ray://127.0.0.1:{closed_port}"):
        said = ray_launcher.problems(ray_launcher.Options(address=address, timeout=2), url, out)
        reason = f"nothing answers at 127.0.0.1:{closed_port} within 2 s (Connection refused)"
        assert said == [("--launch address", f"{address}: {reason}")]
    silent, started = ray_launcher.Options(address="192.0.2.1:6379", timeout=1), time.monotonic()
    ((where, what),) = ray_launcher.problems(silent, url, out)
    assert time.monotonic() - started < 3
    assert where == "--launch address" and what.startswith("192.0.2.1:6379: nothing answers at 192.0.2.1:")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port}")  # none given: Ray's own variable, named
    ((where, what),) = ray_launcher.problems(ray_launcher.Options(), url, out)
    assert where == "RAY_ADDRESS" and what.startswith(f"127.0.0.1:{closed_port}: nothing answers")
    assert not ray.is_initialized()


@pytest.fixture
def no_ray_here(tmp_path, monkeypatch) -> Path:
    """Ray's temporary folder of this test's own (where "auto" reads the address of the cluster last started),
    with no cluster in it; skips when a Ray cluster runs on this machine, which "auto" would find anyway.
    Its processes, and theirs, carry RAY_TMPDIR: started_with finds any left behind."""
    running = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"gcs_server" in read_or_empty(p)]
    if running:
        pytest.skip("a Ray cluster runs on this machine: address=auto would connect to it")
    temp_dir = tmp_path / "ray-tmp"
    (temp_dir / "ray").mkdir(parents=True)
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return temp_dir


def read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # ended meanwhile, or not ours to read
        return b""


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on loopback that accepts connections (the system completes them) and never says a word: an
    address that answers, where no Ray cluster is."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def test_an_address_that_answers_but_is_no_ray_cluster_is_one_line_within_its_timeout(
    ray_launcher, no_ray_here, silent_port, monkeypatch
):  # fmt: skip
    """ray.init retried there for minutes, printing C++ warnings: a host:port of another service, or "auto"
    where the cluster last started on this machine is gone and its port taken. The whole check, Ray's own
    connection included, is bounded by `timeout`, and leaves no process behind."""
    import ray

    address, reason = f"127.0.0.1:{silent_port}", "no Ray cluster answers there within 2 s"
    (no_ray_here / "ray" / "ray_current_cluster").write_text(address)  # a cluster that was, and is gone
    for given in (address, "auto"):
        options = ray_launcher.Options(address=given, timeout=2)
        assert problems_within(3.5, options) == [("--launch address", f"{given}: {reason}")]
    monkeypatch.setenv("RAY_ADDRESS", address)  # none given: Ray's own variable, named
    assert problems_within(3.5, ray_launcher.Options(timeout=2)) == [("RAY_ADDRESS", f"{address}: {reason}")]
    assert not ray.is_initialized()
    assert started_with(f"RAY_TMPDIR={no_ray_here}") == []


def test_address_auto_with_no_cluster_is_one_line_at_once(ray_launcher, no_ray_here):
    import ray

    # Within the default timeout: the probe's start and its import of Ray, then Ray's answer at once.
    ((where, what),) = problems_within(5, ray_launcher.Options(address="auto"))
    assert where == "--launch address"
    assert what.startswith("auto: no Ray cluster there (Could not find any running Ray instance.")
    assert not ray.is_initialized() and started_with(f"RAY_TMPDIR={no_ray_here}") == []


def problems_within(seconds: float, options) -> list[tuple[str, str]]:
    """The Ray launcher's problems with `options` (no SQLite file), found within `seconds`."""
    from ablate.harness.launchers import ray as ray_launcher

    started = time.monotonic()
    said = ray_launcher.problems(options, "postgresql://db/x", Path("runs"))
    assert time.monotonic() - started < seconds, said
    return said


def test_a_sweep_to_an_address_with_no_ray_cluster_stops_in_one_line_before_the_study_exists(
    tmp_path, ray_launcher, no_ray_here, silent_port
):  # fmt: skip
    study, runs = write_study(tmp_path / "cluster.yaml"), tmp_path / "runs"
    address = f"127.0.0.1:{silent_port}"
    launch = ["--launcher", "ray", "--launch", f"address={address}", "--launch", "timeout=2"]
    proc = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", *launch, timeout=60)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2, [f"error: --launch address: {address}: no Ray cluster answers there within 2 s"]
    )  # fmt: skip
    assert not runs.exists()
    assert started_with(f"RAY_TMPDIR={no_ray_here}") == []


def started_with(variable: str) -> list[str]:
    """The command lines of this machine's processes whose environment holds `variable` (NAME=value), which
    every process started from one with it inherits: Ray's agents rename themselves (ray::DashboardAgent),
    so a command line does not tell whose they are."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and variable.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


@pytest.mark.slow  # a local Ray cluster starts in about half a minute, its worker in another
def test_a_sigtermed_ray_sweep_leaves_no_process_behind(tmp_path, ray_launcher):
    """A sweep stopped by a signal ends with os._exit, which skips Ray's atexit: two agents of the local
    cluster that its ray.init started outlived it. The last worker to exit now disconnects."""
    import shutil
    import tempfile

    # A short temp folder of its own (Ray's socket paths must fit 107 bytes), which marks what it starts.
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    marked = f"RAY_TMPDIR={temp_dir}"
    train = {**TINY_TRAIN, "max_steps": 2000, "val_every": 50, "checkpoint_every": 50}
    base = {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": train}
    study, runs = write_study(tmp_path / "cluster.yaml", factors={}, seeds=[0], base=base), tmp_path / "runs"
    url = f"sqlite:///{runs / 'cluster' / 'study.db'}"
    log = tmp_path / "sweep.log"
    with log.open("w") as output:
        command = [ablate_exe(), "sweep", str(study), "--out", str(runs), "--wandb", "disabled"]
        sweep = subprocess.Popen([*command, "--launcher", "ray"], stdout=output, stderr=subprocess.STDOUT,
                                 env={**os.environ, "RAY_TMPDIR": temp_dir})  # fmt: skip
    try:
        wait_for(lambda: resume_record(url, study, 0), 300, "the trial's first checkpoint", poll=0.5)
        running = started_with(marked)
        assert [c for c in running if "raylet" in c] and [c for c in running if "ray::" in c], running
        sweep.send_signal(signal.SIGTERM)
        sweep.wait(timeout=60)
    finally:
        sweep.kill()
    assert sweep.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]
    wait_for(lambda: not started_with(marked), 15, "every process the sweep started to end")
    assert study_trials(study, url)[0].state == TrialState.WAITING  # checkpointed, to resume
    shutil.rmtree(temp_dir)


# Lightning inside a SLURM job ----------------------------------------------------------------------------


class SignalSpy(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.sigusr1 = signal.getsignal(signal.SIGUSR1)


@pytest.mark.parametrize("ntasks", ["1", "2"])
def test_a_trial_in_a_slurm_job_trains_in_lightnings_plain_environment(monkeypatch, ntasks, tiny_tree):
    """As one of the K workers of `srun -n K`: Lightning's SLURM environment would read SLURM_NTASKS as a
    world size (and raise with K = 2), and install its own SIGUSR1 requeue (with K = 1) beside ours."""
    job = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "6", "SLURM_ARRAY_TASK_ID": "1", "SLURM_NTASKS": ntasks,
           "SLURM_PROCID": str(int(ntasks) - 1), "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_JOB_NAME": "ablate-grid", "SLURM_NODELIST": "node1"}  # fmt: skip
    for key, value in job.items():
        monkeypatch.setenv(key, value)
    spy, before = SignalSpy(), signal.getsignal(signal.SIGUSR1)  # the harness's, once a worker ran here
    result = harness_trial.run_trial(build_config(tiny_tree), callbacks=[spy])
    assert result.steps == TINY_TRAIN["max_steps"] and 0 <= result.metrics["test/tok_acc"] <= 1
    assert spy.sigusr1 == before  # Lightning's requeue handler would be here


# A SLURM cluster --------------------------------------------------------------------------------------


@pytest.fixture
def slurm_cluster():
    import shutil

    if shutil.which("sbatch") is None:
        pytest.skip(
            "SLURM is not installed (no sbatch on PATH); .ci/slurm.sh installs one and starts a cluster"
        )
    up = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=60)
    if up.returncode != 0 or not {"idle", "mixed", "allocated", "completing"} & set(up.stdout.split()):
        reason = (up.stderr.strip().splitlines() or [up.stdout.strip() or "no node up"])[-1]
        pytest.skip(f"no SLURM controller with a node up ({reason}); .ci/slurm.sh starts one")


@pytest.fixture
def cluster_storage(tmp_path, request) -> tuple[str, list[str]]:
    """(storage URL, extra sweep arguments): the test PostgreSQL server, else SQLite on this one node."""
    if os.environ.get(URL_VARIABLE):
        return request.getfixturevalue("postgres_url"), []
    return f"sqlite:///{tmp_path / 'study.db'}", ["--launch", "single_node=true"]


def submit(study: Path, runs: Path, url: str, *extra: str) -> str:
    """`ablate sweep --launcher slurm`: the job id it printed."""
    done = ablate("sweep", str(study), "--out", str(runs), "--storage", url, "--wandb", "disabled",
                  "--launcher", "slurm", *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("SLURM job ")[1].split(":")[0]


def queue_empty(job: str) -> bool:
    return not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()


def cancel(job: str) -> None:
    """What is left of the job (a requeued task waits for its start time) leaves the queue."""
    subprocess.run(["scancel", job], check=False)
    wait_for(lambda: queue_empty(job), 120, f"SLURM job {job} to leave the queue", poll=1)


@pytest.mark.slow  # about 1.5 min on 2 busy cores
def test_a_4_task_array_runs_every_grid_point_once_and_writes_the_report(
    tmp_path, slurm_cluster, cluster_storage
):  # fmt: skip
    url, extra = cluster_storage
    study, runs = write_study(tmp_path / "cluster.yaml"), tmp_path / "runs"
    job = submit(study, runs, url, "--launch", "tasks=4", *extra)
    try:
        wait_for(lambda: queue_empty(job), 300, f"SLURM job {job} to finish", poll=1)
    finally:
        cancel(job)
    logs = "".join(p.read_text() for p in (runs / "cluster" / "slurm").glob(f"{job}_*.log"))
    done = study_trials(study, url)
    assert [t.state for t in done] == [TrialState.COMPLETE] * 4, logs[-3000:]
    points = [grid_point(f"pos_encoding={p}", s) for p in ("sinusoidal", "none") for s in (0, 1)]
    assert sorted(t.user_attrs["grid_point"] for t in done) == sorted(points)
    assert (runs / "cluster" / "report" / "report.html").is_file(), logs[-3000:]
    assert len(list((runs / "cluster" / "slurm").glob(f"{job}_*.log"))) == 4  # one log per array task


@pytest.mark.slow  # about a minute on 2 busy cores
def test_a_job_from_hostile_folders_runs_with_nothing_in_their_names_run(
    tmp_path, slurm_cluster, cluster_storage
):  # fmt: skip
    """--out and the working folder named with a line break, quotes, command substitution, a blank, '%' and
    '#' (which an #SBATCH line ends at): the job runs there, its log lands under its %A_%a name in that
    folder, the trial completes, and no `touch PWNED` in a name ran."""
    url, extra = cluster_storage
    hostile = "a b\n'c\"$(touch PWNED)`touch PWNED`%A#d;é"
    runs, workdir = tmp_path / f"runs {hostile}", tmp_path / f"work {hostile}"
    workdir.mkdir()
    study = write_study(tmp_path / "cluster.yaml", factors={}, seeds=[0])
    done = ablate("sweep", str(study), "--out", str(runs), "--storage", url, "--wandb", "disabled",
                  "--launcher", "slurm", *extra, cwd=workdir)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.split("SLURM job ")[1].split(":")[0]
    try:
        wait_for(lambda: queue_empty(job), 240, f"SLURM job {job} to finish", poll=1)
    finally:
        cancel(job)
    log = runs / "cluster" / "slurm" / f"{job}_0.log"
    assert log.is_file(), sorted(p.name for p in (runs / "cluster" / "slurm").iterdir())
    assert [t.state for t in study_trials(study, url)] == [TrialState.COMPLETE], log.read_text()[-3000:]
    assert not list(tmp_path.rglob("PWNED")), "a folder's name ran as a command"


@pytest.mark.slow  # about a minute each
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signalled_task_checkpoints_and_another_task_resumes_the_trial(
    tmp_path, slurm_cluster, cluster_storage, signum
):  # fmt: skip
    """What SLURM sends before a time limit (--signal=USR1@90) or to preempt (SIGTERM), sent with scancel to
    the task running the study's one trial: the trial is checkpointed and queued again (never FAILED), the
    task asks to be requeued, and the other task resumes the trial from that checkpoint."""
    url, extra = cluster_storage
    train = {**TINY_TRAIN, "max_steps": 300, "val_every": 10, "checkpoint_every": 20, "deterministic": True}
    base = {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": train}
    study = write_study(tmp_path / "cluster.yaml", factors={}, seeds=[0], base=base)
    runs = tmp_path / "runs"
    job = submit(study, runs, url, "--launch", "tasks=2", *extra)
    try:
        wait_for(lambda: resume_record(url, study, 0), 240, "the trial's first checkpoint", poll=0.2)
        (running,) = study_trials(study, url)
        pid = int(running.user_attrs["worker"].rsplit(":", 1)[1])
        variables = Path(f"/proc/{pid}/environ").read_text().split("\0")
        environ = dict(v.split("=", 1) for v in variables if "=" in v)
        task = environ["SLURM_JOB_ID"]  # the array task's own job id: scancel reaches only it
        subprocess.run(["scancel", f"--signal={signum.name.removeprefix('SIG')}", task], check=True)
        resumed = lambda: study_trials(study, url)[0].state == TrialState.COMPLETE  # noqa: E731
        wait_for(resumed, 240, "the resumed trial", poll=0.5)
        requeued = subprocess.run(["scontrol", "show", "job", task], capture_output=True, text=True).stdout
    finally:
        cancel(job)
    (trial,) = study_trials(study, url)
    assert trial.user_attrs["resumed_from_step"] >= 20
    assert trial.user_attrs["worker"] != running.user_attrs["worker"]  # another task finished it
    assert "Restarts=1" in requeued  # the signalled task asked to come back
    log = (runs / "cluster" / "slurm" / f"{job}_{environ['SLURM_ARRAY_TASK_ID']}.log").read_text()
    assert f"worker: {signum.name}: eval trial 0 checkpointed and queued again" in log, log[-3000:]


# Ray --------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a local Ray cluster starts in about half a minute; the study takes another minute
def test_ray_workers_finish_the_study_and_the_sweep_writes_the_report(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    study, runs = write_study(tmp_path / "cluster.yaml"), tmp_path / "runs"
    # No address: Ray starts a cluster of this machine's cores, as ray.init(num_cpus=os.cpu_count()) would.
    done = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--launcher", "ray",
                  "--launch", "workers=2", timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ray: 2 worker(s)" in done.stdout
    url = f"sqlite:///{runs / 'cluster' / 'study.db'}"
    assert [t.state for t in study_trials(study, url)] == [TrialState.COMPLETE] * 4
    assert (runs / "cluster" / "report" / "report.html").is_file()


def test_a_ray_worker_gets_the_drivers_settings_and_the_storage(monkeypatch, ray_launcher):
    """An actor on another node has its own environment: the settings the sweep checked travel with it."""
    for name in ray_launcher.DRIVER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SWORD_PATH", "/shared/sword")
    monkeypatch.setenv("WANDB_PROJECT", "lab")
    env = ray_launcher.worker_environment("postgresql://db/s", gpus=0.0)
    assert env == {"ABLATE_STORAGE": "postgresql://db/s", "SWORD_PATH": "/shared/sword",
                   "WANDB_PROJECT": "lab", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    assert "CUDA_VISIBLE_DEVICES" not in ray_launcher.worker_environment("postgresql://db/s", gpus=0.5)
