"""Opening the telemetry database and migrating its schema.

Input: a SQLAlchemy URL (default: `settings.current().database_url`, a SQLite file whose parent
directory is created on first use). Output: an `Engine` (`connect`) and schema changes through the
Alembic migrations shipped in this package (`upgrade`, `downgrade`, `check`), and the two
dialect-specific ways of writing that the store and bulk loads share (`dialect_insert`, `copy_rows`). No alembic.ini is
needed: the Alembic configuration is built here.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, Table, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from stitchfleet import settings

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# Fail fast when the server is unreachable: the recorder spools instead of waiting.
CONNECT_TIMEOUT_SECONDS = 5
# SQLite's busy handler: a statement waits this long for another connection's lock before failing.
SQLITE_BUSY_SECONDS = 30.0
# Where SQLite fails at once instead (no busy handler: turning WAL on, a stale snapshot, WAL recovery),
# `retry_locked` tries again for up to this long, pausing from LOCK_PAUSE_SECONDS, doubled up to 1 s.
LOCK_RETRY_SECONDS = 30.0
LOCK_PAUSE_SECONDS = 0.02
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6

T = TypeVar("T")


class DatabaseError(RuntimeError):
    """The telemetry database URL or server cannot be used; the message says which and why."""


class RowsRejectedError(DatabaseError):
    """The database refused the rows themselves (a value out of a column's range or type): retrying
    cannot help, unlike an unavailable database."""


def resolve_url(url: str | None = None) -> str:
    """The URL to use: the one given, else the settings' database_url."""
    return url or settings.current().database_url


def parse_url(url: str) -> URL:
    """Parses a SQLAlchemy URL, raising DatabaseError with the offending text."""
    try:
        return make_url(url)
    except ArgumentError as err:
        raise DatabaseError(f"malformed database URL {url!r}: {err}") from None


def _prepare_sqlite(parsed: URL) -> dict[str, Any]:
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return {"timeout": SQLITE_BUSY_SECONDS}


def is_locked(err: BaseException) -> bool:
    """Whether `err` (sqlite3's, or SQLAlchemy's wrapping it) is SQLite's lock contention: SQLITE_BUSY or
    SQLITE_LOCKED, extended codes included. Anything else (a missing table, a full disk) is not."""
    cause = getattr(err, "orig", None) or err
    code = getattr(cause, "sqlite_errorcode", None)
    if not isinstance(cause, sqlite3.OperationalError) or code is None:
        return False
    return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def retry_locked(work: Callable[[], T], *, seconds: float = LOCK_RETRY_SECONDS) -> T:
    """`work()`, tried again while it fails with lock contention (`is_locked`) and `seconds` have not passed;
    the last failure, or any other, propagates. `work` must be safe to repeat: a whole transaction."""
    deadline = time.monotonic() + seconds
    pause = LOCK_PAUSE_SECONDS
    while True:
        try:
            return work()
        except Exception as err:
            if not is_locked(err) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets several ranks on one node write while a report reads; FKs are off by default.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        # Turning WAL on takes the file's exclusive lock and SQLite fails at once rather than wait for it:
        # the ranks of a job opening a fresh file together met "database is locked" here (a CI failure of
        # test_schema_race, rows spooled). Once the file is in WAL mode this is a no-op that never fails.
        retry_locked(lambda: cursor.execute("PRAGMA journal_mode=WAL"))
    finally:
        cursor.close()


def connect(url: str | None = None, **engine_options: Any) -> Engine:
    """An Engine for `url` (default from settings); SQLite gets its directory, WAL and FKs."""
    text = resolve_url(url)
    parsed = parse_url(text)
    backend = parsed.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend == "sqlite":
        connect_args = _prepare_sqlite(parsed)
    elif backend == "postgresql":
        connect_args = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    try:
        engine = create_engine(parsed, connect_args=connect_args, pool_pre_ping=True, **engine_options)
    except (ArgumentError, ImportError) as err:
        raise DatabaseError(f"cannot use database URL {parsed.render_as_string()!r}: {err}") from None
    if backend == "sqlite":
        event.listen(engine, "connect", _on_sqlite_connect)
    return engine


def alembic_config(engine: Engine) -> Config:
    """An Alembic Config bound to `engine`, pointing at the packaged migrations."""
    from alembic.config import Config

    # `Config`'s default stdout is the sys.stdout of the moment alembic was first imported, which, imported on
    # demand, may be a stream closed since (a test's captured output): name today's stream.
    config = Config(stdout=sys.stdout)
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    return config


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialises migrations of one SQLite file across processes (the ranks of a job on one host).

    Alembic runs SQLite DDL without a transaction, so a second creator would otherwise meet
    half-made tables. PostgreSQL's transactional DDL needs no lock here.
    """
    database = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    with Path(f"{database}.migrate.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(url: str | None, action: str, revision: str | None = None) -> None:
    engine = connect(url)
    try:
        _migrate(engine, action, revision)
    finally:
        engine.dispose()


# Alembic's `context` and `op` are module-level proxies, one per process: two threads migrating at once
# (two recorders in one process, e.g. two ranks' ledgers in a test) ran each other's DDL on the other's
# SQLite connection and crashed the process (a segfault in sqlite3). The file lock serialises processes.
_ALEMBIC = threading.Lock()


def _migrate(engine: Engine, action: str, revision: str | None) -> None:
    from alembic import command  # here, not at the top: a job's recorder whose schema is current never needs it

    with _ALEMBIC, _migration_lock(engine):
        config = alembic_config(engine)
        if action == "upgrade":
            command.upgrade(config, revision or "head")
        elif action == "downgrade":
            command.downgrade(config, revision or "base")
        else:
            command.check(config)


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Creates or migrates the schema up to `revision` (default: the newest)."""
    _run(url, "upgrade", revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    """Migrates the schema down to `revision` (default: base, i.e. drops every telemetry table)."""
    _run(url, "downgrade", revision)


def check(url: str | None = None) -> None:
    """Raises alembic's AutoGenerateDiffsDetected when models and the migrated schema differ."""
    _run(url, "check")


# Alembic's own bookkeeping table and the names its migration files declare. Read directly rather than through
# alembic: importing it (mako, pygments) cost ~0.2 s of CPU at every job's first write, on a thread beside the
# job's steps (a 1500-step MLP job whose setup was skipped ran 0.3-0.4 s longer than plain TF, 2 cores).
VERSION_TABLE = "alembic_version"
_DECLARED = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.+)$", re.MULTILINE)


def current_revision(engine: Engine) -> str | None:
    """The schema revision stored in the database (None before the first upgrade)."""
    with engine.connect() as connection:
        if not engine.dialect.has_table(connection, VERSION_TABLE):
            return None
        found = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(found) > 1:
        raise DatabaseError(f"{len(found)} schema revisions stored ({', '.join(found)}): migrations branched")
    return found[0] if found else None


def declared_revisions(versions: Path) -> dict[str, str | None]:
    """Each migration file's `revision` -> its `down_revision`, as the files under `versions` declare them."""
    declared: dict[str, str | None] = {}
    for path in sorted(p for p in versions.glob("*.py") if not p.name.startswith("_")):
        names = {name: ast.literal_eval(value.strip()) for name, value in _DECLARED.findall(path.read_text())}
        if "revision" not in names:
            raise DatabaseError(f"{path.name}: no `revision = ...` line")
        declared[names["revision"]] = names.get("down_revision")
    return declared


@functools.cache
def head_revision(versions: Path = MIGRATIONS / "versions") -> str:
    """The newest revision of the packaged migrations: the one no other revises (read once per process)."""
    declared = declared_revisions(versions)
    heads = sorted(set(declared) - {down for down in declared.values() if down is not None})
    if len(heads) != 1:
        raise DatabaseError(f"{len(heads)} head revisions under {versions} ({', '.join(heads)}): expected one")
    return heads[0]


def is_current(engine: Engine) -> bool:
    """Whether the database's schema is at the head revision: every table this version writes exists.

    A revision short of the head is not enough: another process may be half-way through the
    migrations (SQLite's DDL has no transaction), or the file may come from an older version.
    """
    return current_revision(engine) == head_revision()


def dialect_insert(connection: Connection, table: Table) -> Any:
    """An INSERT of `table` with the dialect's ON CONFLICT clauses (PostgreSQL, SQLite); else DatabaseError."""
    from sqlalchemy.dialects import postgresql, sqlite

    name = connection.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise DatabaseError(f"telemetry supports PostgreSQL and SQLite, not {name!r}")


def copy_rows(connection: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """PostgreSQL only: `rows` into `table` by COPY, in the connection's transaction (bulk loads)."""
    driver = connection.connection.driver_connection
    if connection.dialect.name != "postgresql" or driver is None:
        raise DatabaseError(f"COPY needs PostgreSQL, not {connection.dialect.name!r}")
    with driver.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        return parse_url(url).render_as_string(hide_password=True)
    except DatabaseError:
        return repr(url)


def describe_failure(url: str, err: BaseException) -> str:
    """One line for a user: which database, and the first line of what went wrong."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"cannot use database {safe_url(url)}: {text}"
