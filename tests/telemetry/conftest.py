"""Fixtures for telemetry tests: SQLite in tmp_path, and a real PostgreSQL server on loopback.

The server is pytest-postgresql's PostgreSQLExecutor (pg_ctl). PostgreSQL refuses to run as
root, and CI runs as root: then pg_ctl runs through a small wrapper that switches to an
unprivileged user (`postgres` when the system has it, else `nobody`) with runuser, and the data,
socket and log directories are owned by that user. Every test gets its own database.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from mirakuru.exceptions import AlreadyRunning
from port_for import get_port
from pytest_postgresql.executors import PostgreSQLExecutor

from stitchfleet import settings

START_TIMEOUT_SECONDS = 60


def pg_ctl_path() -> str | None:
    """pg_ctl on PATH, else the newest one of the Debian layout."""
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    found = shutil.which("pg_ctl") or (str(debian[-1]) if debian else None)
    return str(Path(found).resolve()) if found else None


def _unprivileged_user() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and no unprivileged user (postgres/nobody) to run PostgreSQL")


def _as_user_wrapper(base: Path, pg_ctl: str, user: pwd.struct_passwd) -> str:
    wrapper = base / "pg_ctl"
    wrapper.write_text(f'#!/bin/sh\nexec runuser -u {user.pw_name} -- "{pg_ctl}" "$@"\n')
    wrapper.chmod(stat.S_IRWXU)
    for path in (base / "sock", base / "log"):
        path.mkdir()
        os.chown(path, user.pw_uid, user.pw_gid)
    os.chown(base / "data-parent", user.pw_uid, user.pw_gid)
    return str(wrapper)


def _executor(base: Path) -> PostgreSQLExecutor:
    pg_ctl = pg_ctl_path()
    if pg_ctl is None:
        pytest.skip("no PostgreSQL server binaries (pg_ctl); `make test` installs them")
    (base / "data-parent").mkdir()
    if os.getuid() == 0:
        pg_ctl = _as_user_wrapper(base, pg_ctl, _unprivileged_user())
    else:
        (base / "sock").mkdir()
        (base / "log").mkdir()
    port = get_port(None)
    assert port is not None  # port_for answers None only when asked for port -1 (None: any free port)
    return PostgreSQLExecutor(
        executable=pg_ctl,
        host="127.0.0.1",
        port=port,
        user="postgres",
        options="",
        dbname="postgres",
        datadir=str(base / "data-parent" / "data"),
        unixsocketdir=str(base / "sock"),
        logfile=str(base / "log" / "postgresql.log"),
        startparams=f"-w -t {START_TIMEOUT_SECONDS}",
        postgres_options="-c fsync=off -c listen_addresses=127.0.0.1",
        timeout=START_TIMEOUT_SECONDS,
    )


def start_server(server: PostgreSQLExecutor) -> None:
    """Starts `server` and returns once it accepts connections.

    pg_ctl's status can report the postmaster before recovery has finished; a client
    connecting then gets "the database system is starting up" (seen in CI).
    """
    server.start()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        try:
            _admin(server).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


PORT_TRIES = 5  # a free port can be taken between its choice and the server's start (another test's server)


@contextmanager
def running_server() -> Iterator[PostgreSQLExecutor]:
    """Starts a PostgreSQL server on loopback; stops it and removes its files on exit. A port found taken at the
    start (another process bound it after `get_port` chose it: seen with two test runs side by side) is given up
    for another, up to PORT_TRIES times."""
    for attempt in range(PORT_TRIES):
        base = Path(tempfile.mkdtemp(prefix="stitchfleet-pg-"))
        base.chmod(0o755)  # the unprivileged server user must reach its directories
        executor = _executor(base)
        try:
            start_server(executor)
        except AlreadyRunning:
            shutil.rmtree(base, ignore_errors=True)  # never started: nothing of ours to stop
            if attempt + 1 == PORT_TRIES:
                raise
            continue
        except BaseException:
            _stop(executor, base)
            raise
        try:
            yield executor
        finally:
            _stop(executor, base)
        return


def _stop(executor: PostgreSQLExecutor, base: Path) -> None:
    try:
        executor.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PostgreSQLExecutor]:
    """A PostgreSQL server shared by the session's tests (each gets its own database)."""
    with running_server() as server:
        yield server


@pytest.fixture
def own_postgresql_server() -> Iterator[PostgreSQLExecutor]:
    """A PostgreSQL server for one test, which may stop and start it."""
    with running_server() as server:
        yield server


def create_database(server: PostgreSQLExecutor) -> str:
    """A new empty database on `server`, as a SQLAlchemy URL."""
    name = f"sf_{uuid.uuid4().hex[:12]}"
    with _admin(server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://{server.user}@{server.host}:{server.port}/{name}"


def _admin(server: PostgreSQLExecutor) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host=server.host, port=server.port, user=server.user, dbname="postgres", autocommit=True, connect_timeout=10
    )


@pytest.fixture
def pg_url(postgresql_server: PostgreSQLExecutor) -> Iterator[str]:
    """A fresh, empty database on the session server, as a SQLAlchemy URL; dropped after."""
    url = create_database(postgresql_server)
    yield url
    name = url.rsplit("/", 1)[1]
    if postgresql_server.running():
        with _admin(postgresql_server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite file in a directory that does not exist yet (connect must create it)."""
    return f"sqlite:///{tmp_path / 'state' / 'telemetry.db'}"


@pytest.fixture
def state(tmp_path: Path) -> settings.Settings:
    """Settings with state (SQLite file, spool) under tmp_path and a short flush bound."""
    return settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_FLUSH_SECONDS": "10"})


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"
    return str(request.getfixturevalue("pg_url"))
