"""The Optuna storage of a study: opening it (SQLite file or database server) without writing to a database
that is not an Optuna storage, SQLite's locking, the heartbeat that fails and re-queues the trials of dead
workers, and the storage URL as messages show it (every secret masked)."""

from __future__ import annotations

import functools
import re
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import optuna
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, NoSuchModuleError, ProgrammingError

from ablate.harness.chatter import quiet_experimental
from ablate.harness.extras import require
from ablate.schema.errors import ConfigError, RunFailed
from ablate.schema.spec import HeartbeatSpec
from ablate.schema.trials import attribute_problem

CONNECT_TIMEOUT_S = 10  # an unreachable database server is reported, not waited on
SCHEMA_ATTEMPTS = 10
# Another process's lock on a SQLite file (a writer mid-transaction, a sqlite3 shell's BEGIN EXCLUSIVE) or on
# a PostgreSQL table (a psql session's LOCK TABLE, a schema migration) is waited for this long, when opening
# and by every later statement (SQLite's busy timeout, PostgreSQL's lock_timeout); opening says once that
# it waits. The drivers' codes for a lock still held then: SQLITE_BUSY, PostgreSQL's lock_not_available.
LOCK_WAIT_S = 60
LOCK_POLL_S = 0.5
SQLITE_BUSY, PG_LOCK_NOT_AVAILABLE = 5, "55P03"
# Optuna storages without heartbeats (a JournalStorage's Redis backend or file, GrpcStorageProxy), as a user
# would name them: refused for every run, since a dead worker's trial is only retried through its heartbeat.
NO_HEARTBEAT_SCHEMES = ("grpc", "redis", "rediss")
JOURNAL_FILES = (".log", ".journal")
# The drivers' codes for a disk with no space left: SQLITE_FULL, SQLITE_IOERR_SHMSIZE (WAL's shared-memory
# file could not grow), PostgreSQL's disk_full.
SQLITE_FULL, PG_DISK_FULL = (13, 4874), "53100"
MAX_RETRIES = 3  # a grid point whose worker keeps dying (killed, out of host memory) is given up after this


def open_storage(
    url: str, create_dir: bool = True, heartbeat: HeartbeatSpec = HeartbeatSpec(), read_only: bool = False
) -> Storage:
    """An RDBStorage with a heartbeat: a killed worker's RUNNING trial is failed once its heartbeat is
    `heartbeat.grace` seconds old and re-queued as a WAITING copy (RetryHeartbeatStaleTrialCallback).
    `create_dir`: a new study may start here (a sqlite:/// file's folder is made, an empty database gets
    Optuna's tables); without, a missing or empty store is ConfigError. `read_only` (status, results) creates
    nothing either: SQLite opens read-only, a PostgreSQL session refuses writes. Nothing is written to a
    database that is not an Optuna storage this Optuna reads (`check_store`); a URL naming no storage is
    ConfigError before anything connects (`check_url`)."""
    create = create_dir and not read_only
    driver_url = with_driver(url)  # a missing extra, named as every feature names it
    check_url(url, exists=not create)
    db = sqlite_path(driver_url)
    if create and db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    with errors_named(url):
        check_store(driver_url, url, create, read_only)
        storage = rdb_storage(driver_url, create, read_only, heartbeat)
    if db is not None and not read_only:
        serialize_sqlite_transactions(storage.engine)
    return storage


class Storage(optuna.storages.RDBStorage):
    """Optuna's RDBStorage that gives its connections back when closed (`with open_storage(...) as store:`):
    an engine left to the garbage collector keeps its pooled connection until a full collection, so a process
    opening the storage again and again (a notebook, a poll) would use up PostgreSQL's max_connections."""

    def close(self) -> None:
        self.remove_session()
        self.engine.dispose()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def rdb_storage(url: str, create: bool, read_only: bool, heartbeat: HeartbeatSpec) -> Storage:
    """Optuna's RDBStorage, its tables made when `create`; workers opening a new database at once all create
    them, and a loser, hitting a table, type or version row another made, finds the schema on retrying."""
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        try:
            with quiet_experimental():
                return Storage(
                    url, engine_kwargs=engine_kwargs(url, read_only, busy_s=LOCK_WAIT_S),
                    skip_table_creation=not create, heartbeat_interval=heartbeat.interval,
                    grace_period=heartbeat.grace, heartbeat_stale_trial_callback=retry_callback(MAX_RETRIES),
                )  # fmt: skip
        except DatabaseError as e:
            lost_race = isinstance(e, IntegrityError | ProgrammingError) or "already exists" in first_line(e)
            if not lost_race or attempt == SCHEMA_ATTEMPTS:
                raise
            time.sleep(0.2 * attempt)


@contextmanager
def errors_named(url: str) -> Iterator[None]:
    """What opening the storage at `url` raises, as one line naming it: no space left is RunFailed (a fault
    of the machine, exit 1), the rest ConfigError (a server's refusal, a file that is no database)."""
    try:
        yield
    except (DatabaseError, ArgumentError, ModuleNotFoundError) as e:
        if storage_full(e):
            raise RunFailed(f"storage {masked_url(url)}: no space left on device; free some, then run the "
                            "same command") from None  # fmt: skip
        reason = without_secrets(first_line(e), url)
        raise ConfigError(f"storage {masked_url(url)}: cannot open ({reason})") from None


def first_line(e: BaseException) -> str:
    """The first line of an error's message: the driver's, where SQLAlchemy wraps one (as `orig`)."""
    return str(getattr(e, "orig", None) or e).strip().partition("\n")[0]


def check_url(url: str, exists: bool) -> None:
    """ConfigError when `url` names no storage (url_problem) or, with `exists`, a sqlite:/// file that is
    not there; nothing is connected to."""
    if reason := url_problem(url):
        raise ConfigError(f"--storage: {masked_url(url)}: {reason}")
    db = sqlite_path(url)
    if exists and db is not None and not db.is_file():
        raise ConfigError(f"storage {masked_url(url)}: no such database")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (its path decoded, as SQLite opens it); None for a database server's."""
    parsed = make_url(url)
    return Path(parsed.database) if parsed.get_backend_name() == "sqlite" and parsed.database else None


# What is in the database, before Optuna writes to it ----------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """What a database says of itself: its tables and, in an Optuna storage, the version rows."""

    tables: frozenset[str]
    columns: frozenset[tuple[str, str]] = frozenset()  # (table, column) of every table
    version: object = None  # version_info.schema_version (an int, unless the row is damaged)
    library: str | None = None  # version_info.library_version: the Optuna that made the storage
    revision: str | None = None  # alembic_version: the schema's last migration


def read_schema(connection) -> Schema:
    """The tables and version rows of the database `connection` reads, written to by nothing here."""
    inspector = sa.inspect(connection)
    tables = frozenset(inspector.get_table_names())
    columns = frozenset((table, c["name"]) for table in tables for c in inspector.get_columns(table))
    version = library = revision = None
    if "version_info" in tables:
        version, library = connection.execute(
            sa.text("SELECT schema_version, library_version FROM version_info")
        ).first() or (None, None)
    if "alembic_version" in tables:
        revision = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return Schema(tables, columns, version, library, revision)


@functools.cache
def this_optuna() -> tuple[Schema, frozenset[str]]:
    """The schema this Optuna writes and every schema revision it knows, read off an empty storage it makes
    in memory (in the calling thread, which alone sees that memory): Optuna names them nowhere public."""
    reference = optuna.storages.RDBStorage("sqlite://")
    try:
        with reference.engine.connect() as connection:
            return read_schema(connection), frozenset(reference.get_all_versions())
    finally:
        reference.engine.dispose()


def schema_problem(found: Schema) -> str | None:
    """Why a database holding `found` is no Optuna storage this Optuna may open, or None (an empty one, or
    one whose tables another process is creating right now, is fine)."""
    this, known_revisions = this_optuna()
    foreign = sorted(found.tables - this.tables)
    if foreign:
        return (f"not an Optuna storage: it holds other tables ({', '.join(foreign)}); give a file or "
                "database of its own")  # fmt: skip
    if found.version is None or found.revision is None:
        return None
    if not isinstance(found.version, int):
        return f"damaged: its version_info row holds {found.version!r} as the schema version"
    if found.version > this.version or found.revision not in known_revisions:
        return (f"written by a newer Optuna: schema {found.version} ({found.revision}), made by Optuna "
                f"{found.library}, where Optuna {optuna.__version__} reads schema {this.version} "
                f"({this.revision}); upgrade optuna to read it")  # fmt: skip
    if found.version < this.version or found.revision != this.revision:
        return (f"written by Optuna {found.library}, whose schema Optuna {optuna.__version__} reads once "
                "upgraded: optuna storage upgrade --storage <this URL>")  # fmt: skip
    # This Optuna's schema, finished (its version rows are written last): what it lacks was taken from it.
    missing = sorted(this.tables - found.tables)
    if missing:
        return f"damaged: Optuna's table{'s' * (len(missing) > 1)} {', '.join(missing)} missing"
    lost = sorted(f"{table}.{column}" for table, column in this.columns - found.columns)
    if lost:
        return f"damaged: Optuna's column{'s' * (len(lost) > 1)} {', '.join(lost)} missing"
    return None


def check_store(url: str, shown_url: str, create: bool, read_only: bool) -> None:
    """ConfigError, naming `shown_url`, unless the database at `url` is one `open_storage` may open
    (store_problem). A lock another process holds on a SQLite file or a PostgreSQL table is said once on
    stderr and waited for up to LOCK_WAIT_S, asking again every LOCK_POLL_S."""
    engine = sa.create_engine(url, **engine_kwargs(url, read_only, busy_s=0))
    deadline = None
    try:
        while True:
            try:
                problem = store_problem(engine, create, read_only)
                break
            except DatabaseError as e:
                if not lock_held(e):
                    raise
            if deadline is None:
                print(f"storage {masked_url(shown_url)}: another process holds its lock; waiting up to "
                      f"{LOCK_WAIT_S} s", file=sys.stderr, flush=True)  # fmt: skip
                deadline = time.monotonic() + LOCK_WAIT_S
            elif time.monotonic() > deadline:
                problem = f"locked by another process; gave up after {LOCK_WAIT_S} s"
                break
            time.sleep(LOCK_POLL_S)
    finally:
        engine.dispose()
    if problem:
        raise ConfigError(f"storage {masked_url(shown_url)}: {problem}")


def store_problem(engine, create: bool, read_only: bool) -> str | None:
    """Why `engine`'s database is no storage to open, read without writing: not an Optuna storage or of
    another Optuna version (schema_problem), or empty where a study must be (without `create`). The command's
    locks are taken and let go, so a lock another process holds for good shows now, not at the statement it
    blocks (lock_held is raised): a writer's on a SQLite file; on PostgreSQL each of Optuna's tables in a
    reader's or writer's mode (an EXCLUSIVE lock stops writers, an ACCESS EXCLUSIVE one readers too)."""
    with engine.connect() as connection:
        schema = read_schema(connection)
        if reason := schema_problem(schema):
            return reason
        if not schema.tables and not create:
            return "an empty database, no study in it"
        if not read_only and engine.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            connection.exec_driver_sql("ROLLBACK")
        if schema.tables and engine.dialect.name == "postgresql":
            tables = ", ".join(map(connection.dialect.identifier_preparer.quote, sorted(schema.tables)))
            mode = "ACCESS SHARE" if read_only else "ROW EXCLUSIVE"
            connection.exec_driver_sql(f"LOCK TABLE {tables} IN {mode} MODE")  # let go as the block ends
    return None


def lock_held(e: BaseException) -> bool:
    """The statement gave up on a lock another process holds (SQLite's busy timeout, PostgreSQL's
    lock_timeout): the driver's error, or SQLAlchemy's around it (as `orig`)."""
    driver = getattr(e, "orig", None) or e
    return (
        getattr(driver, "sqlite_errorcode", None) == SQLITE_BUSY
        or getattr(driver, "pgcode", None) == PG_LOCK_NOT_AVAILABLE
    )


def check_readable(storage, url: str, study: str | None = None) -> None:
    """Reads every study's attributes and every trial of `study` (of all studies without one) once through
    Optuna, so damaged data (attribute JSON that does not parse or has the wrong shape, schema/trials.py
    attribute_problem; text where Optuna keeps a number, a date or a state) is one ConfigError naming the
    storage at `url` here, not a traceback wherever it is read next."""
    where, problem = "the studies' attributes", None
    try:
        for frozen in storage.get_all_studies():
            if study is not None and not frozen.study_name.startswith(f"{study}:"):
                continue
            where = f"study {frozen.study_name!r}"
            trials = storage.get_all_trials(storage.get_study_id_from_name(frozen.study_name), deepcopy=False)
            numbers = [
                n for t in trials for n in (t.number, *(t.values or ()), *t.intermediate_values.values())
            ]
            text = (f"text {n!r} where a number belongs" for n in numbers if not isinstance(n, int | float))
            problem = next(text, None) or next(filter(None, map(attribute_problem, trials)), None)
            if problem:
                break
    except (DatabaseError, ValueError, TypeError, LookupError) as e:  # JSON, dates and states Optuna parses
        problem = first_line(e)
    if problem:
        raise ConfigError(f"storage {masked_url(url)}: damaged data in {where} ({problem})")


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


# A query key that holds a credential (password=, passwd=, sslpassword=, token=, secret=, api_key=, ...) and
# its value, up to the next key=value pair or the end: a password may hold an unencoded &, ? or #.
QUERY_PAIR = re.compile(r"[?&](?P<key>[^&=?#]*)=(?P<value>.*?)(?=&[^&=?#]*=|$)", re.S)
CREDENTIAL_WORDS = ("pass", "pwd", "secret", "token", "key", "auth", "cred")
PLAIN_USER = re.compile(r"[^/?#\[\]\s]*")  # a user name that leaves no doubt where the password begins
HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]*\]|[\w.%-]*)(:\d*)?")
MASK = "***"


def masked_url(url: str) -> str:
    """The URL as every message, log and report shows it: each secret (secret_spans) replaced by ***."""
    shown, end = [], 0
    for start, stop in secret_spans(url):
        shown += [url[end:start], MASK]
        end = stop
    return "".join([*shown, url[end:]])


def without_secrets(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with each secret of `url`, as written or decoded, masked."""
    for start, stop in secret_spans(url):
        for secret in {url[start:stop], unquote(url[start:stop])}:
            text = text.replace(secret, MASK)
    return text


def secret_spans(url: str) -> list[tuple[int, int]]:
    """Where a storage URL's secrets lie, in order, read leniently so a URL no parser takes is masked too:
    credential query values and the user info's password (user_info); all the user info when it is not
    plainly user:password, or, with none, all up to the host when what follows // is no host[:port]."""
    spans, info, begin = credential_values(url), user_info(url), authority_start(url)
    if info is not None:
        user, _, password = url[info[0] : info[1]].partition(":")
        if not PLAIN_USER.fullmatch(user):
            spans.append(info)
        elif password:
            spans.append((info[1] - len(password), info[1]))
    elif begin is not None and "://" in url:
        end = next((i for i in range(begin, len(url)) if url[i] in "/?"), len(url))
        if not HOST_PORT.fullmatch(url[begin:end]):
            spans.append((begin, end))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):  # a query key inside a password's span is part of that secret
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged


def credential_values(url: str) -> list[tuple[int, int]]:
    """Where the values of `url`'s credential query keys (password=, token=, ..., names decoded) lie."""
    return [match.span("value") for match in QUERY_PAIR.finditer(url)
            if match["value"] and any(word in unquote(match["key"]).lower() for word in CREDENTIAL_WORDS)]  # fmt: skip


def authority_start(url: str) -> int | None:
    """Where what follows the scheme's // begins (the start of a URL without one); None when a / follows
    at once (sqlite:///path, postgresql:///db: no user info, no host)."""
    scheme_end = url.find("://")
    begin = scheme_end + 3 if scheme_end >= 0 else 0
    return None if url.startswith("/", begin) else begin


def user_info(url: str) -> tuple[int, int] | None:
    """Where `url`'s user info (user[:password]) lies: from the authority's start to its last @ outside the
    values of credential query keys, since a password may hold an unencoded @, /, ? or #; None without."""
    begin = authority_start(url)
    if begin is None:
        return None
    hidden = credential_values(url)
    ats = [i for i in range(begin, len(url)) if url[i] == "@" and not any(a <= i < b for a, b in hidden)]
    return (begin, ats[-1]) if ats else None


def url_problem(url: str) -> str | None:
    """Why `url` cannot name a storage (malformed, unknown database, driver not installed, an unencoded @
    that ends the user info early, a SQLite database in memory), or None; found without connecting:
    whether the server answers is known when the storage is opened."""
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
    except (ArgumentError, ValueError):  # ValueError: a port that is no number, an IPv6 bracket left open
        return "not a database URL, e.g. sqlite:///runs/x/study.db or postgresql://user@host/db"
    except ImportError as e:
        return f"the driver for {parsed.drivername} is not installed ({e.name or e})"
    info = user_info(url)
    user, _, password = url[info[0] : info[1]].partition(":") if info else ("", "", "")
    if (unquote(user), unquote(password)) != (parsed.username or "", parsed.password or ""):
        # SQLAlchemy ends the user info at the first @ it can: it would send part of the password as the host.
        return "it reads two ways: write each @ in the user name, password or query as %40"
    if in_memory(parsed):
        return (
            "a SQLite database in memory lives and dies with one process, which no worker can reach; give "
            "a file, e.g. sqlite:///runs/x/study.db"
        )
    return None


def in_memory(parsed: URL) -> bool:
    """sqlite://, sqlite:///:memory: or a file: URI with mode=memory."""
    database = parsed.database or ""
    return parsed.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or ":memory:" in database or parsed.query.get("mode") == "memory"
    )


def engine_kwargs(url: str, read_only: bool, busy_s: float) -> dict[str, Any]:
    """SQLAlchemy's create_engine options: a statement waits up to `busy_s` for another process's lock;
    read-only, sqlite3 opens a SQLite file itself (SQLAlchemy would decode a read-only URI path's escapes)."""
    db = sqlite_path(url)
    if db is None:
        return {"connect_args": connect_args(url, read_only, busy_s)}
    if not read_only:
        return {"connect_args": {"timeout": busy_s}}
    uri = f"{db.absolute().as_uri()}?mode=ro"
    return {"creator": lambda: sqlite3.connect(uri, uri=True, timeout=busy_s, check_same_thread=False)}


def connect_args(url: str, read_only: bool, lock_wait_s: float) -> dict[str, Any]:
    """A database server's driver options: connecting gives up after CONNECT_TIMEOUT_S; a PostgreSQL
    statement gives up on another session's lock after `lock_wait_s` (lock_held), and a `read_only` session
    refuses every write. The URL's own server options (?options=-c...) are kept: these would replace them."""
    if url.startswith("postgresql"):
        own = make_url(url).query.get("options") or ()
        settings = [*([own] if isinstance(own, str) else own),
                    f"-c lock_timeout={max(1, round(lock_wait_s * 1000))}",  # ms; 0 would wait for ever
                    *(["-c default_transaction_read_only=on"] if read_only else [])]  # fmt: skip
        return {"connect_timeout": CONNECT_TIMEOUT_S, "options": " ".join(settings)}
    if url.startswith("mysql"):
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def retry_callback(max_retry: int | None):
    """Queues a WAITING copy of a failed trial (same params and attrs); the copy's system attr
    'retry_history' lists the trials it replaces."""
    with quiet_experimental():
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def serialize_sqlite_transactions(engine) -> None:
    """Makes Optuna's read-then-write transactions atomic across processes on SQLite. A claim reads WAITING
    and writes RUNNING in one transaction; PostgreSQL and MySQL lock the row (SELECT ... FOR UPDATE), but
    SQLite ignores FOR UPDATE and pysqlite begins the transaction only at the first write, so two workers
    could both claim a trial. BEGIN IMMEDIATE takes the write lock as the transaction starts (others wait up
    to the busy timeout); WAL lets readers that hold no transaction proceed meanwhile."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not issue its own deferred BEGIN
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute(f"PRAGMA busy_timeout={LOCK_WAIT_S * 1000}")
        # The log goes back into the database after every commit and the next writer reuses its file from
        # the start: on a disk that filled up, a small write (a trial queued again) still fits there.
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=1")

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while Optuna created its tables predate the listeners
