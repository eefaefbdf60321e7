"""Synchronous, committed writes of whole batches: what the operator's ingestion endpoint answers after.

Input: a database URL (schema already at head: the operator upgrades it at start) and batches of
rows. Output: `write(rows)` returns only once the batch is committed in one transaction (the
endpoint acknowledges after it, so an acknowledged row is never lost), through the store's
idempotent upserts (a replayed batch changes nothing); `reverted()` reads the fleet's
quarantined fingerprints, `slower()` its live slower verdicts. Safe to call from many threads
(the engine pools connections).
Database failures raise `database.DatabaseError` with a one-line reason; `database.RowsRejectedError`
when the rows themselves do not fit a column (retrying cannot help).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence

from sqlalchemy import exc as sqlalchemy_exc

from stitchfleet.telemetry import database, fleet_quarantine, queries, store
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.rows import Row
from stitchfleet.telemetry.slow_verdicts import Remembered, SlowerVerdict


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
            known = dict(self._ids)
        try:
            # SQLite lock contention (another writer of the file) is waited out, not answered as a failure
            count, ids = database.retry_locked(lambda: self._transaction(rows, known))
        except (sqlalchemy_exc.DataError, sqlalchemy_exc.IntegrityError, ValueError, OverflowError) as err:
            # The rows' fault, not the server's: the same batch would fail again.
            raise database.RowsRejectedError(database.describe_failure(self.url, err)) from None
        except Exception as err:
            raise database.DatabaseError(database.describe_failure(self.url, err)) from None
        # Only committed job ids are remembered: a rolled-back placeholder row must be made again.
        with self._lock:
            self._ids.update(ids)
        return count

    def _transaction(self, rows: Sequence[Row], known: store.JobIds) -> tuple[int, store.JobIds]:
        ids = dict(known)  # each attempt from the committed ids: a rolled-back one's placeholders are gone
        with self._engine.begin() as connection:
            return store.write_rows(connection, rows, ids), ids

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

    def memory_for(
        self, namespace: str, job_uid: str, *, now: dt.datetime, min_jobs: int, ttl: dt.timedelta
    ) -> Remembered:
        """What the job (namespace, job_uid) may read of the fleet's memory: the reverted fingerprints
        (fleet_quarantine.reverted_for) and the slower and faster verdicts of jobs of several namespaces, or
        of its own (one namespace's jobs never speak for another's)."""
        try:
            reverted = fleet_quarantine.reverted_for(self._engine, namespace, job_uid, fleet_quarantine.Rule(min_jobs))
            verdicts = []
            for outcome in (ProbeOutcome.SLOWER, ProbeOutcome.FASTER):
                fleet = queries.slower_verdicts(
                    self._engine, now=now, min_jobs=min_jobs, ttl=ttl, min_namespaces=2, outcome=outcome
                )
                local = queries.slower_verdicts(
                    self._engine, now=now, min_jobs=min_jobs, ttl=ttl, namespace=namespace, outcome=outcome
                )
                by_key = {verdict.key: verdict for verdict in [*local, *fleet]}
                verdicts.append(tuple(by_key[key] for key in sorted(by_key)))
        except Exception as err:
            raise database.DatabaseError(database.describe_failure(self.url, err)) from None
        return Remembered(frozenset(reverted), slower=verdicts[0], faster=verdicts[1])

    def close(self) -> None:
        """Releases the pooled connections."""
        self._engine.dispose()
