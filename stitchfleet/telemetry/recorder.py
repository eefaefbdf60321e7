"""The Recorder: a training loop hands it rows and never waits on, or fails because of, the database.

Input: rows (`record`). Output: the rows in the telemetry database, written by a background thread
in batches with idempotent upserts; while the database is unreachable, in this process's spool
(fsync'ed), replayed in order once it answers again. Orphaned spool files of crashed processes
are replayed too, on start and at every retry. `close()` (also run at exit) waits at most
`flush_seconds`; whatever is not in the database by then is in the spool.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from stitchfleet import settings as settings_module
from stitchfleet.telemetry import database, spool, store
from stitchfleet.telemetry.metrics import Metrics
from stitchfleet.telemetry.rows import ROW_TYPES, Row

log = logging.getLogger("stitchfleet.telemetry")
ROW_CLASSES = tuple(ROW_TYPES.values())


@dataclass
class RecorderStats:
    """Counts since start: rows written directly, spooled, replayed, and spool lines skipped."""

    recorded: int = 0
    written: int = 0
    spooled: int = 0
    replayed: int = 0
    corrupt_lines: int = 0
    failures: int = 0


class _Stop:
    """Queue marker: drain and end the writer."""


_STOP = _Stop()
Item = Row | threading.Event | _Stop


class Recorder:
    """Non-blocking telemetry sink for one process; see the module docstring."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: settings_module.Settings | None = None,
        spool_dir: Path | None = None,
        metrics_port: int | None = None,
        metrics_addr: str = "0.0.0.0",
        batch_size: int = 500,
        batch_seconds: float = 0.2,
        retry_seconds: float = 2.0,
    ) -> None:
        current = settings or settings_module.current()
        self.url = url or current.database_url
        self.flush_seconds = current.flush_seconds
        self.spool = spool.Spool(spool_dir or current.spool_dir)
        self.stats = RecorderStats()
        self.metrics = Metrics()
        self.metrics_port = 0
        self._batch_size, self._batch_seconds, self._retry_seconds = batch_size, batch_seconds, retry_seconds
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._inflight: list[Row] = []
        self._engine: Engine | None = None
        self._ids: store.JobIds = {}
        self._down_since: float | None = None
        self._next_retry = 0.0
        self._orphans_left = True
        self._closed = False
        # Set once the writer's first connection ended (the database open with its schema, or an outage noted).
        self.connection_tried = threading.Event()
        port = current.metrics_port if metrics_port is None else metrics_port
        if port:
            self.metrics_port = self.metrics.serve(port, metrics_addr)
        self._thread = threading.Thread(target=self._run, name="stitchfleet-recorder", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # --- caller side: never blocks on I/O, never raises -------------------------------------

    def record(self, row: Row) -> None:
        """Queues `row` for writing and updates the live metrics; returns at once."""
        try:
            if not isinstance(row, ROW_CLASSES):
                # Refused here: a foreign object in a batch would poison the whole batch.
                raise TypeError(f"not a telemetry row: {row!r}")
            self.stats.recorded += 1
            self.metrics.observe(row)
            if self._closed:
                self._spool_late([row])
            else:
                self._queue.put(row)
        except Exception:
            log.exception("telemetry: could not record %s (training continues)", type(row).__name__)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything recorded so far is in the database or the spool; False on timeout."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(self.flush_seconds if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flushes within `timeout` (default flush_seconds) and stops; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._queue.put(_STOP)
        self._thread.join(self.flush_seconds if timeout is None else timeout)
        if self._thread.is_alive():
            # The writer is stuck on the database: keep its rows safe in a fresh spool file.
            self._spool_late([*self._inflight, *self._drain()])
        else:
            self.spool.close()
        self.metrics.stop()
        if self._engine is not None and not self._thread.is_alive():
            self._engine.dispose()

    def _drain(self) -> list[Row]:
        rows: list[Row] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return rows
            if isinstance(item, threading.Event):
                item.set()
            elif not isinstance(item, _Stop):
                rows.append(item)

    def _spool_late(self, rows: Sequence[Row]) -> None:
        late = spool.Spool(self.spool.directory)
        late.append(rows)
        late.close()
        self.stats.spooled += len(rows)

    # --- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        if self._open_database():
            self._replay(force=True)
        stop = False
        while not stop:
            batch, markers, stop = self._take_batch()
            self._inflight = batch
            try:
                self._deliver(batch)
            except Exception:
                # Last resort: even the spool failed (disk full?). Say so; never kill the thread.
                log.exception("telemetry: lost a batch of %d rows", len(batch))
            self._inflight = []
            for marker in markers:
                marker.set()

    def _open_database(self) -> bool:
        """Connects before any row waits: the dialect's imports and a fresh database's schema (~0.1-0.3 s of Python)
        run now, where the job's setup waits for them and books them (`Ledger._open`), not beside the job's steps
        when the first batch is due. Measured (session 49, the MLP's 1.2 ms steps, batches every 2 s): connected at
        the first write, the writer held the GIL against ~100 steps after stitching went off, 3-7 ms each."""
        try:
            self._connect()
        except Exception as err:
            self._note_outage(err)  # the rows spool; the next try waits for retry_seconds, as after any failure
            return False
        finally:
            self.connection_tried.set()
        return True

    def _take_batch(self) -> tuple[list[Row], list[threading.Event], bool]:
        batch: list[Row] = []
        markers: list[threading.Event] = []
        deadline = time.monotonic() + self._batch_seconds
        while len(batch) < self._batch_size:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if isinstance(item, _Stop):
                return batch, markers, True
            if isinstance(item, threading.Event):
                markers.append(item)
                break
            batch.append(item)
        return batch, markers, False

    def _deliver(self, batch: list[Row]) -> None:
        if self.spool.pending or self._orphans_left:
            # Rows queued behind spooled ones go to the spool too: the replay keeps their order.
            self.spool.append(batch)
            self.stats.spooled += len(batch)
            self._replay(force=False)
            return
        if batch and not self._write(batch):
            self.spool.append(batch)
            self.stats.spooled += len(batch)

    def _connect(self) -> Engine:
        if self._engine is None:
            engine = database.connect(self.url)
            if not database.is_current(engine):
                self._create_schema(engine)
            self._engine = engine
        return self._engine

    def _create_schema(self, engine: Engine) -> None:
        # Ranks of one job sharing a fresh database race to create the schema. `upgrade` waits for the
        # migration lock, so a rank that lost the race finds the head revision and does nothing; a
        # rank that read a revision short of the head (another process half-way through) waits too.
        # Writing before the head is reached is what lost rows to "no such table" (test_schema_race).
        try:
            database.upgrade(self.url)
        except Exception:
            if not database.is_current(engine):
                engine.dispose()
                raise

    def _write(self, rows: Sequence[Row]) -> bool:
        if not rows:
            return True
        try:
            # Lock contention is not an outage: the ranks of a job share one SQLite file (retry_locked).
            ids = database.retry_locked(lambda: self._transaction(rows))
        except Exception as err:
            self._note_outage(err)
            return False
        self._ids = ids
        self.stats.written += len(rows)
        self._note_recovery()
        return True

    def _transaction(self, rows: Sequence[Row]) -> store.JobIds:
        """Writes `rows` in one transaction; the job ids known after it (a failed one adds none)."""
        engine = self._connect()
        ids = dict(self._ids)
        with engine.begin() as connection:
            for start in range(0, len(rows), self._batch_size):
                store.write_rows(connection, rows[start : start + self._batch_size], ids)
        return ids

    def _note_outage(self, err: Exception) -> None:
        self.stats.failures += 1
        self._next_retry = time.monotonic() + self._retry_seconds
        if self._engine is not None:
            self._engine.dispose()
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("telemetry: %s; spooling to %s", database.describe_failure(self.url, err), self.spool.path)

    def _note_recovery(self) -> None:
        if self._down_since is not None:
            log.warning("telemetry: database back after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None

    def _replay(self, *, force: bool) -> None:
        """Orphaned files first (older rows), then this process's own spool; stops at a failure."""
        if not force and time.monotonic() < self._next_retry:
            return
        try:
            for path in self.spool.orphans():
                with spool.claimed(path) as content:
                    self._replay_content(content)
            self._orphans_left = False
            with self.spool.own_rows() as content:
                self._replay_content(content)
        except _ReplayFailedError:
            return

    def _replay_content(self, content: spool.SpoolRead | None) -> None:
        if content is None:
            return
        if not self._write(content.rows):
            raise _ReplayFailedError
        self.stats.corrupt_lines += len(content.problems)
        self.stats.replayed += len(content.rows)


class _ReplayFailedError(Exception):
    """Raised inside a spool context to leave the file untouched (the database failed)."""
