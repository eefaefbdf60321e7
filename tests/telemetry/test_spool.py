"""spool: checksummed lines, torn and corrupted lines skipped with a note, orphans locked by owners."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchfleet.telemetry import spool
from tests.telemetry.workload import workload


def test_append_and_read_back_in_order(tmp_path: Path) -> None:
    rows = workload(windows=6)
    own = spool.Spool(tmp_path / "spool")
    own.append(rows[:10])
    own.append(rows[10:])
    assert own.pending == len(rows)
    with own.own_rows() as content:
        assert content.rows == rows
        assert content.problems == []
    assert own.pending == 0
    assert own.path.stat().st_size == 0
    own.close()
    assert not own.path.exists()


def test_corrupted_and_torn_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    rows = workload(windows=3)
    path = tmp_path / "dead.jsonl"
    lines = [spool.encode(row) for row in rows]
    lines[2] = lines[2].replace("pod-1", "pod-9")  # a flipped byte: checksum no longer matches
    lines[4] = "garbage\n"
    path.write_text("".join(lines) + spool.encode(rows[0])[:25])  # torn last line
    content = spool.read(path)
    assert content.rows == [row for i, row in enumerate(rows) if i not in (2, 4)]
    assert [note.split(": skipped: ")[1] for note in content.problems] == [
        "checksum mismatch (corrupted line)",
        "bad checksum field 'garbage'",
        "torn line (no newline: the writer stopped mid-line)",
    ]
    assert content.problems[0].startswith(f"{path}:3:")


def test_an_owned_file_is_not_claimed_until_its_owner_is_gone(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    code = (
        "import sys; from pathlib import Path; from stitchfleet.telemetry import spool;"
        "from tests.telemetry.workload import workload;"
        f"s = spool.Spool(Path({str(directory)!r})); s.append(workload(windows=2));"
        "print(s.path, flush=True); sys.stdin.readline()"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        path = Path(owner.stdout.readline().strip())
        mine = spool.Spool(directory)
        assert mine.orphans() == [path]
        with spool.claimed(path) as content:
            assert content is None  # its owner is alive
    finally:
        owner.communicate("\n", timeout=30)
    with spool.claimed(path) as content:
        assert content is not None
        assert content.rows == workload(windows=2)
    assert not path.exists()


def test_a_file_removed_while_orphans_are_listed_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (a flaky CI run, session 22): another process removed a spool file between the listing and its
    stat (its owner closed it empty, or a replay shipped it), and `orphans` raised FileNotFoundError out of a
    shipper's wait. The file is gone: nothing of it is left to replay."""
    directory = tmp_path / "spool"
    directory.mkdir()
    kept = directory / f"kept{spool.SUFFIX}"
    kept.write_text("")
    gone = directory / f"gone{spool.SUFFIX}"  # listed, then removed before its stat
    listed = Path.glob

    def glob(self: Path, pattern: str) -> Iterator[Path]:
        yield from listed(self, pattern)
        if self == directory:
            yield gone

    monkeypatch.setattr(Path, "glob", glob)
    assert spool.Spool(directory).orphans() == [kept]
