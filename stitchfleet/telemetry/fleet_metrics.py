"""Fleet-wide Prometheus gauges, served by the operator process.

Input: the number of jobs the operator tracks, the current week's fleet figures (plain
numbers, as the weekly summary computes them), and what the last rollup cost. Output: `stitchfleet_fleet_*` gauges in a
dedicated CollectorRegistry, served over HTTP by `serve(port)`. Gauges, not counters: every
rollup recomputes the figures from the database, so a restarted operator shows the same values.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Gauge

from stitchfleet.telemetry.exposition import Exposition


class FleetMetrics(Exposition):
    """The operator's gauges; setting them is cheap and never touches the network."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs_tracked = self._gauge("jobs_tracked", "Opted-in jobs whose pods the operator currently watches.")
        self.week_jobs = self._gauge("week_jobs", "Jobs that ran with stitchfleet this ISO week.")
        self.week_tasks = self._gauge("week_tasks", "Training tasks (ranks) that ran with stitchfleet this ISO week.")
        self.saved = self._gauge(
            "week_gpu_hours_saved", "Net GPU-hours saved this ISO week (less compile and measured plugin overhead)."
        )
        self.gross = self._gauge("week_gross_gpu_hours_saved", "GPU-hours saved this ISO week before overheads.")
        self.cpu_saved = self._gauge(
            "week_cpu_core_hours_saved",
            "Net CPU core-hours saved this ISO week by CPU jobs, less compile and measured plugin overhead (never in "
            "GPU-hours).",
        )
        self.reverted = self._gauge("week_reverted_jobs", "Jobs with a reverted stitch cluster this ISO week.")
        self.reverts = Gauge(
            "stitchfleet_fleet_week_reverts",
            "Reverts this ISO week, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.rollup_time = self._gauge("last_rollup_timestamp_seconds", "Unix time of the last successful rollup.")
        self.rollup_cpu = self._gauge("last_rollup_cpu_seconds", "CPU seconds the operator spent on the last rollup.")
        self.rollup_wall = self._gauge("last_rollup_duration_seconds", "Wall seconds the last rollup took.")

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(f"stitchfleet_fleet_{name}", doc, registry=self.registry)

    def set_week(
        self,
        *,
        jobs: int,
        tasks: int,
        gpu_hours_saved: float,
        gross_gpu_hours_saved: float,
        cpu_core_hours_saved: float = 0.0,
        reverted_jobs: int,
        revert_reasons: Mapping[str, int],
        at: float,
    ) -> None:
        """Publishes one rollup of the current week; reasons absent now are dropped."""
        self.week_jobs.set(jobs)
        self.week_tasks.set(tasks)
        self.saved.set(gpu_hours_saved)
        self.gross.set(gross_gpu_hours_saved)
        self.cpu_saved.set(cpu_core_hours_saved)
        self.reverted.set(reverted_jobs)
        self.reverts.clear()
        for reason, count in revert_reasons.items():
            self.reverts.labels(reason=reason or "unspecified").set(count)
        self.rollup_time.set(at)

    def set_rollup_cost(self, *, cpu_seconds: float, wall_seconds: float) -> None:
        """Publishes what the last rollup cost: CPU seconds of the operator's thread, and wall seconds."""
        self.rollup_cpu.set(cpu_seconds)
        self.rollup_wall.set(wall_seconds)
