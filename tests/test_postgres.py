"""Scale-out on a real PostgreSQL server: several `ablate worker` processes share one study, and a worker
killed mid-trial is recovered from, as on the SQLite default (test_reliability.py); a database of another
program is left as it was, status reads in a read-only session, and no command shows the password.

The server comes from ABLATE_TEST_POSTGRES_URL (.ci/services.sh starts a throwaway one on loopback); each
test gets a database of its own, dropped afterwards, so reruns never collide."""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import optuna
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, study_trials
from optuna.trial import TrialState
from test_reliability import finish, kill_mid_trial_and_recover, start_worker
from test_storage_faults import refused, said_once_then_went_on, waited_and_gave_up
from typer.testing import CliRunner

import ablate as ablate_api
from ablate.cli import app
from ablate.harness.study.queue import load_phase_study, prepare_study
from ablate.harness.study.storage import chain, connect_args, lock_held, masked_url, open_storage
from ablate.harness.study.validate import load_study
from ablate.schema.trials import EVAL, grid_point, optuna_study_name

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


def write_study(folder) -> Path:
    """A 12-point grid: three positional encodings x four seeds."""
    study = folder / "grid.yaml"
    study.write_text(yaml.safe_dump({
        "name": "grid",
        "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "factors": {"model.pos_encoding": ["sinusoidal", "none", "learned"]},
        "seeds": [0, 1, 2, 3],
        "metric": {"name": "test/tok_acc"},
    }))  # fmt: skip
    return study


def test_three_workers_finish_a_12_point_grid(tmp_path, postgres_url):
    study = write_study(tmp_path)
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


def connections(url: str) -> int:
    """The sessions now open on the database of `url` (this query's own excepted)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            others = "datname = current_database() AND pid <> pg_backend_pid()"
            return connection.execute(sa.text(f"SELECT count(*) FROM pg_stat_activity WHERE {others}")).scalar()
    finally:
        engine.dispose()


def test_reading_a_study_again_and_again_gives_each_connection_back(tmp_path, postgres_url):
    """A notebook asking for results in a loop, a test polling a worker: every read closes its storage. With
    the garbage collector off, an engine left to it would keep its connection open until the server's
    max_connections refused the next one."""
    study = write_study(tmp_path)
    with open_storage(postgres_url) as storage:
        prepare_study(load_study(study), storage)
    api = ablate_api.load_study(study, storage=postgres_url, out=tmp_path / "runs")
    gc.disable()
    try:
        for _ in range(3):
            assert len(api.results()) == 12
            assert api.claims() == []
            assert len(study_trials(study, postgres_url)) == 12
        assert connections(postgres_url) == 0
    finally:
        gc.enable()


def tables(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return sorted(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_database_of_another_program_or_an_empty_one_is_refused_and_left_as_it_was(tmp_path, postgres_url):
    study, runs = write_study(tmp_path), str(tmp_path / "runs")
    proc = ablate("status", "grid", "--storage", postgres_url, "--out", runs)
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2, [f"error: storage {masked_url(postgres_url)}: an empty database, no study in it"]
    )  # fmt: skip
    assert tables(postgres_url) == []
    engine = sa.create_engine(postgres_url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE mine (x int)"))
    engine.dispose()
    line = (f"error: storage {masked_url(postgres_url)}: not an Optuna storage: it holds other tables (mine); "
            "give a file or database of its own")  # fmt: skip
    for command in (["status", "grid"], ["report", "grid"], ["sweep", str(study), "--wandb", "disabled"]):
        proc = ablate(*command, "--storage", postgres_url, "--out", runs)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-2000:]
        assert tables(postgres_url) == ["mine"]


def test_status_reads_in_a_read_only_session_and_no_command_shows_the_password(tmp_path, postgres_url):
    """The test server trusts loopback, so any password connects: in the URL's user info and as a query key,
    percent-encoded both times."""
    password = "Sekr1A@Sekr1B#Sekr1C/ Sekr1D?é:%"
    url = sa.make_url(postgres_url)
    urls = [url.set(password=password).render_as_string(hide_password=False),
            f"{postgres_url}?password={quote(password, safe='')}"]  # fmt: skip
    prepare_study(load_study(write_study(tmp_path)), open_storage(urls[0]))
    read_only = open_storage(urls[0], create_dir=False, read_only=True)
    with pytest.raises(optuna.exceptions.StorageInternalError) as refused:
        optuna.create_study(study_name="another", storage=read_only)
    assert "read-only transaction" in str(refused.value.__cause__)
    for storage in urls:
        for command in ("status", "report"):
            proc = ablate(command, "grid", "--storage", storage, "--out", str(tmp_path / "runs"))
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert "Sekr1" not in proc.stdout + proc.stderr


# The commands a lock on the trials table stops, by its mode.
BLOCKED = {"EXCLUSIVE": ["report", "sweep"], "ACCESS EXCLUSIVE": ["status", "report", "sweep"]}


def test_a_session_waits_for_a_lock_within_the_bound_and_keeps_the_urls_own_server_options():
    url = "postgresql+psycopg2://ann@db/studies?options=-c%20search_path%3Dlab"
    assert connect_args(url, read_only=True, lock_wait_s=60)["options"] == (
        "-c search_path=lab -c lock_timeout=60000 -c default_transaction_read_only=on"
    )
    assert (
        connect_args(url, read_only=False, lock_wait_s=0)["options"] == "-c search_path=lab -c lock_timeout=1"
    )


@contextmanager
def table_locked(url: str, mode: str) -> Iterator[None]:
    """Another session holding a lock on Optuna's trials table, as a psql session's LOCK TABLE does (EXCLUSIVE
    stops writers, ACCESS EXCLUSIVE readers too), until the block ends."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as session:
            session.exec_driver_sql(f"LOCK TABLE trials IN {mode} MODE")
            yield
    finally:
        engine.dispose()


def test_a_lock_another_session_holds_is_said_once_waited_for_and_given_up_in_one_line(
    tmp_path, postgres_url, short_lock_wait
):  # fmt: skip
    """Each command takes the locks it needs as it opens the storage: one held for good is found then, not at
    the statement it blocks. status reads past a lock that stops writers; report and sweep write."""
    study, runs = write_study(tmp_path), str(tmp_path / "runs")
    prepare_study(load_study(study), open_storage(postgres_url))
    sweep = ["sweep", str(study), "--wandb", "disabled"]
    for mode, blocked in BLOCKED.items():
        with table_locked(postgres_url, mode):
            for command in (["status", "grid"], ["report", "grid"], sweep):
                result = CliRunner().invoke(app, [*command, "--storage", postgres_url, "--out", runs])
                if command[0] in blocked:
                    assert refused(result) == waited_and_gave_up(postgres_url, 1), (mode, command)
                else:
                    assert result.exit_code == 0, result.output
    assert tables(postgres_url) and not (tmp_path / "runs" / "grid" / "report").exists()


def test_a_statement_of_an_open_storage_gives_up_on_a_lock_after_the_bound(
    tmp_path, postgres_url, short_lock_wait
):
    """PostgreSQL waits for a lock for ever unless told: every session of the storage gives up after
    LOCK_WAIT_S (lock_timeout), as SQLite's busy timeout does."""
    spec = prepare_study(load_study(write_study(tmp_path)), open_storage(postgres_url))
    storage = open_storage(postgres_url, create_dir=False)
    study_id = storage.get_study_id_from_name(optuna_study_name(spec))
    with table_locked(postgres_url, "ACCESS EXCLUSIVE"):
        started = time.monotonic()
        with pytest.raises(optuna.exceptions.StorageInternalError) as gave_up:
            storage.get_all_trials(study_id)
        assert time.monotonic() - started < 5
    assert any(map(lock_held, chain(gave_up.value)))  # Optuna's error, raised after the lock's
    assert len(storage.get_all_trials(study_id)) == 12  # the same session reads once the lock is let go


def test_a_lock_let_go_while_waiting_on_postgres_is_said_once_and_the_command_goes_on(tmp_path, postgres_url):
    prepare_study(load_study(write_study(tmp_path)), open_storage(postgres_url))
    locked = table_locked(postgres_url, "ACCESS EXCLUSIVE")
    out = said_once_then_went_on(locked, postgres_url, "status", "grid", "--storage", postgres_url)
    assert "0/4" in out  # every variant's four seeds waiting
