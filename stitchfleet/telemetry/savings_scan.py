"""The weekly report recomputed from scratch: every step window of the week scanned by SQL.

Input: an Engine or a database URL, and an ISO week. Output: `weekly_summary_scan(...)`, a
`savings.WeeklyReport` listing every task of the week, computed straight from the jobs, step
windows and events tables (savings_sql) without the incremental aggregates. It reads O(rows): it
is the reference the aggregates are checked against (tests, `scripts/bench_report.py --scan`),
not what reports and the operator use (`savings.weekly_summary`). Its held-out check is its own too: plain
Python over the week's holdout events and windows, from docs/held-out-check.md, never holdout.py's statements.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable

from sqlalchemy import Connection, Engine, select

from stitchfleet.telemetry import models, paired, savings_sql
from stitchfleet.telemetry.holdout import CheckedNet, HeldOutCheck
from stitchfleet.telemetry.kinds import HOLDOUT_REASON
from stitchfleet.telemetry.savings import (
    ROLLUP_DIMENSIONS,
    SECONDS_PER_HOUR,
    DailySavings,
    DeviceTotals,
    JobSavings,
    RevertReason,
    Rollup,
    Totals,
    WeeklyReport,
    kind_order,
    opened,
    speedup,
    step_figures,
)
from stitchfleet.telemetry.task_weeks import UNSPECIFIED
from stitchfleet.telemetry.weeks import Week, parse_week

# A job is checked with two holdout runs or more (one has no spread): the doc's rule, not holdout.py's constant.
HOLDOUTS_CHECKED = 2
# cluster, namespace, job name, device kind: a CPU task of a job name is another job than its GPU tasks
JobKey = tuple[str, str, str, str]
Run = tuple[int, int, float, float, JobSavings]  # devices per rank, rank-steps, step seconds, charged rank-s, figures


def _hours(seconds: float, devices: int) -> float:
    return seconds * devices / SECONDS_PER_HOUR


def _revert_reason(row: savings_sql.TaskRow, first_reverts: dict[int, str]) -> str:
    if row.job_id in first_reverts:
        return first_reverts[row.job_id] or UNSPECIFIED
    if row.status == models.JobStatus.REVERTED.value:
        return row.reason or UNSPECIFIED
    return ""


def _job(row: savings_sql.TaskRow, medians: dict[tuple[int, str], float], reverts: dict[int, str]) -> JobSavings:
    devices = row.world_size * row.devices_per_rank
    found = paired.claim(row.paired, row.saved_seconds)
    baseline, stitched = step_figures(row.job_id, row.paired, row.saved_seconds, medians)
    gross = _hours(found.claimed, row.devices_per_rank)
    interval = (None, None) if found.low == -math.inf else (found.low, found.high)
    compile_hours = _hours(row.compile_seconds, devices) if row.compile_charged else 0.0
    overhead_hours = _hours(row.overhead_seconds, devices) if row.compile_charged else 0.0
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
        speedup=speedup(baseline, stitched, gross),
        gross_hours=gross,
        compile_hours=compile_hours,
        net_hours=gross - compile_hours - overhead_hours,
        status=row.status,
        revert_reason=_revert_reason(row, reverts),
        overhead_hours=overhead_hours,
        measured_hours=_hours(row.saved_seconds, row.devices_per_rank),
        low_hours=None if interval[0] is None else _hours(interval[0], row.devices_per_rank),
        high_hours=None if interval[1] is None else _hours(interval[1], row.devices_per_rank),
    )


def _reverted(job: JobSavings) -> bool:
    return bool(job.revert_reason)


def _rollup(dimension: str, key: str, device_kind: str, jobs: list[JobSavings]) -> Rollup:
    return Rollup(dimension, key, **dataclasses.asdict(_device_totals(device_kind, jobs)))


def rollups(jobs: Iterable[JobSavings]) -> tuple[Rollup, ...]:
    """Per namespace, team and model (in that order), GPU before CPU, each by net hours, largest first."""
    listed = list(jobs)
    result: list[Rollup] = []
    for dimension in ROLLUP_DIMENSIONS:
        groups: dict[tuple[str, str], list[JobSavings]] = defaultdict(list)
        for job in listed:
            groups[(getattr(job, dimension), job.device_kind)].append(job)
        found = [_rollup(dimension, key, kind, members) for (key, kind), members in groups.items()]
        result.extend(sorted(found, key=lambda r: (kind_order(r.device_kind), -r.net_hours, r.key)))
    return tuple(result)


def _device_totals(device_kind: str, jobs: list[JobSavings]) -> DeviceTotals:
    gross = sum(job.gross_hours for job in jobs)
    compile_hours = sum(job.compile_hours for job in jobs)
    overhead_hours = sum(job.overhead_hours for job in jobs)
    return DeviceTotals(
        device_kind=device_kind,
        tasks=len(jobs),
        devices=sum(job.devices for job in jobs),
        iterations=sum(job.iterations for job in jobs),
        gross_hours=gross,
        compile_hours=compile_hours,
        net_hours=gross - compile_hours - overhead_hours,
        reverted_tasks=sum(1 for job in jobs if _reverted(job)),
        overhead_hours=overhead_hours,
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
    kinds = sorted({job.device_kind for job in listed}, key=kind_order)
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


def _check(key: JobKey, means: list[float], runs: list[Run]) -> HeldOutCheck:
    """One job's check: holdout mean steps `means` (m, sd) against its stitched `runs`, each weighted by its devices
    per rank; the half-width is a prediction interval's, t(k-1) sd sqrt((sum w I)^2 / k + sum (w I)^2)."""
    k, m = len(means), sum(means) / len(means)
    sd = math.sqrt(sum((mean - m) ** 2 for mean in means) / (k - 1))
    saving = sum(per_rank * (m * steps - seconds - charged) for per_rank, steps, seconds, charged, _ in runs)
    weighted = [per_rank * steps for per_rank, steps, *_ in runs]
    half = paired.t_quantile(k - 1) * sd * math.sqrt(sum(weighted) ** 2 / k + sum(w * w for w in weighted))
    low, high = (saving - half) / SECONDS_PER_HOUR, (saving + half) / SECONDS_PER_HOUR
    # The in-job claim is this scan's gross of the runs; their net takes off the same charges the saving holds.
    claimed = sum(job.gross_hours for *_, job in runs)
    charged = sum(job.compile_hours + job.overhead_hours for *_, job in runs)
    verdict = "above" if claimed - charged > high else "below" if claimed - charged < low else "within"
    steps, step_seconds, charged_seconds = sum(r[1] for r in runs), sum(r[2] for r in runs), sum(r[3] for r in runs)
    figures = (*key, k, m, sd, len(runs), steps, step_seconds / steps, charged_seconds, saving / SECONDS_PER_HOUR)
    return HeldOutCheck(*figures, low, high, claimed, charged, verdict)


def _check_order(c: HeldOutCheck) -> tuple[int, float, str, str, str]:
    # GPU first, then the in-job nets furthest above their interval's high end (names break ties).
    return (
        kind_order(c.device_kind),
        c.high_hours - (c.claimed_hours - c.charged_hours),
        c.cluster,
        c.namespace,
        c.job_name,
    )


def _held_out(
    connection: Connection, week: Week, rows: list[savings_sql.TaskRow], jobs: list[JobSavings]
) -> list[HeldOutCheck]:
    """The week's held-out checks: holdout tasks (a setup event with HOLDOUT_REASON) with windows in the week, and
    the other tasks of their jobs with a stitched window, from their raw windows; `jobs` are `rows`' figures."""
    event, window = models.Event, models.StepWindow
    setup = select(event.job_id).where(event.kind == models.EventKind.SETUP.value, event.reason == HOLDOUT_REASON)
    held = {int(job_id) for (job_id,) in connection.execute(setup)}
    names = {row.job_id: (row.cluster, row.namespace, row.job_name, row.device_kind) for row in rows if row.windows}
    holdouts = Counter(names[job_id] for job_id in held if job_id in names)
    ids = [job_id for job_id, name in names.items() if holdouts[name] >= HOLDOUTS_CHECKED]  # only these are read
    sums: dict[int, tuple[int, float, bool]] = {}  # rank-steps, step seconds, any stitched window: every rank's
    for start in range(0, len(ids), savings_sql.ID_CHUNK):
        chunk = ids[start : start + savings_sql.ID_CHUNK]
        query = select(window.job_id, window.mode, window.iterations, window.step_seconds_sum).where(
            window.job_id.in_(chunk), window.recorded_at >= week.start, window.recorded_at < week.end
        )
        for job_id, mode, steps, seconds in connection.execute(query):
            before = sums.get(int(job_id), (0, 0.0, False))
            stitched = before[2] or mode == models.WindowMode.STITCHED.value
            sums[int(job_id)] = (before[0] + int(steps), before[1] + float(seconds or 0.0), stitched)
    means: dict[JobKey, list[float]] = defaultdict(list)
    runs: dict[JobKey, list[Run]] = defaultdict(list)
    for row, job in zip(rows, jobs, strict=True):
        steps, seconds, stitched = sums.get(row.job_id, (0, 0.0, False))
        if not steps:
            continue  # no window read: not a task of a job with two holdouts in the week
        if row.job_id in held:  # a holdout run, never a stitched one, whatever its windows' modes
            means[names[row.job_id]].append(seconds / steps)
        elif stitched:  # its compile and overhead only in the week the report charges them to (compile_charged)
            charged = (row.compile_seconds + row.overhead_seconds) * row.world_size if row.compile_charged else 0.0
            runs[names[row.job_id]].append((row.devices_per_rank, steps, seconds, charged, job))
    checks = [_check(key, found, runs[key]) for key, found in means.items() if runs[key]]
    return sorted(checks, key=_check_order)


def _after_check(by_kind: tuple[DeviceTotals, ...], checks: list[HeldOutCheck]) -> tuple[CheckedNet, ...]:
    """Per device kind: the net less what each checked job's in-job net books above its interval's high end."""
    result = []
    for kind in by_kind:
        mine = [c for c in checks if c.device_kind == kind.device_kind]
        excess = sum(max(c.claimed_hours - c.charged_hours - c.high_hours, 0.0) for c in mine)
        result.append(CheckedNet(kind.device_kind, kind.net_hours, len(mine), kind.net_hours - excess))
    return tuple(result)


def _order(job: JobSavings) -> tuple[int, float, str, str, str]:
    return (kind_order(job.device_kind), -job.net_hours, job.namespace, job.job_name, job.job_uid)


def _compute(connection: Connection, week: Week) -> WeeklyReport:
    rows = savings_sql.task_rows(connection, week)
    ids = [row.job_id for row in rows]
    medians = savings_sql.medians(connection, week, ids)
    reverts = savings_sql.first_revert_reasons(connection, ids)
    counts = savings_sql.revert_counts(connection, ids)
    found = [_job(row, medians, reverts) for row in rows]
    claimed = {row.job_id for row, job in zip(rows, found, strict=True) if job.gross_hours != 0.0}
    daily_seconds = savings_sql.daily_saved_device_seconds(connection, week, claimed)
    jobs = sorted(found, key=_order)
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
    fleet = totals(jobs, counts)
    checks = _held_out(connection, week, rows, found)
    after = _after_check(fleet.by_kind, checks)
    return WeeklyReport(week, tuple(jobs), rollups(jobs), fleet, daily, held_out=tuple(checks), after_check=after)


def weekly_summary_scan(engine_or_url: Engine | str | None, week: Week | str) -> WeeklyReport:
    """The report of `week` recomputed from every row, listing every task; errors as `weekly_summary`."""
    with opened(engine_or_url) as connection:
        return _compute(connection, parse_week(week) if isinstance(week, str) else week)
