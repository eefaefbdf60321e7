"""rank_record: a job rank's window numbers and setup seconds carry over its sessions (in a process and
across a restarted container), per rank, and survive a state directory that cannot be written."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from stitchfleet.plugin.fleet.rank_record import RankRecord


def test_window_numbers_continue_across_sessions_and_processes(tmp_path: Path) -> None:
    first = RankRecord(tmp_path, "job-1", 0)
    assert [first.window(k) for k in range(3)] == [0, 1, 2]
    assert first.window(1) == 1  # asked again: the same number
    second = RankRecord(tmp_path, "job-1", 0)  # the next session, or the restarted container's
    assert [second.window(k) for k in range(2)] == [3, 4]
    assert RankRecord(tmp_path, "job-1", 1).window(0) == 0  # another rank counts on its own
    assert RankRecord(tmp_path, "job-2", 0).window(0) == 0  # and another job


def test_setup_seconds_add_up_over_the_ranks_sessions(tmp_path: Path) -> None:
    first = RankRecord(tmp_path, "job", 0)
    assert first.setup_total(2.0) == 2.0
    assert first.setup_total(2.5) == 2.5  # a session's figure grows (setup, then warmup): replaced, not added
    first.close()
    second = RankRecord(tmp_path, "job", 0)
    assert second.setup_total(0.5) == 3.0
    crashed = RankRecord(tmp_path, "job", 0)
    assert crashed.setup_total(1.0) == 4.0  # never closed: it still counts
    second.close()
    later = RankRecord(tmp_path, "job", 0)
    assert later.setup_total(0.25) == 4.25
    held = json.loads(later.path.read_text())
    # Closed sessions are folded into one sum; open (or crashed) ones stay listed by session.
    assert held["closed_setup_seconds"] == 3.0
    assert held["setup_seconds"] == {crashed.session: 1.0, later.session: 0.25}


def test_an_unwritable_state_directory_still_numbers_within_the_process(tmp_path: Path) -> None:
    blocked = tmp_path / "state"
    blocked.write_text("a file where the directory should be")
    first, second = RankRecord(blocked, "job", 0), RankRecord(blocked, "job", 0)
    assert [first.window(0), second.window(0), second.window(1)] == [0, 1, 2]
    assert first.setup_total(1.0) == 1.0 and second.setup_total(2.0) == 3.0


def test_a_torn_record_starts_a_new_one(tmp_path: Path) -> None:
    record = RankRecord(tmp_path, "job", 0)
    record.path.parent.mkdir(parents=True)
    record.path.write_text('{"next_window": 7, "setup_sec')
    assert record.window(0) == 0
    assert json.loads(record.path.read_text())["next_window"] == 1


def test_windows_numbered_off_the_callers_thread_in_order(tmp_path: Path) -> None:
    """The hook's per-window cost (issue 29): the record's lock, read and file replace ran on the training step's
    thread at every window close (ms on a busy disk). `window_then` numbers on the writer thread, with the
    numbers `window` gives, in the order handed in."""
    first = RankRecord(tmp_path, "job", 0)
    used: list[tuple[int, int, str]] = []
    for k in range(4):
        first.window_then(k, lambda number, k=k: used.append((k, number, threading.current_thread().name)))
    assert first.drain()
    assert [(k, number) for k, number, _ in used] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert {name for _, _, name in used} == {"stitchfleet-rank-record"}  # never the caller's (this) thread
    first.close()
    second = RankRecord(tmp_path, "job", 0)  # the next session continues after the closed one's windows
    second.window_then(0, lambda number: used.append((0, number, "")))
    second.close()  # close waits for what is queued
    assert used[-1][:2] == (0, 4)
    assert json.loads(second.path.read_text())["next_window"] == 5
