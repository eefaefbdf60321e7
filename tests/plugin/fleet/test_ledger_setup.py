"""The Ledger keeps the database client out of a job's way: in local mode reading the fleet's memory imports no
SQLAlchemy (the fleet's reverted clusters are read with sqlite3), rows wait in memory until the client opens in the
background (the hook starts it as its setup starts and waits for it at the setup's end: test_hook_database_client),
and every row still reaches the database, in order."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from sqlalchemy import Connection

from stitchfleet import settings
from stitchfleet.plugin.fleet import ledger as ledger_module
from stitchfleet.plugin.fleet import local_memory
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.fleet.local_memory import sqlite_reverted
from stitchfleet.telemetry import database, models, store
from stitchfleet.telemetry.queries import reverted_fingerprints
from stitchfleet.telemetry.recorder import Recorder
from stitchfleet.telemetry.rows import ClusterVerdict, Row
from tests.plugin.recorded_events import events

CHILD = textwrap.dedent(
    """
    import sys
    from stitchfleet import settings
    from stitchfleet.plugin.fleet.ledger import Ledger
    ledger = Ledger(settings.current(), rank=0, world_size=1, url=sys.argv[1])
    ledger.started()
    assert ledger.reverted(timeout=30.0) == {"f" * 64}
    ledger.event("compile_failure", None, None, "before the client", detail="recorded during setup")
    assert "sqlalchemy" not in sys.modules, "setup imported SQLAlchemy"
    ledger.compiled(1.5)  # setup is booked: the client opens in the background
    ledger.event("compile_failure", None, None, "after setup", detail="recorded once setup was booked")
    ledger.close()
    assert "sqlalchemy" in sys.modules
    print(ledger.key.job_uid)
    """
)


def _database_with_a_reverted_cluster(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    recorder = Recorder(url, settings=settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "seed")}))
    recorder.record(ClusterVerdict("f" * 64, "reverted", "an earlier job"))
    recorder.record(ClusterVerdict("e" * 64, "enabled"))
    recorder.close()
    return url


def test_sqlite_reverted_reads_what_the_sqlalchemy_query_reads(tmp_path: Path) -> None:
    url = _database_with_a_reverted_cluster(tmp_path)
    assert sqlite_reverted(url) == reverted_fingerprints(url) == {"f" * 64}
    assert models.Cluster.__tablename__ == local_memory.CLUSTERS_TABLE
    assert sqlite_reverted(f"sqlite:///{tmp_path / 'none.db'}") == set()  # no database yet: none known
    assert not (tmp_path / "none.db").exists()  # and reading did not create one
    assert sqlite_reverted("sqlite://") == set()


def test_setup_imports_no_database_client_and_every_row_arrives(tmp_path: Path) -> None:
    url = _database_with_a_reverted_cluster(tmp_path)
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    failures = events(url, "compile_failure")
    assert [e.reason for e in sorted(failures, key=lambda e: e.occurred_at)] == ["before the client", "after setup"]


def test_rows_still_waiting_at_exit_reach_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'exit.db'}"
    code = (
        "import sys; from stitchfleet import settings; from stitchfleet.plugin.fleet.ledger import Ledger; "
        "ledger = Ledger(settings.current(), 0, 1, url=sys.argv[1]); "
        "ledger.event('compile_failure', None, None, 'setup failed', detail='and the process ended')"
    )
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [e.reason for e in events(url, "compile_failure")] == ["setup failed"]


def test_the_recorder_is_there_once_asked_for(tmp_path: Path) -> None:
    local = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "u"})
    ledger = Ledger(local, 0, 1)
    ledger.started()  # waits in memory
    assert type(ledger.recorder).__name__ == "Recorder"  # asking for it opens it
    ledger.close()


SPOOLED = textwrap.dedent(
    """
    import sys
    from stitchfleet import settings
    from stitchfleet.plugin.fleet.ledger import Ledger
    ledger = Ledger(settings.current(), rank=0, world_size=1, url=sys.argv[1])
    ledger.started()
    ledger.spool_meanwhile()  # a job that runs as written: its rows need no database client
    ledger.setup_skipped("setup skipped: job too short", "ran as written")
    ledger.close()
    assert "sqlalchemy" not in sys.modules, "a job that skipped its setup imported SQLAlchemy"
    """
)


def test_a_job_that_skips_its_setup_spools_its_rows_and_the_next_reader_loads_them(tmp_path: Path) -> None:
    """Issue 29 (out of the way): the client's imports cost a job that runs as written 0.3-0.4 s of the CPU its
    steps run on. Its rows wait in the spool, durable, until a Recorder on the state directory replays them."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", SPOOLED, url], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "telemetry.db").exists() and list((tmp_path / "state" / "spool").glob("*.jsonl"))
    later = Ledger(settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state")}), 0, 1, url)
    later.event("compile_failure", None, None, "a later job", detail="its own row")
    later.close()  # its Recorder replayed the orphaned file first
    assert [e.reason for e in events(url, "setup")] == ["setup skipped: job too short"]
    assert [e.reason for e in events(url, "compile_failure")] == ["a later job"]
    assert not list((tmp_path / "state" / "spool").glob("*.jsonl"))  # claimed: loaded once


def test_a_spooled_job_that_sets_up_after_all_writes_every_row_in_order(tmp_path: Path) -> None:
    """A plain session's job waits with its rows spooled; when its setup comes, the client opens and replays them
    before the rows of the setup."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    local = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "w"})
    ledger = Ledger(local, 0, 1, url)
    ledger.started()
    ledger.spool_meanwhile()
    ledger.event("setup", None, None, "setup deferred", detail="waiting")
    assert type(ledger.recorder).__name__ == "SpoolSink"  # nothing opens the client while it waits
    ledger.compiled(2.0)  # the setup came: the client opens
    ledger.event("setup", None, None, "setup 2.00 s", detail="compiled")
    ledger.close()
    setups = sorted(events(url, "setup"), key=lambda e: e.occurred_at)
    assert [e.reason for e in setups] == ["setup deferred", "setup 2.00 s"]


def test_a_server_database_is_never_left_to_the_spool(tmp_path: Path) -> None:
    """A database on a server is not this machine's: whoever would load the spool may never run here."""
    local = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "s"})
    ledger = Ledger(local, 0, 1, "postgresql://nobody@127.0.0.1:9/none")
    ledger.started()
    ledger.spool_meanwhile()
    assert ledger._spooling is None and ledger._pending is not None  # the rows still wait for the client
    atexit.unregister(ledger._at_exit)  # no server to write them to here


def test_a_jobs_rows_are_written_in_few_batches(tmp_path: Path) -> None:
    """Session 48: each of the job's Recorder writes held the GIL for 4-6 ms of Python whatever its few rows, and
    came every 0.2 s: one step in ~130 of the MLP's 1.2 ms steps waited for one once stitching was off. The job's
    rows now wait BATCH_SECONDS (2 s) between writes: rows recorded over 1 s take at most two writes (at 0.2 s, five
    or more), and every one of them is in the database once the ledger closes."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state")})
    writes: list[int] = []
    write_rows = store.write_rows

    def counted(connection: Connection, rows: Iterable[Row], ids: store.JobIds | None = None) -> int:
        batch = list(rows)
        writes.append(len(batch))
        return write_rows(connection, batch, ids)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "write_rows", counted)
        ledger = Ledger(current, rank=0, world_size=1, url=url)
        ledger.open_later()
        assert ledger.opened(30.0)
        ledger.started()
        recorder = ledger.recorder
        assert isinstance(recorder, Recorder) and recorder.flush(30.0)  # its schema made, its writer in its loop
        writes.clear()
        for n in range(20):  # over 1 s: 5 writes or more at 0.2 s
            ledger.event("compile_failure", None, None, "a row", detail=f"row {n}")
            time.sleep(0.05)
        ledger.close()
    assert ledger_module.BATCH_SECONDS >= 1.0
    assert sum(writes) == 20 and len(writes) <= 2, writes
    assert len(events(url, "compile_failure")) == 20


def test_the_client_is_connected_with_its_schema_when_opened_returns(tmp_path: Path) -> None:
    """Session 49: the Recorder connected at its first write, BATCH_SECONDS after it started, so its connection (the
    dialect's imports, a fresh database's schema: 0.1-0.3 s of Python) ran beside the job's steps, not in the setup
    that waits for the client (`Ledger.opened`): ~100 of the MLP's 1.2 ms steps took 3-7 ms each, unbooked. With no
    row recorded, the schema is in place once `opened` returns."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    ledger = Ledger(settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state")}), rank=0, world_size=1, url=url)
    ledger.open_later()
    assert ledger.opened(30.0)
    engine = database.connect(url)
    try:
        assert database.is_current(engine)
    finally:
        engine.dispose()
        ledger.close()
