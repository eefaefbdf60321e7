"""Per-job Prometheus figures, exported by the operator from the rows it ingests.

Input: rows the ingestion endpoint stored (`observe`), already attributed to their job. Output:
gauges labelled by namespace and job on a registry the caller owns (the operator's fleet
registry, so one /metrics serves both): iterations and mean step time by window mode, seconds
saved, reverts, time of the last ingest; and counters of ingested and refused batches.

Why the operator and not the pod: training images have no prometheus_client, scraping each pod
needs a port and a PodMonitor per namespace, and the operator already holds the very rows the
reports use. Figures are gauges over the distinct natural keys seen (a window by job, rank and
index; an event by uuid), so a replayed batch changes nothing, as in the database. They cover
what this operator process ingested since it started; the database keeps the totals.
At most `max_jobs` jobs are kept: the least recently updated one's series are removed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from stitchfleet.telemetry.kinds import EventKind
from stitchfleet.telemetry.rows import Event, JobKey, Row, StepWindow

JOB_LABELS = ("namespace", "job")


@dataclass
class _JobFigures:
    """The distinct windows and revert events of one job seen so far, with running sums."""

    windows: dict[tuple[int, int], StepWindow] = field(default_factory=dict)
    reverts: set[str] = field(default_factory=set)
    iterations: dict[str, int] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    saved: float = 0.0

    def add(self, window: StepWindow) -> None:
        """Counts `window`; a window seen before (a replay, a rewrite) replaces its earlier figures."""
        old = self.windows.get((window.rank, window.window_index))
        if old is not None:
            self._count(old, -1)
        self.windows[(window.rank, window.window_index)] = window
        self._count(window, 1)

    def _count(self, window: StepWindow, sign: int) -> None:
        mode = window.mode
        self.iterations[mode] = self.iterations.get(mode, 0) + sign * window.iterations
        self.step_seconds[mode] = self.step_seconds.get(mode, 0.0) + sign * window.step_seconds_sum
        self.saved += sign * window.saved_seconds


class JobMetrics:
    """See the module docstring; `observe` is cheap and never touches the network."""

    def __init__(self, registry: CollectorRegistry, *, max_jobs: int = 1000) -> None:
        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"stitchfleet_job_{name}", doc, [*JOB_LABELS, *extra], registry=registry)

        self.iterations = gauge("iterations", "Training iterations ingested, by window mode.", ("mode",))
        self.step = gauge("step_seconds", "Mean step time over the ingested windows, by mode.", ("mode",))
        self.saved = gauge("saved_seconds", "Step time saved by stitching, summed over ingested windows.")
        self.reverts = gauge("reverts", "Clusters reverted to TF's ops in this job.")
        self.last = gauge("last_ingest_timestamp_seconds", "Unix time the operator last stored rows of this job.")
        self.batches = Counter(
            "stitchfleet_ingest_batches", "Batches stored by the ingestion endpoint.", registry=registry
        )
        self.rows = Counter("stitchfleet_ingest_rows", "Rows stored by the ingestion endpoint.", registry=registry)
        self.refused = Counter(
            "stitchfleet_ingest_refused",
            "Requests the ingestion endpoint refused, by status.",
            ["status"],
            registry=registry,
        )
        self._jobs: OrderedDict[tuple[str, str], _JobFigures] = OrderedDict()
        self._max = max_jobs
        self._lock = threading.Lock()

    def stored(self, rows: list[Row]) -> None:
        """One batch the database committed: counters, then each row's job figures."""
        self.batches.inc()
        self.rows.inc(len(rows))
        with self._lock:
            touched = {self._observe(row) for row in rows}
            for labels in touched - {None}:
                assert labels is not None
                self._export(labels)

    def _observe(self, row: Row) -> tuple[str, str] | None:
        job: JobKey | None = getattr(row, "job", None)
        if job is None:
            return None
        labels = (job.namespace, job.job_name)
        figures = self._jobs.setdefault(labels, _JobFigures())
        self._jobs.move_to_end(labels)
        if isinstance(row, StepWindow):
            figures.add(row)
        elif isinstance(row, Event) and row.kind == EventKind.REVERT:
            figures.reverts.add(row.uuid)
        return labels

    def _export(self, labels: tuple[str, str]) -> None:
        figures = self._jobs[labels]
        for mode, iterations in figures.iterations.items():
            self.iterations.labels(*labels, mode).set(iterations)
            if iterations:
                self.step.labels(*labels, mode).set(figures.step_seconds[mode] / iterations)
        self.saved.labels(*labels).set(figures.saved)
        self.reverts.labels(*labels).set(len(figures.reverts))
        self.last.labels(*labels).set(time.time())
        while len(self._jobs) > self._max:
            self._forget(*self._jobs.popitem(last=False))

    def _forget(self, labels: tuple[str, str], figures: _JobFigures) -> None:
        for mode in figures.iterations:
            for metric in (self.iterations, self.step):
                with contextlib.suppress(KeyError):  # a mode whose windows all moved has no step series
                    metric.remove(*labels, mode)
        for metric in (self.saved, self.reverts, self.last):
            metric.remove(*labels)
