"""SQLite lock contention is waited out, never taken for an outage (rows spooled at first contention).

Regression (CI under load, issue 34): `test_schema_race[sqlite]` failed with "database is locked;
spooling", `written 0 spooled 1`. Turning WAL on needs the file's exclusive lock and SQLite fails at
once there instead of calling its busy handler, so a rank opening a fresh file while another held
a lock on it took the database for down. These tests hold that lock from a real second connection.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from stitchfleet import settings
from stitchfleet.telemetry import database
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry.recorder import Recorder
from stitchfleet.telemetry.rows import JobKey, JobStarted

HELD_SECONDS = 1.0


def _hold_write_lock(path: Path) -> tuple[sqlite3.Connection, threading.Timer]:
    """A connection holding a write transaction on `path` (still in rollback-journal mode, as a fresh file
    is), committed by a timer after HELD_SECONDS."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE IF NOT EXISTS outside (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO outside VALUES (1)")
    timer = threading.Timer(HELD_SECONDS, lambda: holder.execute("COMMIT"))
    timer.start()
    return holder, timer


@pytest.mark.timeout(60)  # SQLite waiting for the lock (its busy handler) would hang here: that is the failure
def test_turning_wal_on_fails_at_once_where_another_connection_holds_the_lock(tmp_path: Path) -> None:
    """The situation, in sqlite3 alone: no busy handler for the journal-mode change.

    The lock is held until this test lets it go, not for a fixed time: on a loaded machine a timer could
    commit before the PRAGMA ran (it then succeeds and proves nothing), so no step here races a clock."""
    path = tmp_path / "fresh.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE IF NOT EXISTS outside (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO outside VALUES (1)")
    try:
        other = sqlite3.connect(path, timeout=3600)  # a busy handler that waited would outlast the test
        with pytest.raises(sqlite3.OperationalError) as raised:
            other.execute("PRAGMA journal_mode=WAL")
        assert database.is_locked(raised.value)
        # retry_locked gives up past its bound while the lock is held ...
        with pytest.raises(sqlite3.OperationalError):
            database.retry_locked(lambda: other.execute("PRAGMA journal_mode=WAL"), seconds=0.1)
        # ... and waits it out within its bound: the holder commits after the first refusal
        attempts: list[sqlite3.OperationalError] = []

        def turn_wal_on() -> tuple[str, ...]:
            try:
                return tuple(other.execute("PRAGMA journal_mode=WAL").fetchone())
            except sqlite3.OperationalError as err:
                attempts.append(err)
                if holder.in_transaction:
                    holder.execute("COMMIT")
                raise

        assert database.retry_locked(turn_wal_on) == ("wal",)
        assert len(attempts) == 1 and database.is_locked(attempts[0])
        other.close()
    finally:
        holder.close()


def test_only_lock_contention_is_retried() -> None:
    calls: list[int] = []

    def missing_table() -> None:
        calls.append(1)
        sqlite3.connect(":memory:").execute("SELECT * FROM nowhere")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        database.retry_locked(missing_table)
    assert calls == [1]
    assert not database.is_locked(ValueError("database is locked"))


def test_a_rank_opening_a_fresh_file_while_another_holds_its_lock_writes_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.sqlite"
    url = f"sqlite:///{path}"
    holder, timer = _hold_write_lock(path)
    try:
        current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state")})
        recorder = Recorder(url, settings=current, metrics_port=0)
        recorder.record(JobStarted(JobKey("local", "default", "locked", "uid-3"), rank=0, world_size=1))
        recorder.close(timeout=60)
    finally:
        timer.join()
        holder.close()
    assert (recorder.stats.written, recorder.stats.spooled) == (1, 0)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.select(tables.Job.job_name)).scalars().all() == ["locked"]
    finally:
        engine.dispose()
