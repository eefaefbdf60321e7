"""The weekly GPU-hour savings report as data: per task, rollups, fleet totals, daily figures.

Input: an Engine or a database URL, and an ISO week. Output: `weekly_summary(...) -> WeeklyReport`,
frozen dataclasses with no formatting, which the renderers (report_text, report_html) print and
the operator can copy into a SavingsReport resource. The database does the scanning
(savings_sql); this module turns seconds into GPU-hours and sums tasks into rollups.

Definitions:
- task: one run of a job (a `jobs` row: cluster, namespace, job name, job uid); job: a distinct
  (cluster, namespace, job name), which may have several runs (tasks) in a week.
- GPUs of a task: world_size x gpus_per_rank.
- gross GPU-hours saved: saved seconds of the week's windows summed over ranks, x GPUs per rank,
  / 3600 (each rank's saved wall seconds are saved on each of its GPUs).
- compile overhead: compile_seconds (slowest rank) x GPUs of the task / 3600 (every GPU of the
  task waits for the compile), charged once, to the week of the task's start.
- net = gross - compile overhead. Step-time medians are over windows, each window's mean step
  time (step_seconds_sum / iterations); baseline falls back to the stitched windows' reference
  (baseline_step_seconds) when no baseline window ran in the week. speedup = baseline / stitched.
- reverted task: status `reverted`; its reason is the label of its first revert event, else the
  status reason.
"""

from __future__ import annotations

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
ATTRIBUTION = (
    "A step window counts in the ISO week (Monday 00:00 UTC to the next Monday, excluded) that holds its "
    "recorded_at, the end of its last step. A task (one run of a job) is listed when it has a window in the "
    "week or started in it. A stitched step saves the median of its job's latest baseline window (the same "
    "job's steps with every cluster on TF's own ops, through the plugin) minus its own time, check steps "
    "included. GPU-hours saved = saved seconds summed over ranks x GPUs per rank / 3600; compile overhead = "
    "setup seconds (compile, the check executor) of the slowest rank x all GPUs of the task / 3600, charged "
    "to the week the task started; net = gross - compile overhead. Medians are over windows (mean step time "
    "of each)."
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
    gpus_per_rank: int
    gpus: int
    windows: int
    iterations: int
    baseline_step_seconds: float | None
    stitched_step_seconds: float | None
    speedup: float | None
    gross_gpu_hours: float
    compile_gpu_hours: float
    net_gpu_hours: float
    status: str
    revert_reason: str


@dataclass(frozen=True)
class Rollup:
    """Tasks summed by one dimension (namespace, team or model) and one of its values."""

    dimension: str
    key: str
    tasks: int
    gpus: int
    iterations: int
    gross_gpu_hours: float
    compile_gpu_hours: float
    net_gpu_hours: float
    reverted_tasks: int


@dataclass(frozen=True)
class Totals:
    """The fleet's week; `revert_reasons` is (reason, reverted tasks) by count, descending."""

    tasks: int
    jobs: int
    distributed_tasks: int
    gpus: int
    iterations: int
    gross_gpu_hours: float
    compile_gpu_hours: float
    net_gpu_hours: float
    reverted_tasks: int
    reverted_share: float
    revert_reasons: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class DailySavings:
    """Gross GPU-hours saved by windows recorded on one UTC day."""

    day: dt.date
    gross_gpu_hours: float


@dataclass(frozen=True)
class WeeklyReport:
    """Everything a weekly report shows; tasks ordered by net GPU-hours saved, largest first."""

    week: Week
    jobs: tuple[JobSavings, ...]
    rollups: tuple[Rollup, ...]
    totals: Totals
    daily: tuple[DailySavings, ...]
    attribution: str = ATTRIBUTION


def _gpu_hours(seconds: float, gpus: int) -> float:
    return seconds * gpus / SECONDS_PER_HOUR


def _baseline(job_id: int, medians: dict[tuple[int, str], float]) -> float | None:
    return medians.get((job_id, "baseline"), medians.get((job_id, "reference")))


def _revert_reason(row: savings_sql.TaskRow, first_reverts: dict[int, str]) -> str:
    if row.job_id in first_reverts:
        return first_reverts[row.job_id] or UNSPECIFIED
    if row.status == models.JobStatus.REVERTED.value:
        return row.reason or UNSPECIFIED
    return ""


def _job(row: savings_sql.TaskRow, medians: dict[tuple[int, str], float], reverts: dict[int, str]) -> JobSavings:
    gpus = row.world_size * row.gpus_per_rank
    baseline, stitched = _baseline(row.job_id, medians), medians.get((row.job_id, "stitched"))
    gross = _gpu_hours(row.saved_seconds, row.gpus_per_rank)
    compile_hours = _gpu_hours(row.compile_seconds, gpus) if row.compile_charged else 0.0
    return JobSavings(
        cluster=row.cluster,
        namespace=row.namespace,
        team=row.team,
        model=row.model,
        job_name=row.job_name,
        job_uid=row.job_uid,
        world_size=row.world_size,
        gpus_per_rank=row.gpus_per_rank,
        gpus=gpus,
        windows=row.windows,
        iterations=row.iterations,
        baseline_step_seconds=baseline,
        stitched_step_seconds=stitched,
        speedup=baseline / stitched if baseline is not None and stitched else None,
        gross_gpu_hours=gross,
        compile_gpu_hours=compile_hours,
        net_gpu_hours=gross - compile_hours,
        status=row.status,
        revert_reason=_revert_reason(row, reverts),
    )


def _reverted(job: JobSavings) -> bool:
    return job.status == models.JobStatus.REVERTED.value


def _rollup(dimension: str, key: str, jobs: list[JobSavings]) -> Rollup:
    gross = sum(job.gross_gpu_hours for job in jobs)
    compile_hours = sum(job.compile_gpu_hours for job in jobs)
    return Rollup(
        dimension=dimension,
        key=key,
        tasks=len(jobs),
        gpus=sum(job.gpus for job in jobs),
        iterations=sum(job.iterations for job in jobs),
        gross_gpu_hours=gross,
        compile_gpu_hours=compile_hours,
        net_gpu_hours=gross - compile_hours,
        reverted_tasks=sum(1 for job in jobs if _reverted(job)),
    )


def rollups(jobs: Iterable[JobSavings]) -> tuple[Rollup, ...]:
    """Per namespace, team and model (in that order), each by net GPU-hours, largest first."""
    listed = list(jobs)
    result: list[Rollup] = []
    for dimension in ROLLUP_DIMENSIONS:
        groups: dict[str, list[JobSavings]] = defaultdict(list)
        for job in listed:
            groups[getattr(job, dimension)].append(job)
        found = [_rollup(dimension, key, members) for key, members in groups.items()]
        result.extend(sorted(found, key=lambda r: (-r.net_gpu_hours, r.key)))
    return tuple(result)


def totals(jobs: Iterable[JobSavings]) -> Totals:
    """The fleet totals over `jobs`."""
    listed = list(jobs)
    reverted = [job for job in listed if _reverted(job)]
    reasons = Counter(job.revert_reason or UNSPECIFIED for job in reverted)
    gross = sum(job.gross_gpu_hours for job in listed)
    compile_hours = sum(job.compile_gpu_hours for job in listed)
    return Totals(
        tasks=len(listed),
        jobs=len({(job.cluster, job.namespace, job.job_name) for job in listed}),
        distributed_tasks=sum(1 for job in listed if job.world_size > 1),
        gpus=sum(job.gpus for job in listed),
        iterations=sum(job.iterations for job in listed),
        gross_gpu_hours=gross,
        compile_gpu_hours=compile_hours,
        net_gpu_hours=gross - compile_hours,
        reverted_tasks=len(reverted),
        reverted_share=len(reverted) / len(listed) if listed else 0.0,
        revert_reasons=tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0]))),
    )


def _order(job: JobSavings) -> tuple[float, str, str, str]:
    return (-job.net_gpu_hours, job.namespace, job.job_name, job.job_uid)


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
        daily_seconds = savings_sql.daily_saved_gpu_seconds(connection, week)
    jobs = sorted((_job(row, medians, reverts) for row in rows), key=_order)
    daily = tuple(
        DailySavings(day, seconds / SECONDS_PER_HOUR) for day, seconds in zip(week.days(), daily_seconds, strict=True)
    )
    return WeeklyReport(week, tuple(jobs), rollups(jobs), totals(jobs), daily)


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
