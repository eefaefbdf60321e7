"""The SQL behind the weekly report: reads of the incremental aggregates, never of the step windows.

Input: a Connection and a `Week`. Output: the week's `week_rollups` groups (fleet, namespace,
team, model, revert reason, day; a few hundred rows whatever the fleet size), its number of
distinct jobs, the top or bottom tasks of one device kind by net device-seconds (off the index
`ix_task_weeks_week_kind_net`), and every task-week streamed in report order in constant memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Table, case, func, select
from sqlalchemy.engine import Row

from stitchfleet.telemetry import models
from stitchfleet.telemetry.weeks import Week

TASK_WEEKS: Table = models.TaskWeek.__table__  # type: ignore[assignment]
ROLLUPS: Table = models.WeekRollup.__table__  # type: ignore[assignment]
REPORTED_DIMENSIONS = ("fleet", "namespace", "team", "model", "reason", "day")
# Tasks per batch of a stream: fetched together, their medians read together.
STREAM_BATCH = 2000


def week_groups(connection: Connection, week: Week) -> list[Row[Any]]:
    """The week's rollup groups other than `job`: dimension, key, device_kind and the sums."""
    query = select(ROLLUPS).where(
        ROLLUPS.c.week_start == week.start.date(), ROLLUPS.c.dimension.in_(REPORTED_DIMENSIONS)
    )
    return list(connection.execute(query))


def distinct_jobs(connection: Connection, week: Week) -> int:
    """Distinct (cluster, namespace, job name) with a task in the week."""
    query = select(func.count()).where(ROLLUPS.c.week_start == week.start.date(), ROLLUPS.c.dimension == "job")
    return int(connection.execute(query).scalar_one())


def ranked_tasks(connection: Connection, week: Week, device_kind: str, limit: int, *, top: bool) -> list[Row[Any]]:
    """The `limit` task-weeks of one device kind saving most (`top`) or least, in that order."""
    net = TASK_WEEKS.c.net_device_seconds
    names = (TASK_WEEKS.c.namespace, TASK_WEEKS.c.job_name, TASK_WEEKS.c.job_uid)
    query = (
        select(TASK_WEEKS)
        .where(TASK_WEEKS.c.week_start == week.start.date(), TASK_WEEKS.c.device_kind == device_kind)
        .order_by(net.desc() if top else net.asc(), *names)
        .limit(limit)
    )
    return list(connection.execute(query))


def streamed_tasks(connection: Connection, week: Week) -> Iterator[Row[Any]]:
    """Every task-week of `week`, GPU first, by net device-seconds, largest first; fetched in batches."""
    gpu_first = case((TASK_WEEKS.c.device_kind == models.DeviceKind.GPU.value, 0), else_=1)
    query = (
        select(TASK_WEEKS)
        .where(TASK_WEEKS.c.week_start == week.start.date())
        .order_by(
            gpu_first,
            TASK_WEEKS.c.net_device_seconds.desc(),
            TASK_WEEKS.c.namespace,
            TASK_WEEKS.c.job_name,
            TASK_WEEKS.c.job_uid,
        )
    )
    # yield_per: a server-side cursor on PostgreSQL, fetchmany batches on SQLite.
    yield from connection.execution_options(yield_per=STREAM_BATCH).execute(query)
