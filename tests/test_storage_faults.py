"""A storage that is damaged, foreign, too new or locked, a stored spec that is broken or another study's, a
storage in memory, and a password in a storage URL: each ends in one line naming the storage and what is
wrong (exit 2), nothing is written to a database that is not an Optuna storage of this project, and no
secret of a URL is ever printed."""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from urllib.parse import quote

import optuna
import pytest
from conftest import ablate, ablate_exe
from test_sweep import write_study
from typer.testing import CliRunner

import ablate as api
from ablate.cli import app
from ablate.harness import checkpoints
from ablate.harness.artifacts import default_storage_url
from ablate.harness.study.queue import prepare_study
from ablate.harness.study.storage import masked_url, open_storage, url_problem, without_secrets
from ablate.harness.study.validate import load_study, run_problems
from ablate.schema.trials import USER_ATTRS, optuna_study_name


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Path, Path]:
    """A study file and the SQLite storage a sweep leaves for it, made without training: every trial queued,
    one finished with a value and an intermediate value. Tests change copies of it (`copy_runs`)."""
    root = tmp_path_factory.mktemp("stored")
    study = write_study(root / "tiny.yaml")
    spec = load_study(study)
    url = default_storage_url(spec.slug, root / "runs")
    prepare_study(spec, open_storage(url))
    # A trial run by hand, through a storage without the heartbeat Optuna expects with optimize() only.
    phase = optuna.load_study(study_name=optuna_study_name(spec), storage=url)
    trial = phase.ask()
    trial.report(0.5, step=2)
    phase.tell(trial, 0.7)
    db = Path(url.removeprefix("sqlite:///"))
    with closing(sqlite3.connect(db)) as connection:  # the write-ahead log into the file, which a copy takes
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return study, db


def copy_runs(stored: tuple[Path, Path], tmp_path: Path, sql: str = "") -> tuple[Path, Path]:
    """A runs folder holding a copy of the stored study's storage with `sql` run on it: (runs, its file)."""
    db = tmp_path / "runs" / stored[1].parent.name / stored[1].name
    db.parent.mkdir(parents=True)
    shutil.copy(stored[1], db)
    with closing(sqlite3.connect(db)) as connection:
        connection.executescript(sql)
    return tmp_path / "runs", db


def refused(result) -> list[str]:
    """The stderr lines of an in-process command that ended with exit 2, raising nothing else."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    return result.stderr.splitlines()


def user_attr(key: str, value_json: str, table: str = "trial_user_attributes") -> str:
    """SQL that gives trial 0 the attribute `key` holding `value_json`."""
    return (f"INSERT INTO {table} (trial_id, key, value_json) SELECT trial_id, '{key}', '{value_json}' FROM trials "
            "WHERE number = 0")  # fmt: skip


# (what, SQL that does it, what the one line says after "storage <url>: ", a regular expression)
DAMAGES = [
    ("attribute JSON", "UPDATE trial_user_attributes SET value_json = '{broken' WHERE key = 'grid_point'",
     r"damaged data in study 'tiny:eval' \(Expecting property name enclosed in double quotes.*\)"),
    ("study attribute JSON", "UPDATE study_user_attributes SET value_json = '[1,' WHERE key = 'spec'",
     r"damaged data in the studies' attributes \(Expecting value.*\)"),
    ("value as text", "UPDATE trial_values SET value = 'abc'",
     r"damaged data in study 'tiny:eval' \(text 'abc' where a number belongs\)"),
    ("intermediate value as text", "UPDATE trial_intermediate_values SET intermediate_value = 'abc'",
     r"damaged data in study 'tiny:eval' \(text 'abc' where a number belongs\)"),
    ("trial number as text", "UPDATE trials SET number = 'x' WHERE number = 0",
     r"damaged data in study 'tiny:eval' \(text 'x' where a number belongs\)"),
    ("date", "UPDATE trials SET datetime_start = 'yesterday' WHERE datetime_start IS NOT NULL",
     r"damaged data in study 'tiny:eval' \(Invalid isoformat string: 'yesterday'\)"),
    ("state", "UPDATE trials SET state = 'BOGUS'",
     r"damaged data in study 'tiny:eval' \('BOGUS' is not among the defined enum values.*\)"),
    # Valid JSON of a shape no reader takes: the trial and the attribute named (schema/trials.py).
    ("metrics as text", user_attr("metrics", '"abc"'),
     r"damaged data in study 'tiny:eval' \(trial 0: user attribute 'metrics' holds 'abc': input should be a "
     r"valid dictionary\)"),
    ("a metric as text", user_attr("metrics", '{"test/tok_acc": "high"}'),
     r"damaged data in study 'tiny:eval' \(trial 0: user attribute 'metrics'\['test/tok_acc'\] holds 'high': "
     r"input should be a valid number\)"),
    ("factors as a list", "UPDATE trial_user_attributes SET value_json = '[\"model.cell\"]' WHERE key = 'factors'",
     r"damaged data in study 'tiny:eval' \(trial 0: user attribute 'factors' holds \['model.cell'\]: input "
     r"should be a valid dictionary\)"),
    ("seed as text", "UPDATE trial_user_attributes SET value_json = '\"0\"' WHERE key = 'seed'",
     r"damaged data in study 'tiny:eval' \(trial 0: user attribute 'seed' holds '0': input should be a valid "
     r"integer\)"),
    ("resume record without its key", user_attr("resume", '{"step": 5, "state": "a"}'),
     r"damaged data in study 'tiny:eval' \(trial 0: user attribute 'resume' has no 'key'\)"),
    ("retry history as a mapping", user_attr("retry_history", '{"0": 1}', table="trial_system_attributes"),
     r"damaged data in study 'tiny:eval' \(trial 0: system attribute 'retry_history' holds \{'0': 1\}: input "
     r"should be a valid list\)"),
    ("newer schema version", "UPDATE version_info SET schema_version = schema_version + 1, library_version = '99.0'",
     r"written by a newer Optuna: schema \d+ \(v[\w.]+\), made by Optuna 99\.0, where Optuna .* reads schema \d+ "
     r"\(v[\w.]+\); upgrade optuna to read it"),
    ("unknown schema revision", "UPDATE alembic_version SET version_num = 'v99.0.0.a'",
     r"written by a newer Optuna: schema \d+ \(v99\.0\.0\.a\), .*; upgrade optuna to read it"),
    ("older schema revision", "UPDATE alembic_version SET version_num = 'v3.0.0.a'",
     r"written by Optuna \S+, whose schema Optuna \S+ reads once upgraded: optuna storage upgrade --storage "
     r"<this URL>"),
    ("schema version as text", "UPDATE version_info SET schema_version = 'x'",
     r"damaged: its version_info row holds 'x' as the schema version"),
    ("spec invalid", "UPDATE study_user_attributes SET value_json = json_set(value_json, '$.bogus', 1) WHERE key = 'spec'",
     r"study 'tiny': its stored spec is invalid \(bogus: .+\)"),
    ("spec of another study",
     "UPDATE study_user_attributes SET value_json = json_set(value_json, '$.name', 'other') WHERE key = 'spec'",
     r"study 'tiny': its stored spec is for study 'other'"),
    ("no spec", "DELETE FROM study_user_attributes WHERE key = 'spec'",
     r"study 'tiny': no spec is stored with it \(a study ablate did not make\?\)"),
    ("a table of another program", "CREATE TABLE mine (x)",
     r"not an Optuna storage: it holds other tables \(mine\); give a file or database of its own"),
]  # fmt: skip


@pytest.mark.parametrize("command", ["status", "report", "sweep"])
@pytest.mark.parametrize("sql, message", [d[1:] for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_a_damaged_foreign_or_newer_storage_or_stored_spec_is_one_line_naming_it(
    tmp_path, stored, command, sql, message
):
    runs, db = copy_runs(stored, tmp_path, sql)
    study = ["tiny"] if command != "sweep" else [str(stored[0]), "--wandb", "disabled"]
    result = CliRunner().invoke(app, [command, *study, "--out", str(runs)])
    (line,) = refused(result)
    assert re.fullmatch(f"error: storage {re.escape(f'sqlite:///{db}')}: {message}", line), line


def test_every_reader_of_stored_trials_refuses_an_attribute_of_the_wrong_shape(tmp_path, stored):
    runs, db = copy_runs(stored, tmp_path, user_attr("metrics", '"abc"'))
    line = (f"storage sqlite:///{db}: damaged data in study 'tiny:eval' (trial 0: user attribute 'metrics' holds "
            "'abc': input should be a valid dictionary)")  # fmt: skip
    study = str(stored[0])
    for command in (["worker", study, "--wandb", "disabled"], ["worker", "tiny", "--stored", "--wandb", "disabled"],
                    ["dashboard", "tiny", "--port", free_port()]):  # fmt: skip
        proc = ablate(*command, "--out", str(runs), timeout=120)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"error: {line}"]), proc.stderr[-2000:]
    for call in ("results", "claims", "report"):
        with pytest.raises(api.ConfigError, match=f"^{re.escape(line)}$"):
            getattr(api.load_study(study, out=runs), call)()


def test_every_attribute_the_project_stores_has_its_shape():
    """Each user attribute a trial is given is held to a shape (schema/trials.py) before anything
    reads it: one given without would reach its readers unchecked."""
    written = {checkpoints.RESUME_ATTR}
    for path in (Path(__file__).parents[1] / "harness").rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r'trial\.set_user_attr\(\s*"(\w+)"', text))  # not a study's
        for attrs in re.findall(r"user_attrs=\{(.*?)\}", text, re.S):
            written |= set(re.findall(r'"(\w+)":', attrs))
    assert {"metrics", "grid_point", "seed", "resume"} <= written  # the source was read
    assert written <= USER_ATTRS.keys(), written - USER_ATTRS.keys()


def fingerprint(db: Path) -> tuple:
    """A SQLite file as another program left it: its tables, bytes, modification time and the files beside
    it (a journal or write-ahead log a writer would leave)."""
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    return (
        tables,
        hashlib.sha256(db.read_bytes()).hexdigest(),
        db.stat().st_mtime_ns,
        sorted(db.parent.iterdir()),
    )


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_database_of_another_program_is_refused_by_every_command_and_left_as_it_was(tmp_path, stored):
    db = tmp_path / "runs" / "tiny" / "study.db"
    db.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db)) as connection:
        connection.executescript("CREATE TABLE mine (x); INSERT INTO mine VALUES (1);")
    before = fingerprint(db)
    line = (f"error: storage sqlite:///{db}: not an Optuna storage: it holds other tables (mine); give a file "
            "or database of its own")  # fmt: skip
    study = str(stored[0])
    for command in (["status", "tiny"], ["report", "tiny"], ["dashboard", "tiny", "--port", free_port()],
                    ["sweep", study, "--wandb", "disabled"], ["worker", study, "--wandb", "disabled"]):  # fmt: skip
        proc = ablate(*command, "--out", str(tmp_path / "runs"), timeout=120)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), (command, proc.stderr[-2000:])
        assert fingerprint(db) == before, command


def test_an_empty_database_holds_no_study_and_stays_empty(tmp_path):
    db = tmp_path / "runs" / "tiny" / "study.db"
    db.parent.mkdir(parents=True)
    db.touch()
    for command in ("status", "report"):
        result = CliRunner().invoke(app, [command, "tiny", "--out", str(tmp_path / "runs")])
        assert refused(result) == [f"error: storage sqlite:///{db}: an empty database, no study in it"]
    assert db.stat().st_size == 0


# Locks ----------------------------------------------------------------------------------------------------


@contextmanager
def held_exclusively(db: Path) -> Iterator[None]:
    """Another connection holding the file's exclusive lock, as a sqlite3 shell's BEGIN EXCLUSIVE does."""
    with closing(sqlite3.connect(db, isolation_level=None)) as connection:
        connection.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")


def waited_and_gave_up(url: str, seconds: int) -> list[str]:
    """What a command says when the storage at `url` stays locked: once that it waits, then that it gave up."""
    return [f"storage {masked_url(url)}: another process holds its lock; waiting up to {seconds} s",
            f"error: storage {masked_url(url)}: locked by another process; gave up after {seconds} s"]  # fmt: skip


def said_once_then_went_on(held: AbstractContextManager, url: str, *args: str) -> str:
    """`ablate *args` started while `held` holds a lock on the storage at `url`, which is let go once the
    command says it waits: it says so once, then goes on to exit 0; its stdout."""
    with held:
        proc = subprocess.Popen(
            [ablate_exe(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        said = proc.stderr.readline()
    out, rest = proc.communicate(timeout=120)
    assert said == f"storage {masked_url(url)}: another process holds its lock; waiting up to 60 s\n", rest
    assert proc.returncode == 0 and rest == "", rest
    return out


def test_a_lock_held_for_good_is_said_once_waited_for_and_given_up_in_one_line(
    tmp_path, stored, short_lock_wait
):
    runs, db = copy_runs(stored, tmp_path, "PRAGMA journal_mode = DELETE")  # a lock that stops readers too
    with held_exclusively(db):
        for command in ("status", "report"):
            result = CliRunner().invoke(app, [command, "tiny", "--out", str(runs)])
            assert refused(result) == waited_and_gave_up(f"sqlite:///{db}", 1), command


def test_with_a_write_ahead_log_status_reads_past_a_writers_lock_and_report_waits_for_it(
    tmp_path, stored, short_lock_wait
):
    runs, db = copy_runs(stored, tmp_path)
    with held_exclusively(db):
        assert CliRunner().invoke(app, ["status", "tiny", "--out", str(runs)]).exit_code == 0
        # The report writes its notes into the storage: it takes the write lock before it reads anything.
        result = CliRunner().invoke(app, ["report", "tiny", "--out", str(runs)])
        assert refused(result) == waited_and_gave_up(f"sqlite:///{db}", 1)


def test_a_lock_let_go_while_waiting_is_said_once_and_the_command_goes_on(tmp_path, stored):
    runs, db = copy_runs(stored, tmp_path, "PRAGMA journal_mode = DELETE")
    out = said_once_then_went_on(
        held_exclusively(db), f"sqlite:///{db}", "status", "tiny", "--out", str(runs)
    )
    assert "1/2" in out  # lstm's seed 0 done


# Storages in memory ---------------------------------------------------------------------------------------

IN_MEMORY = ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://", "sqlite:///file:x?mode=memory&uri=true"]


@pytest.mark.parametrize("url", IN_MEMORY)
def test_a_storage_in_memory_is_refused_before_anything_starts(tmp_path, stored, url):
    said = (
        "a SQLite database in memory lives and dies with one process, which no worker can reach; give a file"
    )
    ((where, message),) = run_problems(storage=url)
    assert where == "--storage" and message.startswith(f"{url}: {said}")
    result = CliRunner().invoke(
        app, ["sweep", str(stored[0]), "--storage", url, "--out", str(tmp_path / "runs")]
    )
    assert refused(result) == [f"error: --storage: {message}"]
    assert refused(CliRunner().invoke(app, ["status", "tiny", "--storage", url])) == [
        f"error: --storage: {message}"
    ]
    with pytest.raises(api.ConfigError, match=f"^--storage: {re.escape(message)}$"):
        api.load_study(stored[0], storage=url, out=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "url, reason",
    [("postgresql://ann@[::1/studies", "not a database URL"), ("postgresql://ann@db:port/studies", "not a database URL"),
     ("postgresql://ann:pa@ss@db/studies", "it reads two ways: write each @ in the user name, password or query as %40")],
)  # fmt: skip
def test_a_url_no_parser_reads_one_way_is_one_line_from_every_command(tmp_path, stored, url, reason):
    commands = [["sweep", str(stored[0])], ["status", "tiny"], ["report", "tiny"], ["dashboard", "--dry-run"]]
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--storage", url, "--out", str(tmp_path / "runs")])
        (line,) = refused(result)
        assert line.startswith(f"error: --storage: {masked_url(url)}: {reason}"), command
    assert not (tmp_path / "runs").exists()


# Secrets in a storage URL ---------------------------------------------------------------------------------

# A password's words (distinct, so that any part of it that leaks is found) joined by what URLs hold specially.
SEPARATORS = ["#", "@", ":", "/", "%", "?", " ", "é", "%40", "@@", "::", "/?#", "ü ñ"]


def password_words(n: int) -> list[str]:
    return [f"Sekr{n}{letter}" for letter in "ABC"]


def passwords() -> list[tuple[list[str], str]]:
    """(its words, the password) for each separator, and one with all of them."""
    made = [(password_words(n), sep.join(password_words(n))) for n, sep in enumerate(SEPARATORS)]
    words = password_words(len(SEPARATORS))
    return [*made, (words, "".join(w + s for w, s in zip(words, SEPARATORS[:3], strict=True)))]


def storage_urls(password: str, host: str = "db.example:5432") -> list[str]:
    """The password in each place a storage URL takes one, as written and percent-encoded."""
    written = [password, quote(password, safe="")]
    return [
        *(f"postgresql://ann:{p}@{host}/studies" for p in written),
        *(f"postgresql://ann@{host}/studies?{key}={p}&sslmode=prefer" for p in written
          for key in ("password", "passwd", "sslpassword", "token", "secret", "api_key", "Pass%77ord")),
        *(f"postgresql://ann@{host}/studies?sslmode=prefer&password={p}" for p in written),
    ]  # fmt: skip


@pytest.mark.parametrize("words, password", passwords())
def test_no_part_of_a_password_shows_in_a_masked_url_or_a_drivers_message(words, password):
    for url in storage_urls(password):
        shown = masked_url(url)
        assert not any(w in shown for w in words), (url, shown)
        assert "***" in shown and "postgresql://" in shown
        assert url_problem(url) is None or not any(w in url_problem(url) for w in words)
        message = f"could not connect to {url}: password {password!r} was refused"
        assert not any(w in without_secrets(message, url) for w in words)
    # A well-formed URL keeps its user, host and database in view.
    assert (
        masked_url(f"postgresql://ann:{quote(password, safe='')}@db:5432/x")
        == "postgresql://ann:***@db:5432/x"
    )


@pytest.mark.parametrize(
    "url",
    ["postgresql://ann:Sekr9A@[::1/studies", "postgresql://ann:Sekr9A/studies", "postgresql://ann:Sekr9A",
     "ann:Sekr9A@db/studies", "postgresql://ann:Sekr9A@Sekr9A@db/studies", "postgresql://ann:Sekr9A@db:port/x",
     "not a url Sekr9A@db"],
)  # fmt: skip
def test_a_malformed_url_is_masked_up_to_its_host(url):
    assert "Sekr9A" not in masked_url(url)
    assert url_problem(url) is None or "Sekr9A" not in url_problem(url)


@pytest.mark.parametrize("words, password", passwords()[::4])
def test_no_command_prints_a_password(tmp_path, stored, words, password):
    """Each command given a storage URL with a password (on its command line or in ABLATE_STORAGE): the
    server does not answer (a closed port), or the URL is refused before connecting."""
    runs = str(tmp_path / "runs")
    commands = [["sweep", str(stored[0]), "--wandb", "disabled"], ["status", "tiny"], ["report", "tiny"],
                ["dashboard", "tiny", "--dry-run"]]  # fmt: skip
    for url in storage_urls(password, host=f"127.0.0.1:{free_port()}")[::3]:
        for command in commands:
            for args, env in (([*command, "--storage", url], {}), (command, {"ABLATE_STORAGE": url})):
                result = CliRunner().invoke(app, [*args, "--out", runs], env=env)
                said = result.stdout + result.stderr
                assert result.exit_code in (0, 2), (args, result.exception)
                assert not any(w in said for w in words), (args, said)


def test_a_lock_a_statement_gave_up_on_after_opening_is_one_line(tmp_path):
    """Opening checks for a lock; one taken later makes a statement give up after the bound, wrapped by
    SQLAlchemy and Optuna: the command says so in one line, as for a lock found when opening."""
    import sqlalchemy.exc

    from ablate.cli import error_line
    from ablate.harness.study.storage import LOCK_WAIT_S

    db = tmp_path / "x.db"
    with closing(sqlite3.connect(db)) as holder, closing(sqlite3.connect(db, timeout=0)) as waiter:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as busy:
            waiter.execute("INSERT INTO t VALUES (1)")
    try:
        try:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, busy.value)
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as wrapped:
        assert error_line(wrapped) == (1, f"storage locked by another process; gave up after {LOCK_WAIT_S} s")
    assert error_line(RuntimeError("a bug")) is None


@pytest.mark.parametrize(
    "damage, said",
    [
        ("DROP TABLE trials", "damaged: Optuna's table trials missing"),
        # the other damages under -m slow: each command is a process, 14 s a damage on 2 cores
        pytest.param("DROP TABLE trial_values; DROP TABLE trial_params",
                     "damaged: Optuna's tables trial_params, trial_values missing", marks=pytest.mark.slow),
        pytest.param("ALTER TABLE trials DROP COLUMN datetime_complete",
                     "damaged: Optuna's column trials.datetime_complete missing", marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_a_storage_whose_schema_is_damaged_is_one_line_for_every_command_that_opens_it(tmp_path, stored, damage, said):
    runs, db = copy_runs(stored, tmp_path, damage)
    before = fingerprint(db)
    line = f"error: storage sqlite:///{db}: {said}"
    study = str(stored[0])
    for command in (["status", "tiny"], ["report", "tiny"], ["dashboard", "tiny", "--port", free_port()],
                    ["sweep", study, "--wandb", "disabled"], ["worker", study, "--wandb", "disabled"],
                    ["compare", "tiny", "tiny", "--out", str(runs)]):  # fmt: skip
        proc = ablate(*command, "--out", str(runs), timeout=120)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), (command, proc.stderr[-2000:])
        assert fingerprint(db) == before, command
