"""`stitchfleet telemetry ingest SPOOL_DIR`: a spool loads into a database; loading twice changes nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stitchfleet import cli
from stitchfleet.telemetry import spool, spool_ingest
from stitchfleet.telemetry.rows import Row
from tests.telemetry.workload import figures, workload


def _dead_spool(directory: Path, rows_per_file: list[list[Row]]) -> None:
    """Spool files as crashed pods leave them: written, closed, no live owner."""
    for index, rows in enumerate(rows_per_file):
        path = directory / f"pod-{index}{spool.SUFFIX}"
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(spool.encode(row) for row in rows))


def test_ingest_twice_changes_nothing(any_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = workload("run-1", windows=5), workload("run-2", windows=4)
    _dead_spool(tmp_path / "spool", [first, second])
    assert cli.main(["telemetry", "ingest", str(tmp_path / "spool"), "--db", any_url]) == 0
    assert f"{len(first) + len(second)} rows from 2 files" in capsys.readouterr().out
    loaded = figures(any_url)
    assert cli.main(["telemetry", "ingest", str(tmp_path / "spool"), "--db", any_url]) == 0
    assert figures(any_url) == loaded
    # Against the same rows written by the Recorder's own path: the spool lost nothing.
    direct = tmp_path / "direct"
    _dead_spool(direct, [first + second])
    direct_url = f"sqlite:///{tmp_path / 'direct.db'}"
    spool_ingest.load(direct, direct_url)
    assert figures(direct_url) == loaded


def test_bad_lines_are_skipped_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = workload(windows=3)
    _dead_spool(tmp_path / "spool", [rows])
    path = tmp_path / "spool" / f"pod-0{spool.SUFFIX}"
    path.write_text(path.read_text() + "garbage\n")
    url = f"sqlite:///{tmp_path / 'db.db'}"
    assert cli.main(["telemetry", "ingest", str(tmp_path / "spool"), "--db", url]) == 0
    captured = capsys.readouterr()
    assert f"{len(rows)} rows from 1 files" in captured.out
    assert "bad checksum field 'garbage'" in captured.err


def test_a_live_writers_file_is_left_alone(tmp_path: Path) -> None:
    rows = workload(windows=2)
    live = spool.Spool(tmp_path / "spool")
    live.append(rows)
    try:
        summary = spool_ingest.load(tmp_path / "spool", f"sqlite:///{tmp_path / 'db.db'}")
    finally:
        with live.own_rows():
            pass
        live.close()
    assert (summary.files, summary.rows, summary.busy) == (0, 0, [live.path])


def test_missing_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'db.db'}"
    assert cli.main(["telemetry", "ingest", str(tmp_path / "nowhere"), "--db", url]) == 1
    err = capsys.readouterr().err
    assert "spool directory" in err and "does not exist" in err
    assert "Traceback" not in err


KILLED_CHILD = """
import os, signal, sys
import signal
import subprocess
import sys
from pathlib import Path
from stitchfleet.telemetry import spool
from tests.telemetry.workload import workload
own = spool.Spool(Path(sys.argv[1]))
own.append(workload("run-killed", windows=4))
os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit: the kernel drops the lock
"""


def test_a_sigkilled_writers_rows_all_load(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(tmp_path / "spool")], timeout=120, check=False, capture_output=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    url = f"sqlite:///{tmp_path / 'db.db'}"
    summary = spool_ingest.load(tmp_path / "spool", url)
    expected = workload("run-killed", windows=4)
    assert (summary.files, summary.rows, summary.busy) == (1, len(expected), [])
    reference = tmp_path / "reference"
    _dead_spool(reference, [expected])
    reference_url = f"sqlite:///{tmp_path / 'reference.db'}"
    spool_ingest.load(reference, reference_url)
    assert figures(url) == figures(reference_url)
