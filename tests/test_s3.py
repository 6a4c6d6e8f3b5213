"""Trial files in S3-compatible object storage: workers on machines that share no filesystem (different
--out folders) write there, and a report built in a third folder reads everything from the storage and the
bucket alone. The server is moto's standalone S3 (`moto_server`) on loopback, started here."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ablate, study_trials
from optuna.trial import TrialState
from test_reliability import finish, start_worker, write_study

SECRET = "not-a-real-secret-but-never-on-disk"


def moto_server() -> str | None:
    return shutil.which("moto_server", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def s3_bucket(monkeypatch):
    """s3://<bucket> on a moto server of our own, with the AWS variables a user would set."""
    boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (pip install '.[s3]')")
    exe = moto_server()
    if exe is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]', part of '.[test]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and server.poll() is None, "moto_server did not start"
            time.sleep(0.2)
        for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
            monkeypatch.setenv(key, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket="trials")
        yield client
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow  # two workers and a report: about 1.5 min on 2 busy cores
def test_workers_without_a_shared_folder_meet_in_the_bucket_and_a_third_folder_reports(tmp_path, s3_bucket):
    study = write_study(tmp_path / "crash.yaml", max_steps=20, seeds=[0, 1])
    url, location = f"sqlite:///{tmp_path / 'study.db'}", "s3://trials/team/runs"
    machines = [tmp_path / "machine_a", tmp_path / "machine_b"]
    workers = [start_worker(study, out, "--storage", url, "--artifacts", location) for out in machines]
    for worker in workers:
        finish(worker)
    trials = study_trials(study, url)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    keys = {o["Key"] for o in s3_bucket.list_objects_v2(Bucket="trials")["Contents"]}
    for t in trials:  # every file a trial recorded is in the bucket, under the prefix and the study
        assert {f"team/runs/crash/{i}" for i in t.user_attrs["artifacts"].values()} <= keys
    assert not any("resume-" in key for key in keys)  # finished trials leave no resume checkpoints

    third = tmp_path / "laptop"
    third.mkdir()
    built = ablate(
        "report", "crash", "--storage", url, "--artifacts", location, "--out", str(third), cwd=third
    )
    assert built.returncode == 0, built.stderr[-2000:]
    report = third / "crash" / "report"
    assert {"learning_curves.png", "accuracy_by_length.png", "attention.png"} <= {
        p.name for p in report.iterdir()
    }
    assert not (third / "crash" / "trials").exists()  # nothing came from a local trial folder
    # The credentials stay in the environment: no file anyone wrote holds the secret.
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def test_a_malformed_artifacts_url_is_one_line_and_exit_2(tmp_path):
    study = write_study(tmp_path / "crash.yaml")
    bad = ablate("sweep", str(study), "--out", str(tmp_path / "runs"), "--artifacts", "s3:/nobucket")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --artifacts: expected s3://bucket/prefix (got 's3:/nobucket')"
