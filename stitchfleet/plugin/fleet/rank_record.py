"""What a job's rank has already recorded in earlier sessions: its next free window number and its setup seconds.

Input: the state directory (STITCHFLEET_STATE_DIR: in a pod the state emptyDir, which outlives a container
restart), the job's uid and the rank; per session, its windows' own indices and its setup seconds so far.
Output: the rank-wide numbers and totals. A window's number is taken on this record's writer thread
(`window_then`): the file's lock, read and atomic replace (ms on a busy disk) stay off the training step's
thread. The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("stitchfleet.plugin")
_LOCK = threading.Lock()
# Per record path, when the file cannot be used: what the file would hold, for this process's sessions.
_MEMORY: dict[str, dict[str, Any]] = {}
DRAIN_SECONDS = 10.0  # at most this long, at close or exit, for the windows still being numbered


def _empty() -> dict[str, Any]:
    # setup_seconds: the open sessions' figures (a crashed one's stays); closed_setup_seconds: the rest, summed.
    return {"next_window": 0, "setup_seconds": {}, "closed_setup_seconds": 0.0}


class RankRecord:
    """One session's view of its rank's record; every method is safe to call from the hook (never raises)."""

    def __init__(self, state_dir: Path, job_uid: str, rank: int) -> None:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in job_uid) or "job"
        self.path = Path(state_dir) / "ranks" / f"{safe}-r{rank}.json"
        self.session = uuid.uuid4().hex
        self._windows: dict[int, int] = {}
        self._warned = False
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()  # not _LOCK: the writer holds that one through its file I/O

    def window_then(self, index: int, use: Callable[[int], None]) -> None:
        """Numbers window `index` (as `window`) on this record's writer thread, then calls `use` with the number
        there; returns at once. Windows are numbered in the order they were handed in, so the numbers are those
        `window` would give; `drain` waits for them."""
        with self._writer_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_queued, name="stitchfleet-rank-record", daemon=True)
                self._writer.start()
                atexit.register(self.drain)
        self._queue.put(lambda: use(self._numbered(index)))

    def _numbered(self, index: int) -> int:
        try:
            return self.window(index)
        except Exception as err:  # the window's row still goes out, with the session's own index
            log.warning("stitchfleet: rank record failed (%s); the window keeps its session index", err)
            return index

    def drain(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Waits until every window handed to `window_then` so far is numbered and used; False on timeout."""
        if self._writer is None:
            return True
        done = threading.Event()
        self._queue.put(done.set)
        return done.wait(timeout)

    def _write_queued(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except Exception:  # bookkeeping: the next windows are still numbered
                log.exception("stitchfleet: rank record: a window could not be numbered")

    def window(self, index: int) -> int:
        """The rank-wide number of this session's window `index` (the same number if asked again)."""
        with _LOCK:
            if index not in self._windows:
                self._windows[index] = self._update(_take_window)
            return self._windows[index]

    def setup_total(self, seconds: float) -> float:
        """Books this session's setup seconds so far; returns the rank's total over all its sessions."""
        with _LOCK:
            return float(self._update(lambda held: _book_setup(held, self.session, seconds)))

    def close(self) -> None:
        """The session is over: its setup seconds join the closed sum (the record stays small over many sessions)."""
        if not self.drain():
            log.warning("stitchfleet: rank record: windows still being numbered after %.0f s", DRAIN_SECONDS)
        with self._writer_lock:
            if self._writer is not None:
                self._queue.put(None)  # the writer ends after what is queued
                self._writer = None
                atexit.unregister(self.drain)
        with _LOCK:
            self._update(lambda held: _close_session(held, self.session))

    def _update(self, change: Any) -> Any:
        """Applies `change` to the record (file, or this process's table when the file fails); its result."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.with_suffix(".lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # ranks share no file, but two processes of one rank might
                held = self._read()
                result = change(held)
                self._write(held)
                return result
        except OSError as err:
            if not self._warned:
                self._warned = True
                log.warning(
                    "stitchfleet: cannot keep the rank's record in %s (%s); numbering in memory", self.path, err
                )
            held = _MEMORY.setdefault(str(self.path), _empty())
            return change(held)

    def _read(self) -> dict[str, Any]:
        memory = _MEMORY.get(str(self.path))
        held: dict[str, Any]
        try:
            held = json.loads(self.path.read_text())
            if not isinstance(held, dict) or not isinstance(held.get("setup_seconds"), dict):
                raise ValueError("not a rank record")
            held["next_window"] = int(held.get("next_window", 0))
            held["closed_setup_seconds"] = float(held.get("closed_setup_seconds", 0.0))
        except FileNotFoundError:
            held = _empty()
        except ValueError:  # a foreign file (writes are atomic renames, so never a torn one): start anew
            log.warning("stitchfleet: unreadable rank record %s; starting a new one", self.path)
            held = _empty()
        if memory is not None:  # sessions of this process that numbered in memory while the file failed
            held["next_window"] = max(held["next_window"], memory["next_window"])
        return held

    def _write(self, held: dict[str, Any]) -> None:
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(held))
        temporary.replace(self.path)


def _take_window(held: dict[str, Any]) -> int:
    number = int(held["next_window"])
    held["next_window"] = number + 1
    return number


def _book_setup(held: dict[str, Any], session: str, seconds: float) -> float:
    held["setup_seconds"][session] = max(float(seconds), 0.0)
    return float(held["closed_setup_seconds"] + sum(held["setup_seconds"].values()))


def _close_session(held: dict[str, Any], session: str) -> None:
    held["closed_setup_seconds"] = float(held["closed_setup_seconds"]) + held["setup_seconds"].pop(session, 0.0)
