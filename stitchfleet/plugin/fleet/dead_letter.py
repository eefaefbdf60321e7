"""Rows the operator refused for good: kept on the pod's disk for a person, never retried.

Input: a refused row, the HTTP status and the operator's reason. The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
from pathlib import Path

from stitchfleet.telemetry.rows import Row, to_json

DIRECTORY = "dead-letter"
# 401 (a token the API server may accept after rotation), 408 and 429 are worth another try.
PERMANENT = frozenset({400, 403, 404, 405, 409, 410, 411, 413, 414, 415, 422})


def refused_for_good(status: int | None) -> bool:
    """Whether an answer with `status` refuses the rows for good (None: no answer, retry)."""
    return status in PERMANENT


class DeadLetters:
    """The process's dead-letter file (see the module docstring)."""

    def __init__(self, spool_directory: Path, *, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.path = spool_directory / DIRECTORY / f"{socket.gethostname()}-{os.getpid()}.jsonl"
        self._max = max_bytes
        self._lock = threading.Lock()
        self.dropped = 0

    def add(self, row: Row, status: int, reason: str) -> None:
        """Appends `row` with why it was refused (fsync'ed), unless the file is full."""
        entry = {"status": status, "reason": reason[:2000], "refused_at": dt.datetime.now(dt.UTC).isoformat()}
        line = json.dumps({**entry, "row": to_json(row)}, separators=(",", ":")) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            size = self.path.stat().st_size if self.path.exists() else 0
            if size + len(line) > self._max:
                self.dropped += 1
                return
            with self.path.open("a") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())

    def rows(self) -> list[dict[str, object]]:
        """The entries written so far (for tests and a person reading them)."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
