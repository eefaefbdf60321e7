"""Rollup.run_once measures what it cost: CPU seconds of its thread (and wall seconds), as gauges."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from stitchfleet.operator.rollup import Rollup
from stitchfleet.operator.savings import FleetSummary
from stitchfleet.telemetry.fleet_metrics import FleetMetrics

BURN_SECONDS = 0.05


def _busy_summary(week: str) -> FleetSummary:
    start = time.thread_time()
    while time.thread_time() - start < BURN_SECONDS:  # CPU work, as a summary that reads a database does
        pass
    return FleetSummary(tasks=3)


def test_a_run_reports_its_cpu_seconds() -> None:
    published: list[tuple[str, Any]] = []
    metrics = FleetMetrics()
    rollup = Rollup(
        summarize=_busy_summary,
        publish=lambda week, status: published.append((week, status)),
        metrics=metrics,
        clock=lambda: dt.datetime(2026, 11, 18, tzinfo=dt.UTC),
    )
    rollup.run_once()
    assert [week for week, _ in published] == ["2026-W47", "2026-W46"]
    # Two weeks summarized, each burning BURN_SECONDS of this thread's CPU.
    assert rollup.last_cpu_seconds >= 2 * BURN_SECONDS
    assert rollup.last_wall_seconds >= rollup.last_cpu_seconds * 0.9
    exposed = metrics.registry.get_sample_value("stitchfleet_fleet_last_rollup_cpu_seconds")
    assert exposed == rollup.last_cpu_seconds
