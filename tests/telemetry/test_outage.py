"""Outages against a real PostgreSQL: stopped mid-run, and a recording process killed with SIGKILL.

Either way: zero rows lost, none counted twice, figures identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pytest_postgresql.executors import PostgreSQLExecutor

from stitchfleet import settings
from stitchfleet.telemetry.recorder import Recorder
from tests.telemetry.conftest import create_database, start_server
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, workload

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 60


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS} s waiting for {what}")
        time.sleep(0.1)


def test_database_stopped_mid_run(
    own_postgresql_server: PostgreSQLExecutor, state: settings.Settings, tmp_path: Path
) -> None:
    url = create_database(own_postgresql_server)
    rows = workload(windows=80, ranks=2)
    third = len(rows) // 3
    recorder = Recorder(url, settings=state, metrics_port=0, batch_size=16, retry_seconds=0.2)
    try:
        for row in rows[:third]:
            recorder.record(row)
        assert recorder.flush(WAIT_SECONDS)
        own_postgresql_server.stop()
        for row in rows[third : 2 * third]:
            recorder.record(row)
        assert recorder.flush(WAIT_SECONDS)
        assert recorder.spool.pending == 2 * third - third
        start_server(own_postgresql_server)
        for row in rows[2 * third :]:
            recorder.record(row)
        _wait_for(lambda: recorder.flush(WAIT_SECONDS) and recorder.spool.pending == 0, "the spool to drain")
    finally:
        recorder.close()
    assert recorder.stats.failures >= 1
    assert recorder.stats.replayed >= third
    assert figures(url) == reference_figures(rows, tmp_path)


def _read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(WAIT_SECONDS):
            raise AssertionError(f"the recording process said nothing for {WAIT_SECONDS} s")
    return process.stdout.readline().strip()


def test_killed_process_is_replayed_by_the_next(
    own_postgresql_server: PostgreSQLExecutor, state: settings.Settings, tmp_path: Path
) -> None:
    url = create_database(own_postgresql_server)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.telemetry.recording_child", url, str(state.spool_dir)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert _read_line(child).startswith("half")
        own_postgresql_server.stop()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert _read_line(child).startswith("spooled")
        child.send_signal(signal.SIGKILL)
        assert child.wait(WAIT_SECONDS) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_SECONDS)
    [orphan] = state.spool_dir.glob("*.jsonl")
    start_server(own_postgresql_server)
    replayer = Recorder(url, settings=state, metrics_port=0)
    replayer.close()
    assert replayer.stats.replayed > 0
    assert not orphan.exists()
    assert figures(url) == reference_figures(workload(windows=60, ranks=2), tmp_path)
