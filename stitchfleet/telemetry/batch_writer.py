"""Synchronous, committed writes of whole batches: what the operator's ingestion endpoint answers after.

Input: a database URL (schema already at head: the operator upgrades it at start) and batches of
rows. Output: `write(rows)` returns only once the batch is committed in one transaction (the
endpoint acknowledges after it, so an acknowledged row is never lost), through the store's
idempotent upserts (a replayed batch changes nothing); `reverted()` reads the fleet's
quarantined fingerprints, `slower()` its live slower verdicts. Safe to call from many threads
(the engine pools connections).
Database failures raise `database.DatabaseError` with a one-line reason.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence

from stitchfleet.telemetry import database, queries, store
from stitchfleet.telemetry.rows import Row
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict


class BatchWriter:
    """One engine shared by the endpoint's request threads."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = database.connect(url)
        self._ids: store.JobIds = {}
        self._lock = threading.Lock()

    def write(self, rows: Sequence[Row]) -> int:
        """Upserts `rows` in one transaction; returns the count once committed."""
        with self._lock:
            ids = dict(self._ids)
        try:
            with self._engine.begin() as connection:
                count = store.write_rows(connection, rows, ids)
        except Exception as err:
            raise database.DatabaseError(database.describe_failure(self.url, err)) from None
        # Only committed job ids are remembered: a rolled-back placeholder row must be made again.
        with self._lock:
            self._ids.update(ids)
        return count

    def reverted(self) -> set[str]:
        """Fingerprints whose fleet verdict is reverted."""
        try:
            return queries.reverted_fingerprints(self._engine)
        except Exception as err:
            raise database.DatabaseError(database.describe_failure(self.url, err)) from None

    def slower(self, *, now: dt.datetime, min_jobs: int, ttl: dt.timedelta) -> list[SlowerVerdict]:
        """The live slower verdicts at `now` (queries.slower_verdicts)."""
        try:
            return queries.slower_verdicts(self._engine, now=now, min_jobs=min_jobs, ttl=ttl)
        except Exception as err:
            raise database.DatabaseError(database.describe_failure(self.url, err)) from None

    def close(self) -> None:
        """Releases the pooled connections."""
        self._engine.dispose()
