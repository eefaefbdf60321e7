"""A task's weekly figures and what they add to the week's rollups: pure computation, no SQL.

Input: one task's facts (its `jobs` row), its `task_weeks` rows so far, the changes to its step
windows since (each window's old version, if any, and its new one) and its revert events, as plain
tuples. Output: the task's new `task_weeks` rows (dicts, one per ISO week the task is active in)
and, for such a row, what it adds to the `week_rollups` groups. Window sums move by the changes
only, so a write costs what it writes, never what the task already holds. The accounting rules are
those of `savings` (see its module docstring): a window counts in the week holding its
`recorded_at`; a task is active in a week when it has a window in it or started in it; compile
and plugin overhead are charged to the week of its start (no recorded start: the week of its first window);
device kind and devices per rank are what the ranks measured, else what was declared; a task is
reverted when any revert event names it, or its status says so. Median step times are not kept
here (a median cannot move by differences): reports read them from the windows of the tasks they list.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stitchfleet.telemetry import paired
from stitchfleet.telemetry.kinds import DeviceKind, JobStatus

UNSPECIFIED = "unspecified"
# Joins cluster, namespace and job name into one `job` rollup key; no Kubernetes name holds it.
KEY_SEPARATOR = "\x1f"
DAYS = 7
VECTOR_FIELDS = (
    "tasks",
    "distributed_tasks",
    "reverted_tasks",
    "reverts",
    "devices",
    "windows",
    "iterations",
    "gross_device_seconds",
    "compile_device_seconds",
    "overhead_device_seconds",
)
Vector = tuple[int, int, int, int, int, int, int, float, float, float]
GroupKey = tuple[dt.date, str, str, str]  # week start, dimension, key, device kind
PAIRED_FIELDS = paired.FIELDS


class JobFacts(NamedTuple):
    """The columns of a `jobs` row that the figures depend on."""

    id: int
    cluster: str
    namespace: str
    job_name: str
    job_uid: str
    team: str
    model: str
    world_size: int
    gpus_per_rank: int
    device_kind: str
    devices_per_rank: int | None
    started_at: dt.datetime | None
    status: str
    reason: str
    compile_seconds: float
    overhead_seconds: float = 0.0  # the plugin's own cost beyond the user's graph (slowest rank): rows.JobOverhead


class WindowFacts(NamedTuple):
    """The columns of a `step_windows` row that the sums depend on."""

    rank: int
    recorded_at: dt.datetime
    iterations: int
    saved_seconds: float
    mode: str
    step_seconds_sum: float
    baseline_step_seconds: float | None


class RevertFacts(NamedTuple):
    """A revert event: its reason label, when, and its id (which breaks ties of time)."""

    reason: str
    occurred_at: dt.datetime
    id: int


# A window written: its version before (None when new) and the version written.
Change = tuple[WindowFacts | None, WindowFacts]


def week_start(instant: dt.datetime) -> dt.date:
    """The Monday (UTC) of the ISO week holding an aware `instant`."""
    day = (instant if instant.tzinfo is dt.UTC else instant.astimezone(dt.UTC)).date()
    return day - dt.timedelta(days=day.weekday())


def accounting_kind(job: JobFacts) -> str:
    """GPU or CPU: measured by the ranks, else a GPU task when it declared GPUs."""
    if job.device_kind:
        return job.device_kind
    return DeviceKind.GPU.value if job.gpus_per_rank > 0 else DeviceKind.CPU.value


def accounting_devices_per_rank(job: JobFacts, kind: str) -> int:
    """Devices one rank uses: measured, else the declared GPUs (GPU) or one core (CPU)."""
    if job.devices_per_rank is not None:
        return job.devices_per_rank
    return job.gpus_per_rank if kind == DeviceKind.GPU.value else 1


@dataclass
class _Week:
    """One task's sums over its windows of one week: what the windows contribute to its row."""

    windows: int = 0
    saved: float = 0.0
    # Iterations per rank (JSON keys are text): ranks step in lockstep, the busiest one counts.
    ranks: dict[str, int] = field(default_factory=dict)
    daily: list[float] = field(default_factory=lambda: [0.0] * DAYS)
    paired: list[float] = field(default_factory=lambda: [0.0] * len(PAIRED_FIELDS))  # `paired.PairedSums`

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> _Week:
        paired = [row[name] or 0 for name in PAIRED_FIELDS]
        return cls(
            row["windows"], row["saved_seconds"], dict(row["rank_iterations"]), list(row["daily_saved_seconds"]), paired
        )

    def add(self, window: WindowFacts, day: int, sign: int) -> None:
        self.windows += sign
        if self.windows == 0:  # no window left: exact zeros, not what adding and taking away leaves
            self.saved, self.ranks, self.daily = 0.0, {}, [0.0] * DAYS
            self.paired = [0.0] * len(PAIRED_FIELDS)
            return
        self.saved += sign * window.saved_seconds
        figures = window.mode, window.iterations, window.step_seconds_sum, window.baseline_step_seconds
        for index, value in enumerate(paired.contribution(*figures, window.saved_seconds)):
            self.paired[index] += sign * value
        self.daily[day] += sign * window.saved_seconds
        rank = str(window.rank)
        left = self.ranks.get(rank, 0) + sign * window.iterations
        if left:
            self.ranks[rank] = left
        else:
            self.ranks.pop(rank, None)


def _day(instant: dt.datetime) -> dt.date:
    return (instant if instant.tzinfo is dt.UTC else instant.astimezone(dt.UTC)).date()


def _apply(weeks: dict[dt.date, _Week], changes: Iterable[Change]) -> None:
    """Moves each changed window out of its old version's week and into its new version's."""
    for old, new in changes:
        for window, sign in ((old, -1), (new, 1)):
            if window is None:
                continue
            day = _day(window.recorded_at)
            start = day - dt.timedelta(days=day.weekday())
            weeks.setdefault(start, _Week()).add(window, day.weekday(), sign)


def revert_outcome(job: JobFacts, reverts: Sequence[RevertFacts]) -> tuple[str, dict[str, int]]:
    """The task's revert label ("" when not reverted) and its revert events per reason label.

    The label is the reason of its earliest revert event; a task reverted by its status alone
    counts under its status reason, with no event.
    """
    if reverts:
        first = min(reverts, key=lambda event: (event.occurred_at, event.id))
        counts: dict[str, int] = {}
        for event in reverts:
            label = event.reason or UNSPECIFIED
            counts[label] = counts.get(label, 0) + 1
        return first.reason or UNSPECIFIED, counts
    if job.status == JobStatus.REVERTED.value:
        label = job.reason or UNSPECIFIED
        return label, {label: 0}
    return "", {}


def _identity(job: JobFacts, reverts: Sequence[RevertFacts]) -> dict[str, Any]:
    kind = accounting_kind(job)
    label, counts = revert_outcome(job, reverts)
    return {
        "job_id": job.id,
        "cluster": job.cluster,
        "namespace": job.namespace,
        "job_name": job.job_name,
        "job_uid": job.job_uid,
        "team": job.team,
        "model": job.model,
        "world_size": job.world_size,
        "device_kind": kind,
        "devices_per_rank": accounting_devices_per_rank(job, kind),
        "status": job.status,
        "revert_reason": label,
        "reverts": counts,
    }


def task_week_rows(
    job: JobFacts,
    old_rows: Iterable[Mapping[str, Any]],
    changes: Iterable[Change],
    reverts: Sequence[RevertFacts],
) -> list[dict[str, Any]]:
    """The task's `task_weeks` rows after `changes` to its windows: a row per week with a window or holding its start.

    `old_rows` are the task's rows before (none for a new task); `changes` are (old version or
    None, new version) of each window written since; `reverts` are all its revert events. The
    window sums move by the changes only: a write costs what it writes, not what the task holds.
    """
    weeks = {row["week_start"]: _Week.of(row) for row in old_rows}
    _apply(weeks, changes)
    started = week_start(job.started_at) if job.started_at is not None else None
    if started is not None:
        weeks.setdefault(started, _Week())
    with_windows = [start for start, sums in weeks.items() if sums.windows > 0]
    # Compile and plugin overhead go to the week of the start, else to the week of the first window.
    charged = started if started is not None else min(with_windows, default=None)
    identity = _identity(job, reverts)
    per_rank, devices = identity["devices_per_rank"], job.world_size * identity["devices_per_rank"]
    rows = []
    for start, sums in sorted(weeks.items()):
        if sums.windows <= 0 and start != started:
            continue
        compile_device_seconds = job.compile_seconds * devices if start == charged else 0.0
        overhead_device_seconds = job.overhead_seconds * devices if start == charged else 0.0
        figures = paired.PairedSums.made(sums.paired)
        claimed = paired.claim(figures, sums.saved).claimed
        rows.append(
            identity
            | figures.values()
            | {
                "week_start": start,
                "windows": sums.windows,
                "iterations": max(sums.ranks.values(), default=0),
                "rank_iterations": sums.ranks,
                "saved_seconds": sums.saved,
                "claimed_seconds": claimed,
                "compile_device_seconds": compile_device_seconds,
                "overhead_device_seconds": overhead_device_seconds,
                "net_device_seconds": claimed * per_rank - compile_device_seconds - overhead_device_seconds,
                "daily_saved_seconds": sums.daily,
            }
        )
    return rows


def job_key(row: Mapping[str, Any]) -> str:
    """The `job` rollup key of a task: cluster, namespace and job name."""
    return KEY_SEPARATOR.join((row["cluster"], row["namespace"], row["job_name"]))


def contributions(row: Mapping[str, Any]) -> Iterator[tuple[GroupKey, Vector]]:
    """What one `task_weeks` row adds to each `week_rollups` group it belongs to."""
    week, kind = row["week_start"], row["device_kind"]
    per_rank = row["devices_per_rank"]
    devices = row["world_size"] * per_rank
    reverted = 1 if row["revert_reason"] else 0
    task: Vector = (
        1,
        1 if row["world_size"] > 1 else 0,
        reverted,
        0,
        devices,
        row["windows"],
        row["iterations"],
        row["claimed_seconds"] * per_rank,
        row["compile_device_seconds"],
        row["overhead_device_seconds"],
    )
    yield (week, "fleet", "", kind), task
    for dimension in ("namespace", "team", "model"):
        yield (week, dimension, row[dimension], kind), task
    yield (week, "job", job_key(row), ""), task
    for label, events in row["reverts"].items():
        yield (week, "reason", label, kind), (1, 0, 1, events, 0, 0, 0, 0.0, 0.0, 0.0)
    share = 1.0 if row["claimed_seconds"] else 0.0  # a saving within noise is claimed on no day either
    for offset, measured in enumerate(row["daily_saved_seconds"]):
        saved = measured * share
        if saved != 0.0:
            day = (week + dt.timedelta(days=offset)).isoformat()
            yield (week, "day", day, kind), (1, 0, 0, 0, 0, 0, 0, saved * per_rank, 0.0, 0.0)


def add_into(totals: dict[GroupKey, list[float]], rows: Iterable[Mapping[str, Any]], sign: int) -> None:
    """Adds (sign 1) or takes away (sign -1) the contributions of `rows` into `totals`."""
    for key, vector in (item for row in rows for item in contributions(row)):
        found = totals.get(key)
        if found is None:
            totals[key] = [sign * value for value in vector]
        else:
            for index, value in enumerate(vector):
                found[index] += sign * value


def changed(totals: Mapping[GroupKey, list[float]]) -> list[tuple[GroupKey, list[float]]]:
    """The groups whose sums moved, in key order (the order writers lock rollup rows in)."""
    return sorted(((key, vector) for key, vector in totals.items() if any(vector)), key=lambda item: item[0])
