"""The report's held-out check: a job's stitched runs of a week set against its holdout runs (plain TF, timed).

Input: a Connection and a `Week` (`held_out_checks`), or one job's figures (`check_job`: pure, no SQL). Output:
`HeldOutCheck` per job (cluster, namespace, job name, device kind) with at least two holdout runs in the week, and
per device kind the report's net after the check (`net_after_check`). Holdout runs are the tasks with a `setup`
event whose reason is `kinds.HOLDOUT_REASON`; their step windows are plain TF's steps in processes of their own.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, case, func, select, tuple_

from stitchfleet.telemetry import models, paired
from stitchfleet.telemetry.kinds import HOLDOUT_REASON
from stitchfleet.telemetry.savings_sql import task_device_kind
from stitchfleet.telemetry.weeks import Week

# The report's conversion (savings.SECONDS_PER_HOUR); not imported from there: savings imports this module.
SECONDS_PER_HOUR = 3600.0
MIN_HOLDOUTS = 2  # a spread needs two runs: with one there is no sd, hence no interval
# Job keys per IN (...) list: three bound parameters each, well under SQLite's and PostgreSQL's limits.
KEY_CHUNK = 1000

J = models.Job
W = models.StepWindow
E = models.Event
T = models.TaskWeek


class CheckVerdict(enum.StrEnum):
    """Where the report's in-job net for the stitched runs (claim less compile and overhead) falls against the
    saving between runs' interval (which has them taken off too)."""

    WITHIN = "within"
    ABOVE = "above"  # the report books more than plain TF in processes of their own shows
    BELOW = "below"


@dataclass(frozen=True)
class JobName:
    """A job as the check groups runs: cluster, namespace, job name, and the device kind its hours are in."""

    cluster: str
    namespace: str
    job_name: str
    device_kind: str


@dataclass(frozen=True)
class StitchedRun:
    """One stitched task's week, as the check charges it (rank-seconds; devices_per_rank converts to hours).

    rank_steps: iterations of all its windows of the week, summed over ranks (I_t; world size 1 in practice:
    holdouts happen in single-rank jobs only). step_seconds: their step_seconds_sum. charged_seconds: its compile
    and plugin overhead, x world size, when the report charges them to this week (else 0). claimed_seconds: the
    saved seconds the report claims for it this week (task_weeks.claimed_seconds, summed over ranks).
    """

    job_id: int
    devices_per_rank: int
    rank_steps: int
    step_seconds: float
    charged_seconds: float
    claimed_seconds: float


@dataclass(frozen=True)
class HeldOutCheck:
    """One job's week: its holdout runs' plain step against its stitched runs, in the job's unit (hours).

    plain_step_seconds (m) is the mean of the holdout runs' own mean steps, plain_step_sd their sample standard
    deviation, holdout_runs (k) their number. stitched_step_seconds: the stitched runs' step seconds per rank-step;
    charged_seconds: their compile and plugin overhead as the report charges them this week (rank-seconds).
    saving_hours = sum over runs t of (m * I_t - S_t) x devices per rank / 3600, S_t = step seconds + charges: a
    net, like the clock's; low/high: its 95% prediction interval; claimed_hours: what the report books in-job for
    the same runs (gross), charged_hours: their charges in the job's unit; the verdict sets the in-job net (claim
    less charges) against the interval, so that the charges count on both sides or on neither.
    """

    cluster: str
    namespace: str
    job_name: str
    device_kind: str
    holdout_runs: int
    plain_step_seconds: float
    plain_step_sd: float
    stitched_runs: int
    stitched_rank_steps: int
    stitched_step_seconds: float
    charged_seconds: float
    saving_hours: float
    low_hours: float
    high_hours: float
    claimed_hours: float
    charged_hours: float
    verdict: str

    @property
    def in_job_net_hours(self) -> float:
        """What the report nets for the same runs: its in-job claim less their compile and plugin overhead."""
        return self.claimed_hours - self.charged_hours

    @property
    def excess_hours(self) -> float:
        """What the in-job net books above the interval's high end (0 within or below it): the net after the check
        takes it off."""
        return max(self.in_job_net_hours - self.high_hours, 0.0)


@dataclass(frozen=True)
class CheckedNet:
    """One device kind's net after the held-out check: checked jobs' in-job nets capped at the interval's high end,
    every other task's net as booked. net_hours is the report's (unchanged); checked_jobs the jobs checked."""

    device_kind: str
    net_hours: float
    checked_jobs: int
    after_check_hours: float


def verdict_of(claimed: float, low: float, high: float) -> CheckVerdict:
    """The claim inside [low, high], above it or below it."""
    if claimed > high:
        return CheckVerdict.ABOVE
    if claimed < low:
        return CheckVerdict.BELOW
    return CheckVerdict.WITHIN


def _require_figures(job: JobName, plain_steps: Sequence[float], stitched: Sequence[StitchedRun]) -> None:
    where = f"{job.namespace}/{job.job_name} ({job.cluster}, {job.device_kind})"
    if len(plain_steps) < MIN_HOLDOUTS:
        raise ValueError(f"held-out check of {where}: {len(plain_steps)} holdout runs, expected >= {MIN_HOLDOUTS}")
    for step in plain_steps:
        if not math.isfinite(step) or step < 0.0:
            raise ValueError(f"held-out check of {where}: holdout mean step {step!r}, expected a finite value >= 0")
    if not stitched:
        raise ValueError(f"held-out check of {where}: no stitched run to check")
    for run in stitched:
        if run.rank_steps < 1 or run.devices_per_rank < 1:
            raise ValueError(
                f"held-out check of {where}: task {run.job_id} has rank_steps={run.rank_steps} and "
                f"devices_per_rank={run.devices_per_rank}, expected >= 1 each"
            )


def check_job(job: JobName, plain_steps: Sequence[float], stitched: Sequence[StitchedRun]) -> HeldOutCheck:
    """The check of one job from its holdout runs' mean steps (k >= 2) and its stitched runs (at least one).

    Saving between runs, in device-seconds: sum_t w_t (m I_t - S_t) with w_t the run's devices per rank. Its 95%
    interval is a prediction interval, not a confidence interval of a mean: a stitched run's own plain step would
    have been the job's mean plain step plus that run's own deviation, so the error of m * sum I_t as the runs'
    plain time is the mean's error (sd^2 (sum w_t I_t)^2 / k) plus each run's own deviation (sd^2 sum (w_t I_t)^2);
    half-width t(k-1) * sd * sqrt(both), which with one devices-per-rank is t(k-1) sd sqrt((sum I_t)^2/k +
    sum I_t^2) rank-seconds. The stitched runs' own seconds are measured, not estimated: no term for them.
    """
    _require_figures(job, plain_steps, stitched)
    k = len(plain_steps)
    m = statistics.fmean(plain_steps)
    sd = statistics.stdev(plain_steps)
    weighted = [run.devices_per_rank * run.rank_steps for run in stitched]
    saving = sum(
        run.devices_per_rank * (m * run.rank_steps - run.step_seconds - run.charged_seconds) for run in stitched
    )
    half = paired.t_quantile(k - 1) * sd * math.sqrt(sum(weighted) ** 2 / k + sum(w * w for w in weighted))
    claimed = sum(run.claimed_seconds * run.devices_per_rank for run in stitched) / SECONDS_PER_HOUR
    charged = sum(run.charged_seconds * run.devices_per_rank for run in stitched) / SECONDS_PER_HOUR
    low, high = (saving - half) / SECONDS_PER_HOUR, (saving + half) / SECONDS_PER_HOUR
    rank_steps = sum(run.rank_steps for run in stitched)
    return HeldOutCheck(
        cluster=job.cluster,
        namespace=job.namespace,
        job_name=job.job_name,
        device_kind=job.device_kind,
        holdout_runs=k,
        plain_step_seconds=m,
        plain_step_sd=sd,
        stitched_runs=len(stitched),
        stitched_rank_steps=rank_steps,
        stitched_step_seconds=sum(run.step_seconds for run in stitched) / rank_steps,
        charged_seconds=sum(run.charged_seconds for run in stitched),
        saving_hours=saving / SECONDS_PER_HOUR,
        low_hours=low,
        high_hours=high,
        claimed_hours=claimed,
        charged_hours=charged,
        verdict=verdict_of(claimed - charged, low, high).value,
    )


def _in_week(column: Any, week: Week) -> Any:
    return and_(column >= week.start, column < week.end)


def _held_out() -> Any:
    """Whether the outer query's task (`J`) ran as a holdout: its setup event says so. Correlated, so that each task
    of the week is looked up through the (kind, job_id) index, never every setup event the store ever held."""
    return (
        select(E.id)
        .where(E.job_id == J.id, E.kind == models.EventKind.SETUP.value, E.reason == HOLDOUT_REASON)
        .exists()
    )


def holdout_steps(connection: Connection, week: Week) -> dict[JobName, list[float]]:
    """Per job, the mean step (sum of step seconds / sum of iterations over its windows of the week) of each
    holdout task with a window in the week. One statement: the holdout events, then those tasks' windows."""
    kind = task_device_kind.label("kind")
    query = (
        select(J.id, J.cluster, J.namespace, J.job_name, kind, func.sum(W.step_seconds_sum), func.sum(W.iterations))
        .join(W, W.job_id == J.id)
        .where(_held_out(), _in_week(W.recorded_at, week))
        .group_by(J.id, J.cluster, J.namespace, J.job_name, J.device_kind, J.gpus_per_rank)
        .order_by(J.id)
    )
    found: dict[JobName, list[float]] = {}
    for _, cluster, namespace, job_name, device_kind, seconds, iterations in connection.execute(query):
        name = JobName(str(cluster), str(namespace), str(job_name), str(device_kind))
        found.setdefault(name, []).append(float(seconds or 0.0) / int(iterations))
    return found


def _stitched_query(week: Week, keys: Sequence[tuple[str, str, str]]) -> Any:
    """The week's stitched tasks (a stitched window in the week, no holdout) of the jobs `keys`, with their
    task_weeks row: what the report books and charges for them."""
    stitched = case((W.mode == models.WindowMode.STITCHED.value, 1), else_=0)
    per_task = (
        select(
            W.job_id.label("job_id"),
            func.sum(W.iterations).label("rank_steps"),
            func.sum(W.step_seconds_sum).label("step_seconds"),
        )
        .join(J, J.id == W.job_id)
        .where(
            _in_week(W.recorded_at, week),
            tuple_(J.cluster, J.namespace, J.job_name).in_(keys),
            ~_held_out(),
        )
        .group_by(W.job_id)
        .having(func.sum(stitched) > 0)
        .subquery("per_task")
    )
    return (
        select(
            T.job_id,
            T.cluster,
            T.namespace,
            T.job_name,
            T.device_kind,
            T.devices_per_rank,
            T.claimed_seconds,
            T.compile_device_seconds,
            T.overhead_device_seconds,
            per_task.c.rank_steps,
            per_task.c.step_seconds,
        )
        .join(per_task, per_task.c.job_id == T.job_id)
        .where(T.week_start == week.start.date())
        .order_by(T.job_id)
    )


def stitched_runs(connection: Connection, week: Week, jobs: Iterable[JobName]) -> dict[JobName, list[StitchedRun]]:
    """The week's stitched tasks of `jobs` (each with a device kind: a task of another kind is not theirs)."""
    wanted = set(jobs)
    keys = sorted({(job.cluster, job.namespace, job.job_name) for job in wanted})
    found: dict[JobName, list[StitchedRun]] = {}
    for start in range(0, len(keys), KEY_CHUNK):
        for row in connection.execute(_stitched_query(week, keys[start : start + KEY_CHUNK])):
            name = JobName(str(row.cluster), str(row.namespace), str(row.job_name), str(row.device_kind))
            if name not in wanted:
                continue
            per_rank = int(row.devices_per_rank)
            # task_weeks keeps the charges in device-seconds (x world size x devices per rank): back to rank-seconds.
            charged = (float(row.compile_device_seconds) + float(row.overhead_device_seconds or 0.0)) / per_rank
            run = StitchedRun(
                job_id=int(row.job_id),
                devices_per_rank=per_rank,
                rank_steps=int(row.rank_steps),
                step_seconds=float(row.step_seconds or 0.0),
                charged_seconds=charged,
                claimed_seconds=float(row.claimed_seconds or 0.0),
            )
            found.setdefault(name, []).append(run)
    return found


def _order(check: HeldOutCheck) -> tuple[int, float, str, str, str]:
    # GPU first (as every table of the report), then the nets furthest above what the holdouts show.
    gpu_first = 0 if check.device_kind == models.DeviceKind.GPU.value else 1
    return (gpu_first, check.high_hours - check.in_job_net_hours, check.cluster, check.namespace, check.job_name)


def held_out_checks(connection: Connection, week: Week) -> tuple[HeldOutCheck, ...]:
    """Every job's check of `week`: jobs with at least two holdout runs and a stitched run in the week.

    Two statements whatever the fleet's size: the holdout tasks' windows, then the stitched tasks of those jobs
    only (their windows of the week and their task_weeks rows). A job with holdouts but no stitched run in the
    week has nothing to check and is not listed.
    """
    plain = {job: steps for job, steps in holdout_steps(connection, week).items() if len(steps) >= MIN_HOLDOUTS}
    if not plain:
        return ()
    runs = stitched_runs(connection, week, plain)
    checks = [check_job(job, plain[job], runs[job]) for job in plain if runs.get(job)]
    return tuple(sorted(checks, key=_order))


def net_after_check(net_by_kind: Mapping[str, float], checks: Sequence[HeldOutCheck]) -> tuple[CheckedNet, ...]:
    """Per device kind of `net_by_kind` (the report's net hours, in its order): the net less what checked jobs' in-job
    nets book above their interval's high end (`HeldOutCheck.excess_hours`)."""
    result = []
    for kind, net in net_by_kind.items():
        mine = [check for check in checks if check.device_kind == kind]
        result.append(CheckedNet(kind, net, len(mine), net - sum(check.excess_hours for check in mine)))
    return tuple(result)
