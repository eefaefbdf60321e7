"""Live Prometheus metrics of one process, from the rows it records.

Input: rows (`observe`). Output: counters, gauges and a histogram with the `stitchfleet_` prefix
and seconds as the unit, in a dedicated CollectorRegistry (never the global one, so several
recorders and tests do not collide), served over HTTP by `serve(port)`.
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from stitchfleet.telemetry.exposition import Exposition
from stitchfleet.telemetry.models import EventKind, Verdict
from stitchfleet.telemetry.rows import ClusterVerdict, Event, Row, StepWindow

# Step times of training jobs: from a few milliseconds to tens of seconds.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics(Exposition):
    """The metrics of one recorder; `observe` is cheap and never touches the network."""

    def __init__(self) -> None:
        super().__init__()
        self.iterations = Counter(
            "stitchfleet_iterations", "Training iterations recorded, by mode.", ["mode"], registry=self.registry
        )
        self.saved = Counter(
            "stitchfleet_saved_seconds", "Step time saved by stitching against the baseline.", registry=self.registry
        )
        self.step = Histogram(
            "stitchfleet_step_seconds",
            "Mean step time of each recorded window, by mode.",
            ["mode"],
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.enabled = Gauge(
            "stitchfleet_enabled_clusters", "Stitch clusters currently enabled in this process.", registry=self.registry
        )
        self.reverts = Counter(
            "stitchfleet_reverts",
            "Clusters reverted to the original ops, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._enabled: set[str] = set()
        self._lock = threading.Lock()

    def observe(self, row: Row) -> None:
        """Updates the metrics a row concerns."""
        if isinstance(row, StepWindow):
            self.iterations.labels(mode=row.mode).inc(row.iterations)
            self.saved.inc(max(row.saved_seconds, 0.0))
            self.step.labels(mode=row.mode).observe(row.step_seconds_sum / row.iterations)
        elif isinstance(row, Event):
            self._observe_event(row)
        elif isinstance(row, ClusterVerdict):
            self._set_enabled(row.fingerprint, row.verdict == Verdict.ENABLED)

    def _observe_event(self, row: Event) -> None:
        if row.kind == EventKind.REVERT:
            self.reverts.labels(reason=row.reason or "unspecified").inc()
            if row.cluster_fingerprint:
                self._set_enabled(row.cluster_fingerprint, False)
        elif row.kind == EventKind.CLUSTER_ENABLED and row.cluster_fingerprint:
            self._set_enabled(row.cluster_fingerprint, True)

    def _set_enabled(self, fingerprint: str, enabled: bool) -> None:
        with self._lock:
            if enabled:
                self._enabled.add(fingerprint)
            else:
                self._enabled.discard(fingerprint)
            self.enabled.set(len(self._enabled))
