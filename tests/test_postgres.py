"""Scale-out on a real PostgreSQL server: several `ablate worker` processes share one study, and a worker
killed mid-trial is recovered from, as on the SQLite default (test_reliability.py).

The server comes from ABLATE_TEST_POSTGRES_URL (.ci/services.sh starts a throwaway one on loopback); each
test gets a database of its own, dropped afterwards, so reruns never collide."""

from __future__ import annotations

import os
import uuid

import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate
from optuna.trial import TrialState
from test_reliability import finish, kill_mid_trial_and_recover, start_worker

from ablate.harness.study.queue import EVAL, grid_point, load_phase_study
from ablate.harness.study.storage import open_storage
from ablate.harness.study.validate import load_study

URL_VARIABLE = "ABLATE_TEST_POSTGRES_URL"


@pytest.fixture
def postgres_url():
    """The URL of a fresh, empty database on the test server."""
    url = os.environ.get(URL_VARIABLE)
    if not url:
        pytest.skip(f"{URL_VARIABLE} is not set (.ci/services.sh starts a PostgreSQL server and sets it)")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        connection = admin.connect()
    except sa.exc.OperationalError as e:
        reason = str(e.orig).strip().splitlines()[0]
        pytest.skip(f"no PostgreSQL server reachable at {URL_VARIABLE}={url} ({reason})")
    name = f"ablate_test_{uuid.uuid4().hex[:12]}"
    with connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield sa.make_url(url).set(database=name).render_as_string(hide_password=False)
        finally:
            connection.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_three_workers_finish_a_12_point_grid(tmp_path, postgres_url):
    study = tmp_path / "grid.yaml"
    study.write_text(yaml.safe_dump({
        "name": "grid",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "factors": {"model.pos_encoding": ["sinusoidal", "none", "learned"]},
        "seeds": [0, 1, 2, 3],
        "metric": {"name": "test/tok_acc"},
    }))  # fmt: skip
    runs = tmp_path / "runs"
    # Three workers started together: they race to create the study, and then for every trial.
    workers = [start_worker(study, runs, "--storage", postgres_url) for _ in range(3)]
    for proc in workers:
        finish(proc)

    spec = load_study(study)
    trials = load_phase_study(spec, open_storage(postgres_url), EVAL).get_trials()
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)
    points = sorted(t.user_attrs["grid_point"] for t in trials)
    assert points == sorted(grid_point(v, s) for v in spec.variant_overrides() for s in spec.seeds)
    assert len({t.user_attrs["worker"] for t in trials}) >= 2  # the grid was shared, not run by one

    proc = ablate("report", "grid", "--storage", postgres_url, "--out", str(runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(runs / "grid" / "report" / "results.csv")
    assert len(table) == 12 and (table["state"] == "COMPLETE").all()
    assert table.groupby("variant")["seed"].apply(sorted).tolist() == [[0, 1, 2, 3]] * 3
    md = (runs / "grid" / "report" / "report.md").read_text()
    for variant in spec.variant_overrides():
        assert f"| {variant} | 4 / 4 | 0 | 0 | 0 | 0 |" in md
    assert (runs / "grid" / "report" / "report.html").stat().st_size > 0


def test_killed_worker_trial_is_retried_on_postgres(tmp_path, postgres_url):
    kill_mid_trial_and_recover(tmp_path, postgres_url)
