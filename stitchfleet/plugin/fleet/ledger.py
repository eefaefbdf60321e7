"""The plugin's view of telemetry: one job rank's rows, recorded without ever failing the job.

Input: the settings (job identity, ingestion endpoint or database URL, metrics port), the rank and world size,
and what the hook reports (compile results, windows, reverts, the end). The rules in full:
docs/plugin/fleet.md.
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from stitchfleet import settings as settings_module
from stitchfleet.plugin.fleet import rank_devices
from stitchfleet.plugin.fleet.fleet_memory import FleetMemory, Recollection
from stitchfleet.plugin.fleet.ingest_client import Endpoint, IngestClient
from stitchfleet.plugin.fleet.local_memory import local_memory
from stitchfleet.plugin.fleet.rank_record import RankRecord
from stitchfleet.plugin.fleet.shipper import Shipper
from stitchfleet.telemetry.kinds import EventKind, ProbeOutcome
from stitchfleet.telemetry.rows import (
    ClusterVerdict,
    Event,
    JobCompiled,
    JobFinished,
    JobKey,
    JobOverhead,
    JobStarted,
    ProbeVerdict,
    Row,
    StepWindow,
    new_job_uid,
)
from stitchfleet.telemetry.spool import Spool

log = logging.getLogger("stitchfleet.plugin")
# The job's Recorder writes its rows every BATCH_SECONDS: a write (its rows' upserts and the weekly aggregates they
# move) holds the GIL for 4-6 ms of Python whatever its few rows, and a training step whose TF run ends meanwhile waits
# for it. At the Recorder's 0.2 s, one step in ~130 of the MLP's 1.2 ms steps did, 0.03 ms a step on average once
# stitching was off (session 48). Rows wait in memory the longer; `close` (the hook's end) still writes them all.
BATCH_SECONDS = 2.0
# The longest `_open` waits for the Recorder's first connection: a server's connect timeout is 5 s, a fresh database's
# migration may wait for another rank's; an SQLite file's schema takes ~0.3 s. Past it the connection goes on beside
# the job, its rows waiting in the Recorder's queue or spool.
CONNECT_WAIT = 15.0


if TYPE_CHECKING:
    import tensorflow as tf


class Sink(Protocol):
    """Where rows go: the Shipper (in Kubernetes), the Recorder (a database) or the spool."""

    def record(self, row: Row) -> None: ...

    def close(self) -> None: ...


class WindowFields(TypedDict):
    """A closed window's figures (`telemetry.rows.StepWindow` less its job and rank), the session's index."""

    window_index: int
    first_step: int
    last_step: int
    iterations: int
    mode: str
    step_seconds_sum: float
    baseline_step_seconds: float | None
    saved_seconds: float


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
        # Several sessions of one job's rank (tf.estimator's train and evaluate, a restarted container) share
        # window numbers and add up their setup seconds through the rank's record in the state directory.
        self.rank_record = RankRecord(current.state_dir, self.key.job_uid, rank)
        self._sink: Sink | None = None
        self.memory: FleetMemory | None = None
        self.recollection: Recollection | None = None  # what `recall` last found (kernels bound later read it)
        self._pending: list[Row] | None = None  # rows recorded before the database client is open
        self._opening: threading.Thread | None = None
        self._spooling: SpoolSink | None = None  # rows go to the spool until the client opens (`spool_meanwhile`)
        self._lock = threading.Lock()
        if current.ingest_url and url is None:
            # In a cluster the pod never writes the database: the operator does, for it.
            self._ship_or_spool(current)
        else:
            self._pending = []
            atexit.register(self._at_exit)

    def _ship_or_spool(self, current: settings_module.Settings) -> None:
        try:
            self._sink, self.memory = make_shipper(current)
        except (ValueError, OSError, ssl.SSLError) as err:  # a bad URL or CA: keep the rows on disk
            log.warning("stitchfleet: cannot ship telemetry (%s); rows go to the spool", err)
            self._sink = SpoolSink(current.spool_dir)
        except Exception as err:
            log.warning("stitchfleet: telemetry is off for this job: %s", err)

    def _open(self) -> None:
        """The local sink (the Recorder, or the spool without SQLAlchemy), then the rows that waited for it."""
        sink: Sink | None = None
        tried: threading.Event | None = None
        try:
            from stitchfleet.telemetry.recorder import Recorder

            recorder = Recorder(self.url, settings=self.settings, batch_seconds=BATCH_SECONDS)
            sink, tried = recorder, recorder.connection_tried
        except ImportError as err:
            # Local mode in an image without SQLAlchemy: the rows still go to the durable spool,
            # which `stitchfleet telemetry ingest` (or a later Recorder's orphan replay) loads.
            log.warning("stitchfleet: no database client (%s); telemetry rows go to the spool", err)
            sink = SpoolSink(self.settings.spool_dir)
        except Exception as err:
            log.warning("stitchfleet: telemetry is off for this job: %s", err)
        with self._lock:
            pending, self._pending, self._sink = self._pending or [], None, sink
            for row in pending:
                if sink is not None:
                    sink.record(row)
        if tried is not None:
            # The rows flow already (a Recorder spools what it cannot write); this thread, which `opened` waits
            # for, ends once the writer tried to connect: its seconds are the setup's (Recorder._open_database).
            tried.wait(CONNECT_WAIT)

    def _at_exit(self) -> None:
        """A process that ends before the client opened (setup failed, no session end) still records its rows."""
        if self._pending:
            self.close()

    def spool_meanwhile(self) -> None:
        """Rows go to this process's spool file (fsync'ed, no database client) until `open_later` opens the client,
        or for good when nothing does. Why: a job that runs as written without setting up (too short, known to lose,
        waiting for its setup) would pay for the client's imports (SQLAlchemy and our models: 0.3-0.4 s of CPU
        beside its steps) to write two rows. The file waits for the next Recorder on this state directory, which
        replays it first, or for `stitchfleet report`, which loads it before it reads. Only for a local SQLite
        database: a server's database is written by whoever else may never run on this machine."""
        with self._lock:
            if self._pending is None or self._opening is not None or not _local(self.url):
                return
            try:
                sink = SpoolSink(self.settings.spool_dir)
                for row in self._pending:
                    sink.record(row)
            except OSError as err:  # rows keep waiting for the client: `open_later` still writes them
                log.warning("stitchfleet: cannot spool telemetry (%s); it waits for the database client", err)
                return
            self._pending, self._sink, self._spooling = None, sink, sink

    def open_later(self) -> None:
        """Starts opening the local database client in the background (once); rows wait for it meanwhile. A spool
        kept so far (`spool_meanwhile`) is closed: the client replays its file before the rows that wait."""
        with self._lock:
            if self._spooling is not None:
                self._spooling.close()  # releases the file's lock: an orphan for the Recorder to replay first
                self._spooling, self._sink, self._pending = None, None, []
            if self._pending is None or self._opening is not None:
                return
            self._opening = threading.Thread(target=self._open, name="stitchfleet-telemetry-open", daemon=True)
        self._opening.start()

    def opened(self, timeout: float) -> bool:
        """Waits at most `timeout` seconds for the local database client `open_later` started (its imports, a fresh
        database's schema, the rows that waited); True once it is open, or when none is opening."""
        thread = self._opening
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def recorder(self) -> Sink | None:
        """The sink rows go to (Shipper, Recorder or SpoolSink; None when telemetry is off), once open; while the
        rows are spooled (`spool_meanwhile`), the spool's."""
        if self._spooling is not None:
            return self._spooling
        self.open_later()
        if self._opening is not None:
            self._opening.join()
        return self._sink

    def record(self, row: Row) -> None:
        with self._lock:
            if self._pending is not None:
                self._pending.append(row)
                return
            sink = self._sink
        if sink is not None:
            sink.record(row)

    def safely(self, make: Callable[..., Row], *args: object, **kwargs: object) -> None:
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
        """This session's setup seconds so far; the row holds the rank's total over its sessions."""
        try:
            seconds = self.rank_record.setup_total(seconds)
        except Exception as err:  # the record is bookkeeping: the session's own figure still goes out
            log.warning("stitchfleet: rank record failed (%s); recording this session's setup alone", err)
        self.safely(JobCompiled, self.key, self.rank, seconds)
        self.open_later()  # the hook opened it at its setup's start (`opened`); this one covers any other caller

    def overhead(self, seconds: float) -> None:
        """This rank's plugin cost beyond the user's graph, measured so far (`plugin_cost.PluginCost.overhead`)."""
        self.safely(JobOverhead, self.key, self.rank, seconds)

    def event(
        self, kind: str, step: int | None, fingerprint: str | None, reason: str, **figures: float | str | None
    ) -> None:
        short = reason if len(reason) <= Event.MAX_REASON else reason[: Event.MAX_REASON - 3] + "..."
        detail = figures.pop("detail", reason)
        self.safely(Event, self.key, kind, self.rank, step, fingerprint, short, detail, **figures)

    def measure_devices(self, session: tf.compat.v1.Session, local_ranks: int = 1) -> None:
        """Records what this rank really uses (its GPUs or its share of the CPU cores, `local_ranks` ranks on
        this host), which only a created session knows; a failure is logged and the job runs on."""
        try:
            found = rank_devices.measure(session, local_ranks)
            self.measured(found.kind, found.count)
        except Exception as err:
            log.warning("stitchfleet: could not measure this rank's devices: %s", err)

    def rebuilt(self, left: dict[int, str]) -> None:
        """Clusters that kept the kernels `begin` built when the job's fed shapes showed (`rebinding`)."""
        for index, reason in left.items():
            self.event(
                EventKind.COMPILE_FAILURE.value,
                None,
                None,
                "not rebuilt for the fed shapes",
                detail=f"cluster {index}: {reason}",
            )

    def verdict(self, fingerprint: str, verdict: str, reason: str = "", op_count: int | None = None) -> None:
        self.safely(ClusterVerdict, fingerprint, verdict, reason[:200], op_count)

    def probed(self, fingerprint: str, profile: str, shapes: str, outcome: str, detail: str = "") -> None:
        """This job's probe finding for the fleet's slower verdicts (kinds.ProbeOutcome)."""
        self.safely(ProbeVerdict, self.key, fingerprint, profile, shapes, outcome, detail[:200])

    def window(self, **fields: Unpack[WindowFields]) -> None:
        """A closed window; its index (the session's own) becomes the rank's, unique across its sessions. Numbered
        and recorded on the rank record's writer thread: no file I/O on the step's thread (`rank_record`)."""

        def numbered(number: int) -> None:
            self.safely(StepWindow, self.key, self.rank, **{**fields, "window_index": number})

        try:
            self.rank_record.window_then(int(fields["window_index"]), numbered)
        except Exception as err:
            log.warning("stitchfleet: rank record failed (%s); the window keeps its session index", err)
            self.safely(StepWindow, self.key, self.rank, **fields)

    def setup_skipped(self, label: str, why: str) -> None:
        """A job that runs as written without setting up (too short, known to lose, ended while it waited): a
        `setup` event with the figures, and the job finished under `label`."""
        self.event(EventKind.SETUP.value, None, None, label, detail=why)
        self.finished("finished", label)

    def finished(self, status: str, reason: str = "") -> None:
        self.rank_record.drain()  # the job's last windows are recorded before its end
        self.safely(JobFinished, self.key, status, reason[:200], self.rank)

    def close(self) -> None:
        try:
            self.rank_record.close()
        except Exception as err:
            log.warning("stitchfleet: rank record failed at close: %s", err)
        recorder = self.recorder
        if recorder is not None:
            try:
                recorder.close()
            except Exception as err:
                log.warning("stitchfleet: telemetry close failed: %s", err)

    def reverted(self, timeout: float = 5.0) -> set[str]:
        """Fingerprints the fleet has reverted; empty when neither operator nor database answers in time."""
        return set(self.recall(timeout).reverted)

    def recall(self, timeout: float = 5.0) -> Recollection:
        """The fleet's memory; empty (source "none") when neither operator nor database answers in time."""
        self.recollection = self._recalled() if self.memory is not None else self._read(timeout)
        return self.recollection

    def _read(self, timeout: float) -> Recollection:
        """The fleet's memory from the database, when there is no operator."""
        found: list[Recollection] = []
        current = self.settings

        def read() -> None:
            try:
                now, ttl = dt.datetime.now(dt.UTC), current.slower_ttl
                if _local(self.url):
                    found.append(local_memory(self.url, now=now, min_jobs=current.slower_jobs, ttl=ttl))
                    return
                from stitchfleet.telemetry.queries import reverted_fingerprints, slower_verdicts

                slower = slower_verdicts(self.url, now=now, min_jobs=current.slower_jobs, ttl=ttl)
                faster = slower_verdicts(
                    self.url, now=now, min_jobs=current.slower_jobs, ttl=ttl, outcome=ProbeOutcome.FASTER
                )
                reverted = frozenset(reverted_fingerprints(self.url))
                found.append(Recollection(reverted, "database", slower=tuple(slower), faster=tuple(faster)))
            except Exception as err:
                log.info("stitchfleet: no fleet memory known (%s)", type(err).__name__)

        reader = threading.Thread(target=read, name="stitchfleet-verdicts", daemon=True)
        reader.start()
        reader.join(timeout)
        return found[0] if found else Recollection(frozenset(), "none", "the database did not answer")

    def _recalled(self) -> Recollection:
        """The operator's quarantine; when it did not answer, an event says what the job began with."""
        assert self.memory is not None
        memory = self.memory.read()
        if memory.source != "operator":
            reason = "fleet memory from cache" if memory.source == "cache" else "fleet memory unavailable"
            known = f"{len(memory.reverted)} reverted cluster(s), {len(memory.slower)} slower verdict(s) known"
            self.event(EventKind.FLEET_MEMORY.value, None, None, reason, detail=f"{reason} ({known}): {memory.problem}")
        return memory


def _local(url: str) -> bool:
    """Whether `url` is a SQLite file: the database of this machine's state directory, the spool's neighbour."""
    return url.split(":", 1)[0].split("+", maxsplit=1)[0] == "sqlite"


def opened(current: settings_module.Settings, rank: int, world_size: int, url: str | None = None) -> Ledger | None:
    """A started ledger for records the hook makes outside a job it runs (a session it cannot join, a setup that
    failed before its own ledger was opened), or None, logged, when even that fails: the job runs on."""
    try:
        ledger = Ledger(current, rank, world_size, url)
        ledger.started()
        return ledger
    except Exception as err:
        log.warning("stitchfleet: telemetry cannot be recorded for this job: %s", err)
        return None
