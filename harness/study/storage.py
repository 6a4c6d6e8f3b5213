"""The Optuna storage of a study: opening it (SQLite file or database server), SQLite's locking, and the
heartbeat that fails and re-queues the trials of dead workers."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, NoSuchModuleError, ProgrammingError

from ablate.harness.errors import ConfigError, RunFailed
from ablate.harness.extras import require
from ablate.harness.study.spec import HeartbeatSpec

CONNECT_TIMEOUT_S = 10  # an unreachable database server is reported, not waited on
SCHEMA_ATTEMPTS = 10
# Optuna storages without heartbeats (a JournalStorage's Redis backend or file, GrpcStorageProxy), as a user
# would name them: refused for every run, since a dead worker's trial is only retried through its heartbeat.
NO_HEARTBEAT_SCHEMES = ("grpc", "redis", "rediss")
JOURNAL_FILES = (".log", ".journal")
# The drivers' codes for a disk with no space left: SQLITE_FULL, SQLITE_IOERR_SHMSIZE (WAL's shared-memory
# file could not grow), PostgreSQL's disk_full.
SQLITE_FULL, PG_DISK_FULL = (13, 4874), "53100"
MAX_RETRIES = 3  # a grid point whose worker keeps dying (killed, out of host memory) is given up after this


def open_storage(url: str, create_dir: bool = True, heartbeat: HeartbeatSpec = HeartbeatSpec()):
    """An RDBStorage with a heartbeat: the RUNNING trial of a killed worker is failed once its heartbeat is
    `heartbeat.grace` seconds old, and re-queued as a WAITING copy (RetryHeartbeatStaleTrialCallback)."""
    url = with_driver(url)
    sqlite = url.startswith("sqlite:///")
    if sqlite:
        db = Path(url.removeprefix("sqlite:///"))
        if create_dir:
            db.parent.mkdir(parents=True, exist_ok=True)
        elif not db.is_file():
            raise ConfigError(f"storage {masked_url(url)}: no such database")
    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with quiet_experimental():
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": connect_args(url)},
                    heartbeat_interval=heartbeat.interval, grace_period=heartbeat.grace,
                    heartbeat_stale_trial_callback=retry_callback(MAX_RETRIES),
                )  # fmt: skip
            break
        # DatabaseError covers the server's refusals and a file that is no database (overwritten, truncated).
        except (DatabaseError, ArgumentError, ModuleNotFoundError) as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            # Workers that open a new database at the same moment all create Optuna's tables; the losers
            # hit a table, type or version row another just made. Opening again finds the schema there.
            lost_race = isinstance(e, IntegrityError | ProgrammingError) or "already exists" in reason
            if storage_full(e):  # a fault of the machine, not of the URL: exit 1
                raise RunFailed(f"storage {masked_url(url)}: no space left on device; free some, then run the "
                                "same command") from None  # fmt: skip
            if not lost_race or attempt == SCHEMA_ATTEMPTS - 1:
                raise ConfigError(f"storage {masked_url(url)}: cannot open ({reason})") from None
            time.sleep(0.2 * (attempt + 1))
    if sqlite:
        serialize_sqlite_transactions(storage.engine)
    return storage


def with_driver(url: str) -> str:
    """PostgreSQL URLs through psycopg2 (the [postgres] extra): SQLAlchemy 2.1 reads a bare postgresql://
    as psycopg 3, which nothing installs."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    if url.startswith("postgresql+psycopg2://"):
        require("psycopg2", extra="postgres", feature="PostgreSQL storage")
    return url


def storage_full(e: BaseException) -> bool:
    """The storage could not write for want of space (SQLITE_FULL above), anywhere in the chain (Optuna
    wraps SQLAlchemy's error, which wraps the driver's)."""
    return any(
        getattr(c, "sqlite_errorcode", None) in SQLITE_FULL or getattr(c, "pgcode", None) == PG_DISK_FULL
        for c in chain(e)
    )


def chain(e: BaseException | None) -> Iterator[BaseException]:
    """An exception and the ones it was raised from or while handling."""
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


def masked_url(url: str) -> str:
    """The URL as every message, banner and report shows it: the password replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def url_problem(url: str) -> str | None:
    """Why `url` cannot name a storage (malformed, unknown database, driver not installed), or None; found
    without connecting: whether the server answers is known when the storage is opened."""
    if url.partition("://")[0] in NO_HEARTBEAT_SCHEMES or url.endswith(JOURNAL_FILES):
        return (
            "Optuna's journal storages and gRPC proxy keep no heartbeat: the trial of a worker that dies "
            "would stay RUNNING for good, never retried; use SQLite or PostgreSQL"
        )
    try:
        parsed = make_url(with_driver(url))
        parsed.get_dialect().import_dbapi()
    except ConfigError as e:  # with_driver's: the extra to install
        return str(e)
    except NoSuchModuleError:  # before ArgumentError, its base class
        return f"unknown database {parsed.drivername!r}"
    except ArgumentError:
        return "not a database URL, e.g. sqlite:///runs/x/study.db or postgresql://user@host/db"
    except ImportError as e:
        return f"the driver for {parsed.drivername} is not installed ({e.name or e})"
    return None


def connect_args(url: str) -> dict[str, Any]:
    """Driver options: SQLite waits for the write lock (several local workers share the file); network
    databases give up connecting after CONNECT_TIMEOUT_S."""
    if url.startswith("sqlite"):
        return {"timeout": 60}
    if url.startswith(("postgresql", "mysql")):
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def retry_callback(max_retry: int | None):
    """Queues a WAITING copy of a failed trial (same params and attrs); the copy's system attr
    'retry_history' lists the trials it replaces."""
    with quiet_experimental():
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


@contextmanager
def quiet_experimental() -> Iterator[None]:
    """Heartbeats, failing stale trials and retry copies are stable in practice but still flagged
    experimental: one warning per storage or worker would bury what a user needs to see."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def serialize_sqlite_transactions(engine) -> None:
    """Makes Optuna's read-then-write transactions atomic across processes on SQLite.

    Claiming a WAITING trial reads its state and writes RUNNING in one transaction. PostgreSQL and MySQL lock
    the row (SELECT ... FOR UPDATE); SQLite ignores FOR UPDATE and pysqlite only begins the transaction at
    the first write, so two workers could both read WAITING and both claim the trial. BEGIN IMMEDIATE takes
    the database's write lock when the transaction starts (others wait up to the busy timeout). WAL lets
    readers that hold no transaction proceed meanwhile."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not issue its own deferred BEGIN
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA busy_timeout=60000")
        # The log goes back into the database after every commit and the next writer reuses its file from
        # the start: on a disk that filled up, a small write (a trial queued again) still fits there.
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=1")

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while Optuna created its tables predate the listeners
