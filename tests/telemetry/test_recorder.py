"""Recorder: everything recorded arrives once; an unreachable database spools; the spool replays."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stitchfleet import settings
from stitchfleet.telemetry import database, spool, store
from stitchfleet.telemetry.recorder import Recorder
from tests.telemetry.workload import figures, workload

UNREACHABLE = "postgresql+psycopg://sf@127.0.0.1:9/telemetry"


def reference_figures(rows: list, directory: Path) -> dict[str, object]:
    """The figures of `rows` written straight into a fresh SQLite database."""
    url = f"sqlite:///{directory / 'reference.db'}"
    database.upgrade(url)
    engine = database.connect(url)
    with engine.begin() as connection:
        store.write_rows(connection, rows)
    engine.dispose()
    return figures(url)


def test_everything_recorded_arrives_once(any_url: str, state: settings.Settings, tmp_path: Path) -> None:
    rows = workload(windows=50, ranks=2)
    recorder = Recorder(any_url, settings=state, metrics_port=0, batch_size=32)
    for row in rows:
        recorder.record(row)
    recorder.close()
    assert recorder.stats.written == len(rows)
    assert recorder.stats.spooled == 0
    assert figures(any_url) == reference_figures(rows, tmp_path)
    assert list(state.spool_dir.glob("*")) == []


def test_unreachable_database_spools_and_the_next_process_replays(
    state: settings.Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = workload(windows=20, ranks=2)
    down = Recorder(UNREACHABLE, settings=state, metrics_port=0, retry_seconds=60)
    for row in rows:
        down.record(row)
    down.close()
    assert down.stats.spooled == len(rows)
    assert "cannot use database postgresql+psycopg://sf@127.0.0.1:9/telemetry" in caplog.text
    [left] = state.spool_dir.glob("*.jsonl")
    lines = left.read_text().splitlines(keepends=True)
    victim = next(i for i, row in enumerate(rows) if type(row).__name__ == "StepWindow")
    lines[victim] = lines[victim].replace('"iterations":100', '"iterations":999')
    left.write_text("".join(lines))

    url = f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"
    with caplog.at_level(logging.WARNING, logger="stitchfleet.telemetry"):
        replayer = Recorder(url, settings=state, metrics_port=0)
        replayer.close()
    assert replayer.stats.replayed == len(rows) - 1
    assert replayer.stats.corrupt_lines == 1
    assert f"{left}:{victim + 1}: skipped: checksum mismatch" in caplog.text
    assert figures(url) == reference_figures(rows[:victim] + rows[victim + 1 :], tmp_path)
    assert not left.exists()


def test_malformed_url_and_bad_calls_never_raise(state: settings.Settings, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder("not a url", settings=state, metrics_port=0, retry_seconds=60)
    rows = workload(windows=3)
    for row in rows:
        recorder.record(row)
    recorder.record(None)  # type: ignore[arg-type]
    recorder.close()
    assert "not a telemetry row: None" in caplog.text
    assert "malformed database URL 'not a url'" in caplog.text
    recorder.record(rows[0])  # after close: straight to the spool
    recorder.close()
    spooled = [spool.read(path).rows for path in state.spool_dir.glob("*.jsonl")]
    assert sorted(len(part) for part in spooled) == [1, len(rows)]


def test_metrics_endpoint_of_a_recorder(state: settings.Settings, sqlite_url: str) -> None:
    import urllib.request

    recorder = Recorder(sqlite_url, settings=state, metrics_port=0)
    try:
        assert recorder.metrics_port == 0
    finally:
        recorder.close()
    served = Recorder(sqlite_url, settings=state, metrics_port=_free_port(), metrics_addr="127.0.0.1")
    try:
        for row in workload(windows=2, ranks=1):
            served.record(row)
        url = f"http://127.0.0.1:{served.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        served.close()
    assert 'stitchfleet_iterations_total{mode="baseline"} 100.0' in text


def _free_port() -> int:
    from port_for import get_port

    port = get_port(None)
    assert port is not None
    return port


def test_a_recorder_connects_before_its_first_row(state: settings.Settings, tmp_path: Path) -> None:
    """Its connection (the dialect's imports, a fresh database's schema) happens when it starts, where a job's setup
    waits for it (`connected`), not at its first write beside the job's steps (session 49)."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    recorder = Recorder(url, settings=state, metrics_port=0, batch_seconds=60.0)
    try:
        assert recorder.connection_tried.wait(30.0)
        engine = database.connect(url)
        assert database.is_current(engine)
        engine.dispose()
    finally:
        recorder.close()
    down = Recorder(UNREACHABLE, settings=state, metrics_port=0, retry_seconds=60)
    assert down.connection_tried.wait(30.0)  # an outage ends the wait too: the rows go to the spool
    down.close()
    assert down.stats.failures == 1
