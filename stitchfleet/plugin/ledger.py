"""The plugin's view of telemetry: one job rank's rows, recorded without ever failing the job.

Input: the settings (job identity, ingestion endpoint or database URL, metrics port), the rank
and world size, and what the hook reports (compile results, windows, reverts, the end). Output:
rows for one of three sinks, chosen once:
- in Kubernetes (STITCHFLEET_INGEST_URL, injected by the webhook): the spool, shipped to the
  operator's ingestion endpoint (`Shipper`); the operator is the only writer to the database;
- outside Kubernetes with SQLAlchemy: the `Recorder` (database or spool, Prometheus metrics);
- outside Kubernetes without SQLAlchemy: the spool alone (`stitchfleet telemetry ingest` loads it).
Every method swallows and logs its own errors: telemetry must never stop training. `reverted()`
reads the fleet's reverted cluster fingerprints with a bounded wait: from the operator (or the
pod's cached copy, saying so in an event) in Kubernetes, else from the database ("none known"
after `timeout` seconds when it is down).
"""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path
from typing import Any

from stitchfleet import settings as settings_module
from stitchfleet.plugin.fleet_memory import FleetMemory
from stitchfleet.plugin.ingest_client import Endpoint, IngestClient
from stitchfleet.plugin.shipper import Shipper
from stitchfleet.telemetry.kinds import EventKind
from stitchfleet.telemetry.rows import (
    ClusterVerdict,
    Event,
    JobCompiled,
    JobFinished,
    JobKey,
    JobStarted,
    Row,
    StepWindow,
    new_job_uid,
)
from stitchfleet.telemetry.spool import Spool

log = logging.getLogger("stitchfleet.plugin")


class SpoolSink:
    """The Recorder's place in a pod without SQLAlchemy: every row fsync'ed into this process's spool."""

    def __init__(self, directory: Path) -> None:
        self.spool = Spool(directory)

    def record(self, row: Row) -> None:
        self.spool.append([row])

    def close(self) -> None:
        self.spool.close()  # keeps the file: its rows wait for an ingest


def make_shipper(current: settings_module.Settings) -> tuple[Shipper, FleetMemory]:
    """The pod's sink and fleet memory, both talking to the operator's ingestion endpoint."""
    client = IngestClient(Endpoint.from_settings(current))
    shipper = Shipper(
        current.spool_dir,
        client,
        batch_rows=current.ingest_batch_rows,
        max_backoff=current.ingest_max_backoff_seconds,
        flush_seconds=current.flush_seconds,
    )
    return shipper, FleetMemory(client, current.state_dir, timeout=current.fleet_memory_timeout_seconds)


class Ledger:
    def __init__(self, current: settings_module.Settings, rank: int, world_size: int, url: str | None = None) -> None:
        self.settings, self.rank, self.world_size = current, rank, world_size
        self.url = url or current.database_url
        self.key = JobKey.from_settings(current, new_job_uid())
        self.recorder: Any = None
        self.memory: FleetMemory | None = None
        try:
            if current.ingest_url and url is None:
                # In a cluster the pod never writes the database: the operator does, for it.
                self._ship_or_spool(current)
                return
            from stitchfleet.telemetry.recorder import Recorder

            self.recorder = Recorder(self.url, settings=current)
        except ImportError as err:
            # Local mode in an image without SQLAlchemy: the rows still go to the durable spool,
            # which `stitchfleet telemetry ingest` (or a later Recorder's orphan replay) loads.
            log.warning("stitchfleet: no database client (%s); telemetry rows go to the spool", err)
            self.recorder = SpoolSink(current.spool_dir)
        except Exception as err:
            log.warning("stitchfleet: telemetry is off for this job: %s", err)

    def _ship_or_spool(self, current: settings_module.Settings) -> None:
        try:
            self.recorder, self.memory = make_shipper(current)
        except (ValueError, OSError, ssl.SSLError) as err:  # a bad URL or CA: keep the rows on disk
            log.warning("stitchfleet: cannot ship telemetry (%s); rows go to the spool", err)
            self.recorder = SpoolSink(current.spool_dir)

    def record(self, row: Row) -> None:
        if self.recorder is not None:
            self.recorder.record(row)

    def safely(self, make: Any, *args: Any, **kwargs: Any) -> None:
        """Builds a row and records it; a bad figure is logged, never raised."""
        try:
            self.record(make(*args, **kwargs))
        except Exception as err:
            log.warning("stitchfleet: telemetry row %s dropped: %s", getattr(make, "__name__", make), err)

    def started(self) -> None:
        s = self.settings
        self.safely(
            JobStarted, self.key, self.rank, s.team, s.model, s.pod_name, self.world_size, s.gpus_per_rank, s.gpu_type
        )

    def measured(self, device_kind: str, devices_per_rank: int) -> None:
        """The devices this rank computes on, measured once its session exists (for accounting)."""
        s = self.settings
        self.safely(
            JobStarted,
            self.key,
            self.rank,
            s.team,
            s.model,
            s.pod_name,
            self.world_size,
            s.gpus_per_rank,
            s.gpu_type,
            device_kind=device_kind,
            devices_per_rank=devices_per_rank,
        )

    def compiled(self, seconds: float) -> None:
        self.safely(JobCompiled, self.key, self.rank, seconds)

    def event(self, kind: str, step: int | None, fingerprint: str | None, reason: str, **figures: Any) -> None:
        short = reason if len(reason) <= Event.MAX_REASON else reason[: Event.MAX_REASON - 3] + "..."
        detail = figures.pop("detail", reason)
        self.safely(Event, self.key, kind, self.rank, step, fingerprint, short, detail, **figures)

    def verdict(self, fingerprint: str, verdict: str, reason: str = "", op_count: int | None = None) -> None:
        self.safely(ClusterVerdict, fingerprint, verdict, reason[:200], op_count)

    def window(self, **fields: Any) -> None:
        self.safely(StepWindow, self.key, self.rank, **fields)

    def finished(self, status: str, reason: str = "") -> None:
        self.safely(JobFinished, self.key, status, reason[:200], self.rank)

    def close(self) -> None:
        if self.recorder is not None:
            try:
                self.recorder.close()
            except Exception as err:
                log.warning("stitchfleet: telemetry close failed: %s", err)

    def reverted(self, timeout: float = 5.0) -> set[str]:
        """Fingerprints the fleet has reverted; empty when neither operator nor database answers in time."""
        if self.memory is not None:
            return self._recalled()
        found: list[set[str]] = []

        def read() -> None:
            try:
                from stitchfleet.telemetry.queries import reverted_fingerprints

                found.append(reverted_fingerprints(self.url))
            except Exception as err:
                log.info("stitchfleet: no reverted clusters known (%s)", type(err).__name__)

        reader = threading.Thread(target=read, name="stitchfleet-verdicts", daemon=True)
        reader.start()
        reader.join(timeout)
        return found[0] if found else set()

    def _recalled(self) -> set[str]:
        """The operator's quarantine; when it did not answer, an event says what the job began with."""
        assert self.memory is not None
        memory = self.memory.read()
        if memory.source != "operator":
            reason = "fleet memory from cache" if memory.source == "cache" else "fleet memory unavailable"
            detail = f"{reason} ({len(memory.reverted)} reverted cluster(s) known): {memory.problem}"
            self.event(EventKind.FLEET_MEMORY.value, None, None, reason, detail=detail)
        return set(memory.reverted)
