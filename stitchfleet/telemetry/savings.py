"""The weekly savings report as data: per task, rollups, fleet totals per device kind, daily figures.

Input: an Engine or a database URL, and an ISO week. Output: `weekly_summary(...) -> WeeklyReport`,
frozen dataclasses with no formatting, which the renderers (report_text, report_html) print and
the operator can copy into a SavingsReport resource. The database does the scanning
(savings_sql); this module turns seconds into device-hours and sums tasks into rollups.

Definitions:
- task: one run of a job (a `jobs` row: cluster, namespace, job name, job uid); job: a distinct
  (cluster, namespace, job name), which may have several runs (tasks) in a week.
- device kind: what the task's ranks measured they compute on. A GPU task is accounted in
  GPU-hours, a CPU task in CPU core-hours; the two are different units and are never summed.
- devices of a task: world_size x devices per rank, where devices per rank is what one rank uses
  (its visible GPUs, or its usable CPU cores), not the pod's allocation.
- gross hours saved: saved seconds of the week's windows summed over ranks, x devices per rank,
  / 3600 (each rank's saved wall seconds are saved on each of its devices).
- compile overhead: compile_seconds (slowest rank) x devices of the task / 3600 (every device of
  the task waits for the compile), charged once, to the week of the task's start.
- net = gross - compile overhead. Step-time medians are over windows, each window's mean step
  time (step_seconds_sum / iterations); baseline falls back to the stitched windows' reference
  (baseline_step_seconds) when no baseline window ran in the week. speedup = baseline / stitched.
- reverted task: any revert recorded for it (one cluster or the whole job) or status `reverted`;
  its reason is the label of its first revert event, else the status reason.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from stitchfleet.telemetry import database, models, savings_sql
from stitchfleet.telemetry.weeks import Week, parse_week

SECONDS_PER_HOUR = 3600.0
ROLLUP_DIMENSIONS = ("namespace", "team", "model")
UNSPECIFIED = "unspecified"
UNITS = {models.DeviceKind.GPU.value: "GPU-hours", models.DeviceKind.CPU.value: "CPU core-hours"}
DEVICE_NOUNS = {models.DeviceKind.GPU.value: "GPUs", models.DeviceKind.CPU.value: "CPU cores"}
ATTRIBUTION = (
    "One telemetry row (a step window) covers one rank's consecutive training steps of one mode (baseline: "
    "every cluster on TensorFlow's own ops; stitched), up to STITCHFLEET_WINDOW_STEPS steps, and counts in "
    "the ISO week (Monday 00:00 UTC to the next Monday, excluded) that holds its recorded_at, the end of its "
    "last step. A task (one run of a job) is listed when it has a window in the week or started in it. A "
    "stitched step saves the median of its job's latest baseline window minus its own time, check steps "
    "included. Baseline steps run the job's graph exactly as the user built it (plain TensorFlow; stitching "
    "lives on a copy of the graph that only stitched steps run), interleaved with the stitched steps in the "
    "same job, so savings are against plain TensorFlow measured in the same run. GPU tasks are accounted "
    "in GPU-hours, CPU tasks in CPU "
    "core-hours, never summed together: hours saved = saved seconds summed over ranks x devices per rank "
    "(the GPUs, or CPU cores, one rank measured it uses) / 3600; compile overhead = setup seconds (compile, "
    "the check executor) of the slowest rank x all devices of the task / 3600, charged to the week the task "
    "started; net = gross - compile overhead. A task counts as reverted when any of its clusters, or the "
    "whole job, was reverted. Medians are over windows (mean step time of each)."
)


@dataclass(frozen=True)
class JobSavings:
    """One task's week: identity, size, step times, GPU-hours, outcome."""

    cluster: str
    namespace: str
    team: str
    model: str
    job_name: str
    job_uid: str
    world_size: int
    device_kind: str
    devices_per_rank: int
    devices: int
    windows: int
    iterations: int
    baseline_step_seconds: float | None
    stitched_step_seconds: float | None
    speedup: float | None
    gross_hours: float
    compile_hours: float
    net_hours: float
    status: str
    revert_reason: str

    @property
    def unit(self) -> str:
        """The unit of this task's hours: GPU-hours or CPU core-hours."""
        return UNITS[self.device_kind]


@dataclass(frozen=True)
class Rollup:
    """Tasks of one device kind summed by one dimension (namespace, team or model) and one of its values."""

    dimension: str
    key: str
    device_kind: str
    tasks: int
    devices: int
    iterations: int
    gross_hours: float
    compile_hours: float
    net_hours: float
    reverted_tasks: int


@dataclass(frozen=True)
class DeviceTotals:
    """The fleet's tasks of one device kind, in that kind's unit (GPU-hours or CPU core-hours)."""

    device_kind: str
    tasks: int
    devices: int
    iterations: int
    gross_hours: float
    compile_hours: float
    net_hours: float
    reverted_tasks: int

    @property
    def unit(self) -> str:
        return UNITS[self.device_kind]


@dataclass(frozen=True)
class RevertReason:
    """One revert reason label: tasks with such a revert, and the revert events (clusters or jobs)."""

    reason: str
    tasks: int
    reverts: int


@dataclass(frozen=True)
class Totals:
    """The fleet's week: counts, then hours per device kind (GPU first), never summed across kinds."""

    tasks: int
    jobs: int
    distributed_tasks: int
    iterations: int
    by_kind: tuple[DeviceTotals, ...]
    reverted_tasks: int
    reverted_share: float
    revert_reasons: tuple[RevertReason, ...]

    def kind(self, device_kind: str) -> DeviceTotals:
        """The totals of one device kind (zeros when the week has no such task)."""
        for found in self.by_kind:
            if found.device_kind == device_kind:
                return found
        return DeviceTotals(device_kind, 0, 0, 0, 0.0, 0.0, 0.0, 0)

    @property
    def gpu(self) -> DeviceTotals:
        """GPU tasks only: what a GPU-hour figure may claim."""
        return self.kind(models.DeviceKind.GPU.value)


@dataclass(frozen=True)
class DailySavings:
    """Gross hours saved by windows recorded on one UTC day, per device kind."""

    day: dt.date
    gross_gpu_hours: float
    gross_cpu_core_hours: float


@dataclass(frozen=True)
class WeeklyReport:
    """Everything a weekly report shows; tasks ordered by net GPU-hours saved, largest first."""

    week: Week
    jobs: tuple[JobSavings, ...]
    rollups: tuple[Rollup, ...]
    totals: Totals
    daily: tuple[DailySavings, ...]
    attribution: str = ATTRIBUTION


def _hours(seconds: float, devices: int) -> float:
    return seconds * devices / SECONDS_PER_HOUR


def _baseline(job_id: int, medians: dict[tuple[int, str], float]) -> float | None:
    return medians.get((job_id, "baseline"), medians.get((job_id, "reference")))


def _revert_reason(row: savings_sql.TaskRow, first_reverts: dict[int, str]) -> str:
    if row.job_id in first_reverts:
        return first_reverts[row.job_id] or UNSPECIFIED
    if row.status == models.JobStatus.REVERTED.value:
        return row.reason or UNSPECIFIED
    return ""


def _job(row: savings_sql.TaskRow, medians: dict[tuple[int, str], float], reverts: dict[int, str]) -> JobSavings:
    devices = row.world_size * row.devices_per_rank
    baseline, stitched = _baseline(row.job_id, medians), medians.get((row.job_id, "stitched"))
    gross = _hours(row.saved_seconds, row.devices_per_rank)
    compile_hours = _hours(row.compile_seconds, devices) if row.compile_charged else 0.0
    return JobSavings(
        cluster=row.cluster,
        namespace=row.namespace,
        team=row.team,
        model=row.model,
        job_name=row.job_name,
        job_uid=row.job_uid,
        world_size=row.world_size,
        device_kind=row.device_kind,
        devices_per_rank=row.devices_per_rank,
        devices=devices,
        windows=row.windows,
        iterations=row.iterations,
        baseline_step_seconds=baseline,
        stitched_step_seconds=stitched,
        speedup=baseline / stitched if baseline is not None and stitched else None,
        gross_hours=gross,
        compile_hours=compile_hours,
        net_hours=gross - compile_hours,
        status=row.status,
        revert_reason=_revert_reason(row, reverts),
    )


def _reverted(job: JobSavings) -> bool:
    return bool(job.revert_reason)


def _rollup(dimension: str, key: str, device_kind: str, jobs: list[JobSavings]) -> Rollup:
    return Rollup(dimension, key, **dataclasses.asdict(_device_totals(device_kind, jobs)))


def _kind_order(device_kind: str) -> int:
    return 0 if device_kind == models.DeviceKind.GPU.value else 1


def rollups(jobs: Iterable[JobSavings]) -> tuple[Rollup, ...]:
    """Per namespace, team and model (in that order), GPU before CPU, each by net hours, largest first."""
    listed = list(jobs)
    result: list[Rollup] = []
    for dimension in ROLLUP_DIMENSIONS:
        groups: dict[tuple[str, str], list[JobSavings]] = defaultdict(list)
        for job in listed:
            groups[(getattr(job, dimension), job.device_kind)].append(job)
        found = [_rollup(dimension, key, kind, members) for (key, kind), members in groups.items()]
        result.extend(sorted(found, key=lambda r: (_kind_order(r.device_kind), -r.net_hours, r.key)))
    return tuple(result)


def _device_totals(device_kind: str, jobs: list[JobSavings]) -> DeviceTotals:
    gross = sum(job.gross_hours for job in jobs)
    compile_hours = sum(job.compile_hours for job in jobs)
    return DeviceTotals(
        device_kind=device_kind,
        tasks=len(jobs),
        devices=sum(job.devices for job in jobs),
        iterations=sum(job.iterations for job in jobs),
        gross_hours=gross,
        compile_hours=compile_hours,
        net_hours=gross - compile_hours,
        reverted_tasks=sum(1 for job in jobs if _reverted(job)),
    )


def totals(jobs: Iterable[JobSavings], reverts: dict[str, tuple[int, int]] | None = None) -> Totals:
    """The fleet totals over `jobs`; `reverts` (reason -> tasks, events) from savings_sql.revert_counts.

    Without `reverts` (tasks built in memory), each reverted task counts once under its first reason.
    """
    listed = list(jobs)
    reverted = [job for job in listed if _reverted(job)]
    if reverts is None:
        firsts = Counter(job.revert_reason for job in reverted)
        reverts = {reason: (count, count) for reason, count in firsts.items()}
    merged: dict[str, tuple[int, int]] = {}
    for reason, (tasks, events) in reverts.items():
        before = merged.get(reason or UNSPECIFIED, (0, 0))
        merged[reason or UNSPECIFIED] = (before[0] + tasks, before[1] + events)
    reasons = sorted(
        (RevertReason(reason, tasks, events) for reason, (tasks, events) in merged.items()),
        key=lambda r: (-r.tasks, -r.reverts, r.reason),
    )
    kinds = sorted({job.device_kind for job in listed}, key=_kind_order)
    return Totals(
        tasks=len(listed),
        jobs=len({(job.cluster, job.namespace, job.job_name) for job in listed}),
        distributed_tasks=sum(1 for job in listed if job.world_size > 1),
        iterations=sum(job.iterations for job in listed),
        by_kind=tuple(_device_totals(kind, [job for job in listed if job.device_kind == kind]) for kind in kinds),
        reverted_tasks=len(reverted),
        reverted_share=len(reverted) / len(listed) if listed else 0.0,
        revert_reasons=tuple(reasons),
    )


def _order(job: JobSavings) -> tuple[int, float, str, str, str]:
    return (_kind_order(job.device_kind), -job.net_hours, job.namespace, job.job_name, job.job_uid)


def _compute(engine: Engine, week: Week) -> WeeklyReport:
    with engine.connect() as connection:
        missing = savings_sql.missing_tables(connection)
        if missing:
            raise database.DatabaseError(
                f"no telemetry schema (missing {', '.join(missing)}): run `stitchfleet db upgrade` first"
            )
        rows = savings_sql.task_rows(connection, week)
        ids = [row.job_id for row in rows]
        medians = savings_sql.medians(connection, week, ids)
        reverts = savings_sql.first_revert_reasons(connection, ids)
        counts = savings_sql.revert_counts(connection, ids)
        daily_seconds = savings_sql.daily_saved_device_seconds(connection, week)
    jobs = sorted((_job(row, medians, reverts) for row in rows), key=_order)
    zeros = [0.0] * len(week.days())
    gpu = daily_seconds.get(models.DeviceKind.GPU.value, zeros)
    cpu = daily_seconds.get(models.DeviceKind.CPU.value, zeros)
    daily = tuple(
        DailySavings(day, g / SECONDS_PER_HOUR, c / SECONDS_PER_HOUR)
        for day, g, c in zip(week.days(), gpu, cpu, strict=True)
    )
    # A task reverted only by its status (no revert event) still counts, under its status reason.
    for row in rows:
        if row.job_id not in reverts and row.status == models.JobStatus.REVERTED.value:
            label = row.reason or UNSPECIFIED
            tasks, events = counts.get(label, (0, 0))
            counts[label] = (tasks + 1, events)
    return WeeklyReport(week, tuple(jobs), rollups(jobs), totals(jobs, counts), daily)


def weekly_summary(engine_or_url: Engine | str | None, week: Week | str) -> WeeklyReport:
    """The report of `week` (a Week or a label like 2026-W47) from an engine or a URL.

    Raises WeekError for a bad label and DatabaseError (one clear line) when the database
    cannot be reached or holds no telemetry schema.
    """
    chosen = parse_week(week) if isinstance(week, str) else week
    url = None if isinstance(engine_or_url, Engine) else database.resolve_url(engine_or_url)
    engine = engine_or_url if isinstance(engine_or_url, Engine) else database.connect(url)
    try:
        return _compute(engine, chosen)
    except SQLAlchemyError as err:
        target = url or engine.url.render_as_string(hide_password=True)
        raise database.DatabaseError(database.describe_failure(target, err)) from None
    finally:
        if engine is not engine_or_url:
            engine.dispose()
