"""The SQL behind the weekly savings report: per-task aggregates computed by the database.

Input: a Connection and a `Week`. Output: plain rows, one per task (job run), with the week's
summed figures, median step times, first revert reason, and daily sums. Everything that scans
step windows is a GROUP BY (or a window function) in the database, so a week of 70,000 tasks and
hundreds of thousands of windows comes back as 70,000 rows. The same statements run on SQLite
(>= 3.25, for window functions) and PostgreSQL.

Attribution (the contract the report footer states):
- a window belongs to the week when its `recorded_at` (the instant its last step ended) is in
  [Monday 00:00 UTC, next Monday 00:00 UTC);
- a task appears when it has a window in the week or started in it;
- its compile and plugin overhead are charged to the week containing `started_at` (a task whose start was
  never recorded: the week of its first window);
- its device kind and devices per rank are what its ranks measured (`device_kind`,
  `devices_per_rank`); a task no rank measured (written before they did) falls back to what was
  declared: a GPU task with `gpus_per_rank` GPUs when it declared any, else a CPU task on one core.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Float, Select, and_, case, cast, func, literal, or_, select

from stitchfleet.telemetry import models, paired
from stitchfleet.telemetry.weeks import Week

J = models.Job
W = models.StepWindow
E = models.Event
# Ids per IN (...) list: well under the bound-parameter limits of SQLite and PostgreSQL.
ID_CHUNK = 5000
# Tables a weekly report needs: the rows, and the aggregates kept from them (migration 0003).
REPORT_TABLES = ("jobs", "step_windows", "events", "task_weeks", "week_rollups")


@dataclass(frozen=True)
class TaskRow:
    """One task's raw figures for the week, straight from SQL (no rounding, seconds)."""

    job_id: int
    cluster: str
    namespace: str
    job_name: str
    job_uid: str
    team: str
    model: str
    world_size: int
    device_kind: str
    devices_per_rank: int
    status: str
    reason: str
    compile_seconds: float
    compile_charged: bool  # the week holds the task's start: its compile and plugin overhead are charged to it
    windows: int
    iterations: int
    saved_seconds: float
    paired: paired.PairedSums
    overhead_seconds: float = 0.0  # the slowest rank's plugin cost beyond the user's graph (rows.JobOverhead)


# The accounting unit of a task (see the module docstring): measured, else declared.
task_device_kind: ColumnElement[str] = case(
    (J.device_kind != "", J.device_kind),
    (J.gpus_per_rank > 0, literal(models.DeviceKind.GPU.value)),
    else_=literal(models.DeviceKind.CPU.value),
)
task_devices_per_rank = func.coalesce(
    J.devices_per_rank, case((task_device_kind == models.DeviceKind.GPU.value, J.gpus_per_rank), else_=1)
)


def _in_week(column: Any, week: Week) -> Any:
    return and_(column >= week.start, column < week.end)


def _paired_sums() -> list[Any]:
    """The `paired.PairedSums` of a group of windows, in its field order (`paired.contribution`)."""
    on = case((and_(W.mode == models.WindowMode.STITCHED.value, W.baseline_step_seconds.is_not(None)), 1), else_=0)
    baseline = case((W.mode == models.WindowMode.BASELINE.value, 1), else_=0)
    values = (
        on,
        on * W.iterations,
        on * W.step_seconds_sum,
        on * W.saved_seconds * W.saved_seconds,
        on * W.saved_seconds * W.iterations,
        on * cast(W.iterations, Float) * W.iterations,
        baseline,
    )
    return [func.sum(value).label(name) for value, name in zip(values, paired.FIELDS, strict=True)]


def _week_windows(week: Week) -> Any:
    """Per task: windows, the busiest rank's iterations, saved seconds and paired sums over all ranks."""
    per_rank = (
        select(
            W.job_id.label("job_id"),
            func.count().label("windows"),
            func.sum(W.iterations).label("iterations"),
            func.sum(W.saved_seconds).label("saved"),
            *_paired_sums(),
        )
        .where(_in_week(W.recorded_at, week))
        .group_by(W.job_id, W.rank)
        .subquery("per_rank")
    )
    # Ranks step in lockstep: a task's iterations are those of its busiest rank, not their sum.
    return (
        select(
            per_rank.c.job_id,
            func.sum(per_rank.c.windows).label("windows"),
            func.max(per_rank.c.iterations).label("iterations"),
            func.sum(per_rank.c.saved).label("saved"),
            *(func.sum(per_rank.c[name]).label(name) for name in paired.FIELDS),
        )
        .group_by(per_rank.c.job_id)
        .subquery("per_job")
    )


def _unstarted_charged(week: Week) -> Any:
    """Ids of tasks with no recorded start whose first window (ever) is in the week."""
    return (
        select(W.job_id)
        .join(J, J.id == W.job_id)
        .where(J.started_at.is_(None))
        .group_by(W.job_id)
        .having(_in_week(func.min(W.recorded_at), week))
    )


def _task_select(week: Week) -> Select[Any]:
    per_job = _week_windows(week)
    unstarted = _unstarted_charged(week)
    charged = or_(_in_week(J.started_at, week), J.id.in_(unstarted))
    return (
        select(
            J.id,
            J.cluster,
            J.namespace,
            J.job_name,
            J.job_uid,
            J.team,
            J.model,
            J.world_size,
            task_device_kind,
            task_devices_per_rank,
            J.status,
            J.reason,
            J.compile_seconds,
            case((charged, literal(True)), else_=literal(False)).label("charged"),
            func.coalesce(per_job.c.windows, 0),
            func.coalesce(per_job.c.iterations, 0),
            func.coalesce(per_job.c.saved, 0.0),
            *(func.coalesce(per_job.c[name], 0) for name in paired.FIELDS),
            J.overhead_seconds,
        )
        .outerjoin(per_job, per_job.c.job_id == J.id)
        .where(or_(per_job.c.job_id.is_not(None), charged))
    )


def task_rows(connection: Connection, week: Week) -> list[TaskRow]:
    """Every task active in the week (see the module docstring), ordered by id."""
    rows = connection.execute(_task_select(week).order_by(J.id)).all()
    return [_task_row(row) for row in rows]


def _task_row(row: Any) -> TaskRow:
    return TaskRow(
        job_id=int(row[0]),
        cluster=str(row[1]),
        namespace=str(row[2]),
        job_name=str(row[3]),
        job_uid=str(row[4]),
        team=str(row[5] or ""),
        model=str(row[6] or ""),
        world_size=int(row[7]),
        device_kind=str(row[8]),
        devices_per_rank=int(row[9]),
        status=str(row[10]),
        reason=str(row[11] or ""),
        compile_seconds=float(row[12] or 0.0),
        compile_charged=bool(row[13]),
        windows=int(row[14]),
        iterations=int(row[15]),
        saved_seconds=float(row[16]),
        paired=paired.PairedSums.made([float(value or 0.0) for value in row[17:-1]]),
        overhead_seconds=float(row[-1] or 0.0),
    )


def _mean_step(week: Week, mode: models.WindowMode) -> Select[Any]:
    """(job, value): each window's mean step seconds, for the week's windows of one mode."""
    mean = cast(W.step_seconds_sum, Float) / W.iterations
    return select(W.job_id.label("job_id"), mean.label("value")).where(
        _in_week(W.recorded_at, week), W.mode == mode.value
    )


def _reference(week: Week, job_ids: Sequence[int]) -> Select[Any]:
    """(job, value): the plugin's reference baseline carried by the stitched windows of `job_ids`."""
    query = _mean_step(week, models.WindowMode.STITCHED).with_only_columns(
        W.job_id.label("job_id"), W.baseline_step_seconds.label("value")
    )
    return query.where(W.job_id.in_(job_ids), W.baseline_step_seconds.is_not(None))


def _median(connection: Connection, values: Select[Any]) -> dict[int, float]:
    """Median per job of `values` (job_id, value), ranked by row_number in the database.

    The middle row (odd count) or the mean of the two middle rows (even count) of each
    job: (n+1)//2 and (n+2)//2 are the same position when n is odd.
    """
    series = values.subquery("series")
    ranked = select(
        series.c.job_id,
        series.c.value,
        func.row_number().over(partition_by=series.c.job_id, order_by=series.c.value).label("position"),
        func.count().over(partition_by=series.c.job_id).label("size"),
    ).subquery("ranked")
    middle = or_(ranked.c.position == (ranked.c.size + 1) // 2, ranked.c.position == (ranked.c.size + 2) // 2)
    query = select(ranked.c.job_id, func.avg(ranked.c.value)).where(middle).group_by(ranked.c.job_id)
    return {int(job): float(value) for job, value in connection.execute(query)}


def _chunks(ids: Sequence[int]) -> list[Sequence[int]]:
    return [ids[start : start + ID_CHUNK] for start in range(0, len(ids), ID_CHUNK)]


def medians(connection: Connection, week: Week, job_ids: Sequence[int]) -> dict[tuple[int, str], float]:
    """Median step seconds per (task, series) over the week's windows.

    Series: `baseline` and `stitched` (mean step time of each window of that mode), and, only for
    tasks in `job_ids` without a baseline window this week, `reference` (the baseline the
    plugin measured before, carried by the stitched windows).
    """
    found: dict[tuple[int, str], float] = {}
    for mode in (models.WindowMode.BASELINE, models.WindowMode.STITCHED):
        series = _median(connection, _mean_step(week, mode))
        found |= {(job, mode.value): value for job, value in series.items()}
    lacking = [job for job in job_ids if (job, "baseline") not in found]
    for chunk in _chunks(lacking):
        found |= {(job, "reference"): value for job, value in _median(connection, _reference(week, chunk)).items()}
    return found


def task_medians(connection: Connection, week: Week, job_ids: Sequence[int]) -> dict[tuple[int, str], float]:
    """`medians`, for the tasks `job_ids` only: reads their windows of the week (index on job, time)."""
    found: dict[tuple[int, str], float] = {}
    for chunk in _chunks(job_ids):
        for mode in (models.WindowMode.BASELINE, models.WindowMode.STITCHED):
            series = _median(connection, _mean_step(week, mode).where(W.job_id.in_(chunk)))
            found |= {(job, mode.value): value for job, value in series.items()}
        lacking = [job for job in chunk if (job, "baseline") not in found]
        if lacking:
            found |= {
                (job, "reference"): value for job, value in _median(connection, _reference(week, lacking)).items()
            }
    return found


def first_revert_reasons(connection: Connection, job_ids: Sequence[int]) -> dict[int, str]:
    """Per task of `job_ids`: the reason label of its earliest revert event (any time)."""
    found: dict[int, str] = {}
    for chunk in _chunks(job_ids):
        ranked = (
            select(
                E.job_id,
                E.reason,
                func.row_number().over(partition_by=E.job_id, order_by=(E.occurred_at, E.id)).label("position"),
            )
            .where(E.kind == models.EventKind.REVERT.value, E.job_id.in_(chunk))
            .subquery("reverts")
        )
        query = select(ranked.c.job_id, ranked.c.reason).where(ranked.c.position == 1)
        found |= {int(job): str(reason) for job, reason in connection.execute(query)}
    return found


def revert_counts(connection: Connection, job_ids: Sequence[int]) -> dict[str, tuple[int, int]]:
    """Per revert reason label over the tasks `job_ids`: (tasks with such a revert, revert events).

    A revert is of one cluster or of the whole job; a task reverted for two reasons counts under
    both, so the task counts of all reasons can sum to more than the reverted tasks.
    """
    tasks: dict[str, set[int]] = {}
    events: dict[str, int] = {}
    for chunk in _chunks(job_ids):
        query = (
            select(E.reason, E.job_id, func.count())
            .where(E.kind == models.EventKind.REVERT.value, E.job_id.in_(chunk))
            .group_by(E.reason, E.job_id)
        )
        for reason, job, count in connection.execute(query):
            label = str(reason or "")
            tasks.setdefault(label, set()).add(int(job))
            events[label] = events.get(label, 0) + int(count)
    return {label: (len(members), events[label]) for label, members in tasks.items()}


def daily_saved_device_seconds(
    connection: Connection, week: Week, claimed: Collection[int] | None = None
) -> dict[str, list[float]]:
    """Saved device-seconds (saved seconds x devices per rank) per device kind and UTC day, Monday first, of
    the tasks `claimed` (all when None: the ones whose saving is claimed, `paired.claim`).

    Days are bucketed by comparing with bound instants, so no dialect's date functions or
    session time zone are involved. GPU and CPU seconds are separate series, never summed.
    """
    days = week.days()
    bounds = [week.start + dt.timedelta(days=offset) for offset in range(1, len(days))]
    day_index = case(*[(W.recorded_at < bound, index) for index, bound in enumerate(bounds)], else_=len(bounds))
    kind = task_device_kind.label("kind")
    query = (
        select(day_index.label("day"), kind, W.job_id, func.sum(W.saved_seconds * task_devices_per_rank))
        .join(J, J.id == W.job_id)
        .where(_in_week(W.recorded_at, week))
        .group_by(day_index, kind, W.job_id)
    )
    totals: dict[str, list[float]] = {}
    for index, device_kind, job, value in connection.execute(query):
        series = totals.setdefault(str(device_kind), [0.0] * len(days))
        if claimed is None or job in claimed:
            series[int(index)] += float(value or 0.0)
    return totals


def missing_tables(connection: Connection, names: Sequence[str] = ("jobs", "step_windows", "events")) -> list[str]:
    """The telemetry tables missing from the database (empty when the schema is there)."""
    from sqlalchemy import inspect

    present = set(inspect(connection).get_table_names())
    return [name for name in names if name not in present]
