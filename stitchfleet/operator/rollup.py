"""Periodic rollups: the week's fleet figures from the telemetry database, into SavingsReports and gauges.

Input: a summarizer (week label -> `FleetSummary`, computed by telemetry's weekly summary), a
publisher (week, status -> the SavingsReport), the fleet gauges, and a clock. Output: every
`interval` seconds, the reports of the current and the previous ISO week brought up to date
(late telemetry, replayed from a spool, still lands in last week's report) and the gauges set to
the current week's figures. Each week's figures are read from the aggregates the telemetry store
keeps up to date on every write (O(groups) rows, not O(telemetry rows)): a restart loses nothing
and a rollup that fails is simply done again at the next tick. Each run's cost is measured in CPU
seconds of the thread that ran it (this process's side; a PostgreSQL server's work is its own),
logged and exported as a gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stitchfleet.operator.savings import FleetSummary, report_status, week_label
from stitchfleet.telemetry.fleet_metrics import FleetMetrics

log = logging.getLogger("stitchfleet.operator.rollup")

T = TypeVar("T")
Summarizer = Callable[[str], FleetSummary]
Publisher = Callable[[str, Mapping[str, Any]], object]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class Rollup:
    """One rollup step (`run_once`) and its loop (`run_forever`)."""

    summarize: Summarizer
    publish: Publisher
    metrics: FleetMetrics
    clock: Callable[[], dt.datetime] = _utcnow
    # CPU and wall seconds of the last run_once (thread CPU time: what the rollup itself cost here).
    last_cpu_seconds: float = field(default=0.0, init=False)
    last_wall_seconds: float = field(default=0.0, init=False)

    def weeks(self, now: dt.datetime) -> list[str]:
        """The weeks a rollup at `now` refreshes: the current one first, then the previous one."""
        return [week_label(now), week_label(now - dt.timedelta(days=7))]

    def run_once(self) -> dict[str, FleetSummary]:
        """Recomputes and publishes the current and previous weeks; returns their summaries."""
        cpu, wall = time.thread_time(), time.perf_counter()
        done = self._roll()
        self.last_cpu_seconds = time.thread_time() - cpu
        self.last_wall_seconds = time.perf_counter() - wall
        self.metrics.set_rollup_cost(cpu_seconds=self.last_cpu_seconds, wall_seconds=self.last_wall_seconds)
        log.info("fleet rollup: %.3f CPU s, %.3f s wall", self.last_cpu_seconds, self.last_wall_seconds)
        return done

    def _roll(self) -> dict[str, FleetSummary]:
        now = self.clock()
        done: dict[str, FleetSummary] = {}
        for week in self.weeks(now):
            summary = self.summarize(week)
            self.publish(week, report_status(summary, now))
            done[week] = summary
        current = done[week_label(now)]
        self.metrics.set_week(
            jobs=current.jobs,
            tasks=current.tasks,
            gpu_hours_saved=current.gpu_hours_saved,
            gross_gpu_hours_saved=current.gross_gpu_hours_saved,
            cpu_core_hours_saved=current.cpu_core_hours_saved,
            reverted_jobs=current.reverted_jobs,
            revert_reasons=current.revert_reasons,
            at=now.timestamp(),
        )
        return done

    async def run_forever(self, interval: float) -> None:
        """Runs a rollup now and then every `interval` seconds until cancelled; failures are logged."""
        while True:
            try:
                await in_daemon_thread(self.run_once)
            except Exception:  # the database or the API may be away for a while: retry next tick
                log.exception("fleet rollup failed; retrying in %.0f s", interval)
            await asyncio.sleep(interval)


async def in_daemon_thread(work: Callable[[], T]) -> T:
    """`work()` in a daemon thread of its own, awaited; cancelling the await abandons the thread.

    Not `asyncio.to_thread`: the process's exit joins the default executor's threads, so a rollup
    stuck on the database or the API would hold SIGTERM's shutdown until the kubelet kills the
    pod. An abandoned rollup loses nothing: the next one recomputes everything.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():
            outcome()

    def target() -> None:
        try:
            result = work()
        except BaseException as err:  # handed to the awaiting task, which decides
            answer = functools.partial(settle, functools.partial(done.set_exception, err))
        else:
            answer = functools.partial(settle, functools.partial(done.set_result, result))
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody awaits any more
            loop.call_soon_threadsafe(answer)

    threading.Thread(target=target, name="stitchfleet-rollup", daemon=True).start()
    return await done
