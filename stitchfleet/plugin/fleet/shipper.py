"""Rows of a pod in Kubernetes: spooled durably, then shipped to the operator in batches.

Input: rows (`record`, from the training thread) and an `IngestClient`. Output: the rows in the operator's
database. The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.plugin.fleet.dead_letter import DeadLetters, refused_for_good
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, IngestClient
from stitchfleet.telemetry import spool
from stitchfleet.telemetry.rows import Row

log = logging.getLogger("stitchfleet.plugin")
FIRST_BACKOFF = 0.5


@dataclass
class ShipperStats:
    """Counts since start: rows recorded, rows acknowledged by the operator, failed attempts."""

    recorded: int = 0
    shipped: int = 0
    failures: int = 0
    dead_lettered: int = 0
    last_error: str = ""


class _AttemptFailedError(Exception):
    """Raised inside a claimed file's block so the file is kept (its rows were not all stored)."""


class Shipper:
    """See the module docstring; `record` never blocks on the network and never raises."""

    def __init__(
        self,
        directory: Path,
        client: IngestClient,
        *,
        batch_rows: int = 500,
        interval: float = 2.0,
        max_backoff: float = 60.0,
        flush_seconds: float = 5.0,
    ) -> None:
        self.directory = directory
        self.client = client
        self.stats = ShipperStats()
        self._batch_rows, self._interval = batch_rows, interval
        self._max_backoff, self._flush_seconds = max_backoff, flush_seconds
        self._backoff = 0.0
        self._spool = spool.Spool(directory)
        self.dead_letters = DeadLetters(directory)
        self._spool_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="stitchfleet-shipper", daemon=True)
        self._thread.start()

    # --- caller side ---------------------------------------------------------------------

    def record(self, row: Row) -> None:
        """Appends `row` to the spool (fsync'ed); the thread ships it within `interval` seconds."""
        try:
            with self._spool_lock:
                self._spool.append([row])
            self.stats.recorded += 1
        except Exception:
            log.exception("stitchfleet: could not spool %s (training continues)", type(row).__name__)

    def flush(self, timeout: float) -> bool:
        """Ships now; True when every spool file of the directory was delivered within `timeout`.

        False at once when a delivery fails; a file the shipping thread is delivering right now is
        waited for (it is gone when that delivery succeeds, or claimable again when it failed).
        """
        deadline = time.monotonic() + timeout
        while self._attempt(deadline):
            if not self.waiting_files():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return False

    def waiting_files(self) -> list[Path]:
        """Spool files in the directory, this process's current one included while it holds rows."""
        current = [self._spool.path] if self._spool.pending else []
        return current + self._spool.orphans()

    def close(self) -> None:
        """Stops the thread, then one last delivery within flush_seconds; what is left stays spooled."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake.set()
        self._thread.join(self._flush_seconds)
        if not self._thread.is_alive():
            self._attempt(time.monotonic() + self._flush_seconds)
        with self._spool_lock:
            self._spool.close()
        left = self.waiting_files()
        if left:
            log.warning("stitchfleet: %d spool file(s) not delivered yet, kept in %s", len(left), self.directory)

    # --- shipping thread -----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._backoff or self._interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                delivered = self._attempt(time.monotonic() + self.client.endpoint.timeout * 4)
            except Exception:
                log.exception("stitchfleet: shipping failed unexpectedly; rows stay in %s", self.directory)
                delivered = False
            self._next_backoff(delivered)

    def _next_backoff(self, delivered: bool) -> None:
        if delivered:
            self._backoff = 0.0
            return
        grown = max(FIRST_BACKOFF, self._backoff * 2)
        # Jitter spreads the retries of a whole fleet that lost the operator at the same moment.
        self._backoff = min(self._max_backoff, grown) * random.uniform(0.8, 1.0)

    def _rotate(self) -> None:
        """Closes the current spool file when it holds rows: it becomes claimable; appends go on in a new one."""
        with self._spool_lock:
            if self._spool.pending:
                self._spool.close()
                self._spool = spool.Spool(self.directory)

    def _attempt(self, deadline: float) -> bool:
        """Delivers every claimable file, oldest first; False at the first failure (the rest wait)."""
        self._rotate()
        for path in self._spool.orphans():
            if time.monotonic() > deadline:
                return False
            try:
                with spool.claimed(path) as content:
                    if content is not None:
                        self._deliver(content.rows, deadline)
            except _AttemptFailedError:
                return False
        return True

    def _deliver(self, rows: Sequence[Row], deadline: float) -> None:
        for start in range(0, len(rows), self._batch_rows):
            self._send(rows[start : start + self._batch_rows], deadline)
        if self.stats.last_error:
            log.warning("stitchfleet: ingestion endpoint answers again")
            self.stats.last_error = ""

    def _send(self, batch: Sequence[Row], deadline: float) -> None:
        """Delivers `batch`, or the parts of it the operator accepts; _AttemptFailedError to retry later."""
        seconds = max(0.1, min(self.client.endpoint.timeout, deadline - time.monotonic()))
        try:
            self.client.post_rows(batch, timeout=seconds)
        except DeliveryError as err:
            if not refused_for_good(err.status):
                self._note_failure(err)
                raise _AttemptFailedError from None
            if len(batch) > 1:  # which rows? halves until the refused ones stand alone
                half = len(batch) // 2
                self._send(batch[:half], deadline)
                self._send(batch[half:], deadline)
                return
            self._dead_letter(batch[0], err)
            return
        self.stats.shipped += len(batch)

    def _dead_letter(self, row: Row, err: DeliveryError) -> None:
        # The operator records the refusal as an event of the job it knows the pod by (ingest.py):
        # an event written here would carry the refused row's job, and be refused in turn.
        self.dead_letters.add(row, err.status or 0, str(err))
        self.stats.dead_lettered += 1
        log.warning(
            "stitchfleet: the operator refused a %s for good; kept in %s: %s",
            type(row).__name__,
            self.dead_letters.path,
            err,
        )

    def _note_failure(self, err: DeliveryError) -> None:
        self.stats.failures += 1
        if not self.stats.last_error:
            log.warning("stitchfleet: telemetry not delivered (kept in %s, retrying): %s", self.directory, err)
        self.stats.last_error = str(err)
