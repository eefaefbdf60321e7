"""The weekly savings report as data: per task, rollups, fleet totals per device kind, daily figures.

Input: an Engine or a database URL, and an ISO week. Output: `weekly_summary(...) -> WeeklyReport`,
frozen dataclasses with no formatting, which the renderers (report_text, report_html) print and
the operator can copy into a SavingsReport resource, and `week_tasks(...)`, every task streamed.
This module turns device-seconds into device-hours.

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
- plugin overhead: the plugin's own cost beyond what the user's graph costs (measured by the job: its work on
  the steps no window's saving pays, e.g. baseline and warmup steps; rows.JobOverhead), slowest rank x devices
  of the task / 3600, charged like the compile, once, to the week of the task's start.
- claimed saving: the week's saved seconds when their 95% interval over the task's paired windows
  excludes zero, else 0, "within noise" (telemetry.paired; task_weeks keeps its sums); gross counts it.
- net = gross - compile overhead - plugin overhead: a task with no claimed saving (stitching skipped, never
  kept, within noise) books minus its own cost, never a positive saving.
- Step times are the paired means (the stitched windows' steps and the
  baseline blocks around them) when the task has paired windows, else medians over windows, each window's
  mean step time (step_seconds_sum / iterations), baseline falling back to the stitched windows' reference
  (baseline_step_seconds) when no baseline window ran in the week. speedup = baseline / stitched, shown only
  when a saving is claimed, and then from the paired means: it agrees in sign with the gross.
- reverted task: any revert recorded for it (one cluster or the whole job) or status `reverted`;
  its reason is the label of its first revert event, else the status reason.
- held-out check (telemetry.holdout): per job with two or more holdout runs (plain TF, timed, in processes of
  their own) in the week, its stitched runs' saving between runs with a 95% prediction interval beside what the
  report nets in-job for them (claim less compile and overhead: the saving between runs has them taken off too);
  net after the check = the net less what checked jobs' in-job nets book above the interval's high end. The
  gross, net and aggregates above do not change with it.

`weekly_summary` reads the incremental aggregates the store keeps on every write
(telemetry.aggregates): O(groups) rows, whatever the number of windows, plus the windows of the
tasks it lists (their median step times, which cannot be kept by differences). `week_tasks`
streams every task of the week (for the CSV), reading each batch's windows for its medians.
`savings_scan.weekly_summary_scan` recomputes the same report from every row, the reference the
aggregates are tested against.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from stitchfleet.telemetry import database, holdout, models, paired, rollup_sql, savings_sql
from stitchfleet.telemetry.holdout import CheckedNet, HeldOutCheck
from stitchfleet.telemetry.weeks import Week, parse_week

SECONDS_PER_HOUR = 3600.0
ROLLUP_DIMENSIONS = ("namespace", "team", "model")
# Tasks a report lists per device kind at each end (most and least saving): its size stays
# bounded whatever the fleet's; the CSV lists every task.
LISTED_TASKS = 25
UNITS = {models.DeviceKind.GPU.value: "GPU-hours", models.DeviceKind.CPU.value: "CPU core-hours"}
DEVICE_NOUNS = {models.DeviceKind.GPU.value: "GPUs", models.DeviceKind.CPU.value: "CPU cores"}
ATTRIBUTION = (
    "One telemetry row (a step window) covers one rank's consecutive training steps of one mode (baseline: "
    "every cluster on TensorFlow's own ops; stitched), up to STITCHFLEET_WINDOW_STEPS steps, and counts in "
    "the ISO week (Monday 00:00 UTC to the next Monday, excluded) that holds its recorded_at, the end of its "
    "last step. A task (one run of a job) is listed when it has a window in the week or started in it. "
    "Baseline blocks (STITCHFLEET_PAIRED_STEPS steps every STITCHFLEET_REBASELINE_EVERY: 5% of steps by default) "
    "run through the whole job; a stitched step saves the mean step of the blocks on either side of its window "
    "(per shape signature; a block's first 5 steps after stitched ones, which pay the switch between the graphs, "
    "are no part of it), at most the job's calm steps' mean (the first block's steps past 0.3 s of it: after "
    "stitched steps TensorFlow's run slow longer than a short block), minus its own time and the plugin's own work "
    "on it (planning the step, reading its figures, judging its checks), check steps included; a window also pays "
    "the switch back, the next block's first 5 steps (all its steps where the calm mean caps it) beyond that mean. "
    "A task's saving in a week is the sum over its "
    "paired windows, with a 95% interval: the spread of the windows' residuals from the task's per-step saving "
    "(windows as clusters, Student's t), doubled in variance for blocks shared by neighbouring windows and times "
    "the stitched windows per block. It is claimed (gross, speedup) only when that interval excludes zero, else "
    "the task is within noise and claims 0; speedup = paired baseline / stitched step time, so it always agrees "
    "with the gross in sign. Baseline steps run the job's graph exactly as the user built it (plain TensorFlow; "
    "stitching lives on a copy of the graph that only stitched steps run), interleaved with the stitched steps in the "
    "same job, so savings are against plain TensorFlow measured in the same run. GPU tasks are accounted "
    "in GPU-hours, CPU tasks in CPU "
    "core-hours, never summed together: hours saved = saved seconds summed over ranks x devices per rank "
    "(the GPUs, or CPU cores, one rank measured it uses) / 3600; compile overhead = setup seconds (compile, "
    "the check executor) of the slowest rank x all devices of the task / 3600, charged to the week the task "
    "started; plugin overhead = the plugin's own work the slowest rank measured on steps no window's saving pays "
    "(baseline, warmup and reverted steps), likewise; net = gross - compile overhead - plugin overhead. A task "
    "counts as reverted when any of its clusters, or the "
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
    overhead_hours: float = 0.0  # the plugin's own cost the task measured (`rows.JobOverhead`), charged like compile
    measured_hours: float = 0.0  # the paired windows' saving, claimed (gross) only when its interval excludes 0
    low_hours: float | None = None  # its 95% interval (`paired.claim`); None with fewer than 3 paired windows
    high_hours: float | None = None

    @property
    def unit(self) -> str:
        """The unit of this task's hours: GPU-hours or CPU core-hours."""
        return UNITS[self.device_kind]

    @property
    def within_noise(self) -> bool:
        """A saving was measured but not claimed: its interval holds zero (or there is none)."""
        return self.gross_hours == 0.0 and self.measured_hours != 0.0


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
    overhead_hours: float = 0.0


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
    overhead_hours: float = 0.0

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
        return DeviceTotals(device_kind, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0)

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
    """Everything a weekly report shows.

    `jobs`: the tasks saving most, up to `listed` per device kind (GPU first), by net hours,
    largest first; `bottom`: the tasks saving least, up to `listed` per device kind, lowest
    first, without those already in `jobs` (a small week lists every task in `jobs`). The
    totals, rollups and daily figures cover every task of the week. `held_out`: every job checked against
    its holdout runs (GPU first, nets furthest above their interval first); `after_check`: per device kind
    of the totals, the net after that check.
    """

    week: Week
    jobs: tuple[JobSavings, ...]
    rollups: tuple[Rollup, ...]
    totals: Totals
    daily: tuple[DailySavings, ...]
    attribution: str = ATTRIBUTION
    bottom: tuple[JobSavings, ...] = ()
    listed: int = LISTED_TASKS
    # The held-out check (telemetry.holdout): one per job checked, and the net after it per device kind.
    held_out: tuple[HeldOutCheck, ...] = ()
    after_check: tuple[CheckedNet, ...] = ()

    def net_after_check(self, device_kind: str) -> CheckedNet:
        """The net of one device kind after the held-out check (the net itself when no job of it was checked)."""
        for found in self.after_check:
            if found.device_kind == device_kind:
                return found
        net = self.totals.kind(device_kind).net_hours
        return CheckedNet(device_kind, net, 0, net)


def kind_order(device_kind: str) -> int:
    """GPU before CPU, wherever both are listed."""
    return 0 if device_kind == models.DeviceKind.GPU.value else 1


def _hours(device_seconds: float) -> float:
    return device_seconds / SECONDS_PER_HOUR


Medians = dict[tuple[int, str], float]


def speedup(baseline: float | None, stitched: float | None, gross: float) -> float | None:
    """baseline / stitched, or None when unknown, when nothing is claimed (`gross` 0: within noise) or when it
    disagrees in sign with `gross` (a speedup over 1 beside hours lost, or under 1 beside hours saved; issue 29
    saw "0.912x" with +0.0038 gross and "1.051x" with -0.000069). From the paired means it always agrees."""
    if baseline is None or not stitched or gross == 0.0:
        return None
    ratio = baseline / stitched
    if (ratio > 1.0 and gross < 0.0) or (ratio < 1.0 and gross > 0.0):
        return None
    return ratio


def step_figures(job_id: int, sums: paired.PairedSums, measured: float, medians: Medians) -> tuple[Any, Any]:
    """(baseline, stitched) seconds per step: the paired means of the stitched windows and the blocks around
    them when the task has paired windows, else the medians over windows (`medians`)."""
    baseline, stitched = paired.paired_means(sums, measured)
    if baseline is not None:
        return baseline, stitched
    return medians.get((job_id, "baseline"), medians.get((job_id, "reference"))), medians.get((job_id, "stitched"))


def _interval(found: paired.Claim, per_rank: int) -> tuple[float | None, float | None]:
    if found.low == -math.inf:
        return None, None
    return found.low * per_rank / SECONDS_PER_HOUR, found.high * per_rank / SECONDS_PER_HOUR


def job_savings(row: Any, medians: Medians) -> JobSavings:
    """A `task_weeks` row as the report's task figures; `medians` from savings_sql.task_medians."""
    devices = row.world_size * row.devices_per_rank
    sums = paired.PairedSums.of(row)
    found = paired.claim(sums, row.saved_seconds)
    baseline, stitched = step_figures(row.job_id, sums, row.saved_seconds, medians)
    gross = row.claimed_seconds * row.devices_per_rank / SECONDS_PER_HOUR
    low, high = _interval(found, row.devices_per_rank)
    compile_hours = _hours(row.compile_device_seconds)
    overhead_hours = _hours(row.overhead_device_seconds or 0.0)
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
        revert_reason=row.revert_reason,
        overhead_hours=overhead_hours,
        measured_hours=row.saved_seconds * row.devices_per_rank / SECONDS_PER_HOUR,
        low_hours=low,
        high_hours=high,
    )


def with_medians(connection: Connection, week: Week, rows: Sequence[Any]) -> list[JobSavings]:
    """The task figures of `rows` (task_weeks), their median step times read from their windows."""
    medians = savings_sql.task_medians(connection, week, [row.job_id for row in rows])
    return [job_savings(row, medians) for row in rows]


def _device_totals(row: Any) -> DeviceTotals:
    gross, compile_hours = _hours(row.gross_device_seconds), _hours(row.compile_device_seconds)
    overhead_hours = _hours(row.overhead_device_seconds or 0.0)
    return DeviceTotals(
        device_kind=row.device_kind,
        tasks=row.tasks,
        devices=row.devices,
        iterations=row.iterations,
        gross_hours=gross,
        compile_hours=compile_hours,
        net_hours=gross - compile_hours - overhead_hours,
        reverted_tasks=row.reverted_tasks,
        overhead_hours=overhead_hours,
    )


def _rollups(groups: Sequence[Any]) -> tuple[Rollup, ...]:
    result: list[Rollup] = []
    for dimension in ROLLUP_DIMENSIONS:
        found = [
            Rollup(dimension, row.key, **vars(_device_totals(row))) for row in groups if row.dimension == dimension
        ]
        result.extend(sorted(found, key=lambda r: (kind_order(r.device_kind), -r.net_hours, r.key)))
    return tuple(result)


def _reasons(groups: Sequence[Any]) -> tuple[RevertReason, ...]:
    merged: dict[str, tuple[int, int]] = {}
    for row in groups:
        if row.dimension == "reason":
            tasks, events = merged.get(row.key, (0, 0))
            merged[row.key] = (tasks + row.tasks, events + row.reverts)
    reasons = (RevertReason(reason, tasks, events) for reason, (tasks, events) in merged.items())
    return tuple(sorted(reasons, key=lambda r: (-r.tasks, -r.reverts, r.reason)))


def _totals(groups: Sequence[Any], jobs: int) -> Totals:
    fleet = sorted((row for row in groups if row.dimension == "fleet"), key=lambda row: kind_order(row.device_kind))
    tasks = sum(row.tasks for row in fleet)
    reverted = sum(row.reverted_tasks for row in fleet)
    return Totals(
        tasks=tasks,
        jobs=jobs,
        distributed_tasks=sum(row.distributed_tasks for row in fleet),
        iterations=sum(row.iterations for row in fleet),
        by_kind=tuple(_device_totals(row) for row in fleet),
        reverted_tasks=reverted,
        reverted_share=reverted / tasks if tasks else 0.0,
        revert_reasons=_reasons(groups),
    )


def _daily(groups: Sequence[Any], week: Week) -> tuple[DailySavings, ...]:
    seconds = {(row.key, row.device_kind): row.gross_device_seconds for row in groups if row.dimension == "day"}
    gpu, cpu = models.DeviceKind.GPU.value, models.DeviceKind.CPU.value
    labels = [day.isoformat() for day in week.days()]
    return tuple(
        DailySavings(day, _hours(seconds.get((label, gpu), 0.0)), _hours(seconds.get((label, cpu), 0.0)))
        for day, label in zip(week.days(), labels, strict=True)
    )


Listed = tuple[tuple[JobSavings, ...], tuple[JobSavings, ...]]


def _listed(connection: Connection, week: Week, kinds: Sequence[str], listed: int) -> Listed:
    """Per device kind, the `listed` tasks saving most, then the `listed` saving least (not already listed)."""
    top: list[Any] = []
    bottom: list[Any] = []
    for kind in kinds:
        best = rollup_sql.ranked_tasks(connection, week, kind, listed, top=True)
        shown = {row.job_id for row in best}
        worst = rollup_sql.ranked_tasks(connection, week, kind, listed, top=False)
        top += best
        bottom += [row for row in worst if row.job_id not in shown]
    jobs = with_medians(connection, week, [*top, *bottom])
    return tuple(jobs[: len(top)]), tuple(jobs[len(top) :])


def _compute(connection: Connection, week: Week, listed: int) -> WeeklyReport:
    groups = rollup_sql.week_groups(connection, week)
    totals = _totals(groups, rollup_sql.distinct_jobs(connection, week))
    top, bottom = _listed(connection, week, [kind.device_kind for kind in totals.by_kind], listed)
    checks = holdout.held_out_checks(connection, week)
    after = holdout.net_after_check({kind.device_kind: kind.net_hours for kind in totals.by_kind}, checks)
    return WeeklyReport(
        week,
        top,
        _rollups(groups),
        totals,
        _daily(groups, week),
        bottom=bottom,
        listed=listed,
        held_out=checks,
        after_check=after,
    )


def _require_schema(connection: Connection) -> None:
    missing = savings_sql.missing_tables(connection, savings_sql.REPORT_TABLES)
    if missing:
        raise database.DatabaseError(
            f"no telemetry schema (missing {', '.join(missing)}): run `stitchfleet db upgrade` first"
        )


@contextmanager
def opened(engine_or_url: Engine | str | None) -> Iterator[Connection]:
    """A connection to an engine or a URL (connected and disposed here), its schema checked first.

    SQLAlchemy's errors, raised inside the block too, become one DatabaseError line naming the database.
    """
    url = None if isinstance(engine_or_url, Engine) else database.resolve_url(engine_or_url)
    engine = engine_or_url if isinstance(engine_or_url, Engine) else database.connect(url)
    try:
        with engine.connect() as connection:
            _require_schema(connection)
            yield connection
    except SQLAlchemyError as err:
        target = url or engine.url.render_as_string(hide_password=True)
        raise database.DatabaseError(database.describe_failure(target, err)) from None
    finally:
        if engine is not engine_or_url:
            engine.dispose()


def _week(week: Week | str) -> Week:
    return parse_week(week) if isinstance(week, str) else week


def weekly_summary(engine_or_url: Engine | str | None, week: Week | str, *, listed: int = LISTED_TASKS) -> WeeklyReport:
    """The report of `week` (a Week or a label like 2026-W47) from an engine or a URL.

    Reads the aggregates only: O(groups + listed) rows. Raises WeekError for a bad label and
    DatabaseError (one clear line) when the database cannot be reached or holds no telemetry schema.
    """
    with opened(engine_or_url) as connection:
        return _compute(connection, _week(week), listed)


def week_tasks(engine_or_url: Engine | str | None, week: Week | str) -> Iterator[JobSavings]:
    """Every task of `week`, GPU first, by net hours saved, largest first; streamed in constant memory.

    A generator: the database is opened on the first item and closed when it is exhausted or
    closed. Tasks come off one cursor in batches; each batch's median step times are read from
    its tasks' windows on a second connection. Errors as `weekly_summary`.
    """
    chosen = _week(week)
    with opened(engine_or_url) as connection, connection.engine.connect() as lookups:
        batch: list[Any] = []
        for row in rollup_sql.streamed_tasks(connection, chosen):
            batch.append(row)
            if len(batch) == rollup_sql.STREAM_BATCH:
                yield from with_medians(lookups, chosen, batch)
                batch = []
        yield from with_medians(lookups, chosen, batch)
