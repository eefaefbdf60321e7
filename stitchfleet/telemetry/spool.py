"""The local spool: rows that could not reach the database wait here, durably, in order.

Input: batches of rows. Output: one append-only JSON-lines file per process in the spool
directory (`<host>-<pid>-<random>.jsonl`), each line `<crc32 hex> <json>`, fsync'ed after every
batch. A process holds an exclusive flock on its own file for its whole life, so another process
replays a file only once its owner is gone (exited or killed: the kernel drops the lock).
Reading checks every line's checksum: a torn or corrupted line is reported (logged, counted) and
skipped, the other lines are kept.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stitchfleet.telemetry.rows import Row, from_json, to_json

log = logging.getLogger("stitchfleet.telemetry")

SUFFIX = ".jsonl"


def encode(row: Row) -> str:
    """One spool line (with its newline) for `row`."""
    payload = json.dumps(to_json(row), separators=(",", ":"), sort_keys=True)
    return f"{zlib.crc32(payload.encode()):08x} {payload}\n"


def decode(line: str) -> Row:
    """The row of one spool line; ValueError saying why when the line is torn or corrupted."""
    if not line.endswith("\n"):
        raise ValueError("torn line (no newline: the writer stopped mid-line)")
    checksum, _, payload = line.rstrip("\n").partition(" ")
    try:
        expected = int(checksum, 16)
    except ValueError:
        raise ValueError(f"bad checksum field {checksum[:16]!r}") from None
    if zlib.crc32(payload.encode()) != expected:
        raise ValueError("checksum mismatch (corrupted line)")
    try:
        return from_json(json.loads(payload))
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"not a telemetry row: {err}") from None


@dataclass
class SpoolRead:
    """What reading a spool file gave: the good rows in order, and a note per bad line."""

    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read(path: Path) -> SpoolRead:
    """Every intact row of the file at `path`; bad lines are logged, noted and skipped."""
    result = SpoolRead()
    with path.open("r", encoding="utf-8", errors="replace", newline="\n") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                result.rows.append(decode(line))
            except ValueError as err:
                note = f"{path}:{number}: skipped: {err}"
                log.warning("telemetry spool: %s", note)
                result.problems.append(note)
    return result


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Spool:
    """This process's spool file (created on first append) and access to orphaned ones."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        self._handle: IO[str] | None = None
        self._lock = threading.Lock()
        self._lines = 0

    @property
    def pending(self) -> int:
        """Rows in this process's file that are not yet known to be in the database."""
        return self._lines

    def _open(self) -> IO[str]:
        if self._handle is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Locked under a private name first: a replayer never sees this file unlocked.
            hidden = self.path.with_suffix(".new")
            handle = hidden.open("a+", encoding="utf-8", newline="\n")
            _try_lock(handle)
            hidden.rename(self.path)
            self._handle = handle
        return self._handle

    def append(self, rows: Sequence[Row]) -> None:
        """Appends `rows` and fsyncs: when this returns they survive a crash."""
        if not rows:
            return
        text = "".join(encode(row) for row in rows)
        with self._lock:
            handle = self._open()
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            self._lines += len(rows)

    @contextmanager
    def own_rows(self) -> Iterator[SpoolRead]:
        """This process's spooled rows; the file is emptied when the with-block ends without error."""
        with self._lock:
            if self._handle is None or self._lines == 0:
                yield SpoolRead()
                return
            self._handle.flush()
            content = read(self.path)
            yield content
            self._handle.truncate(0)
            self._handle.seek(0)
            os.fsync(self._handle.fileno())
            self._lines = 0

    def orphans(self) -> list[Path]:
        """Spool files of other processes, oldest first (replay order). A file another process removes while they
        are listed (its owner closed it empty, or a replay shipped it) is left out: it raised FileNotFoundError from
        its stat, out of a shipper's wait (a flaky CI run, session 22)."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[float, str, Path]] = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            if path == self.path:
                continue
            try:
                found.append((path.stat().st_mtime, path.name, path))
            except FileNotFoundError:
                continue  # gone since the listing: nothing of it is left to replay
        return [path for _, _, path in sorted(found)]

    def close(self) -> None:
        """Releases the file; removes it when nothing is left in it."""
        with self._lock:
            if self._handle is None:
                return
            self._handle.close()
            self._handle = None
            if self._lines == 0:
                self.path.unlink(missing_ok=True)


@contextmanager
def claimed(path: Path) -> Iterator[SpoolRead | None]:
    """An orphaned file's rows, or None when its owner still holds it (or it is gone).

    The file is deleted when the with-block ends without error: only after the caller committed.
    """
    try:
        handle = path.open("r+", encoding="utf-8", newline="\n")
    except FileNotFoundError:
        yield None
        return
    with handle:
        if not _try_lock(handle):
            yield None
            return
        yield read(path)
        path.unlink(missing_ok=True)
