"""A synthetic fleet week at production scale, for report benchmarks and demos.

Input: a `FleetSpec` (tasks, ISO week, seed, shapes of the distributions). Output: task plans
(`plan_tasks`: what each task is), their telemetry rows (`task_rows`: exactly what the plugin would
record), and `generate(url, spec)` which writes them in large batches (bulk loads, or every row
through `store.write_rows`), reporting progress. The same seed gives the same rows, ids and times
included.

The defaults follow the AStitch paper's production figures: 70,000 tasks a week; ranks 1-64 with
about 23% of tasks distributed, using about 56% of the GPU time; speedups 1.0-1.6x, mostly
1.05-1.3x; compile overhead of tens of seconds; a few percent of tasks reverted by the guard
(numeric mismatch, slowdown, NaN). One GPU per rank. Each rank records one baseline window,
then one window per `window_seconds` of training; a reverted task's windows after the revert run
the original ops (mode `reverted`, nothing saved).
"""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import Connection

from stitchfleet.telemetry import bulk_load, database, store
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.weeks import Week, parse_week

# (ranks, weight) among distributed tasks: small jobs dominate, a long tail reaches 64.
DISTRIBUTED_RANKS = ((2, 0.60), (4, 0.25), (8, 0.10), (16, 0.03), (32, 0.015), (64, 0.005))
# (model, median baseline step seconds): a step's time scales with the model.
MODELS = (
    ("resnet50", 0.18),
    ("bert-base", 0.25),
    ("bert-large", 0.55),
    ("transformer-nmt", 0.30),
    ("dien", 0.08),
    ("crnn-ocr", 0.12),
    ("vit-b16", 0.35),
    ("wide-deep", 0.05),
)
NAMESPACES = ("search", "ads", "vision", "nlp", "speech", "recsys", "research", "platform")
TEAMS = ("ranking", "ads-ml", "perception", "language", "asr", "recommend", "lab", "infra")
# (reason, weight, when it strikes): NaN at once, mismatches on a check step, slowdowns at a re-baseline.
REVERT_REASONS = (("numeric_mismatch", 0.55), ("slowdown", 0.30), ("nan", 0.15))
BASELINE_ITERATIONS = 20


@dataclass(frozen=True)
class FleetSpec:
    """What to generate; the defaults are the paper's scale."""

    tasks: int = 70_000
    week: Week = field(default_factory=lambda: parse_week("2026-W47"))
    seed: int = 0
    distributed_share: float = 0.23
    reverted_share: float = 0.04
    window_seconds: float = 1800.0
    max_windows: int = 48
    cluster: str = "synthetic"

    def __post_init__(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"FleetSpec: tasks={self.tasks}: expected >= 1")
        for name in ("distributed_share", "reverted_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"FleetSpec: {name}={getattr(self, name)}: expected a share between 0 and 1")
        if self.window_seconds <= 0 or self.max_windows < 1:
            raise ValueError("FleetSpec: window_seconds must be > 0 and max_windows >= 1")


@dataclass(frozen=True)
class TaskPlan:
    """One synthetic task: who, how big, how long, how fast, and how it ends."""

    key: r.JobKey
    team: str
    model: str
    ranks: int
    started_at: dt.datetime
    duration_seconds: float
    baseline_step_seconds: float
    speedup: float
    compile_seconds: float
    revert_reason: str
    revert_window: int
    windows: int

    @property
    def gpu_seconds(self) -> float:
        """GPU time of the task (one GPU per rank)."""
        return self.ranks * self.duration_seconds


def _ranks(rng: random.Random, spec: FleetSpec) -> int:
    if rng.random() >= spec.distributed_share:
        return 1
    sizes, weights = [size for size, _ in DISTRIBUTED_RANKS], [weight for _, weight in DISTRIBUTED_RANKS]
    return rng.choices(sizes, weights)[0]


def _speedup(rng: random.Random, reason: str) -> float:
    if reason == "slowdown":
        return rng.uniform(0.85, 0.99)
    # 1 + 0.6 * Beta(2.2, 6): within 1.0-1.6, mean ~1.16, mostly 1.05-1.3.
    return 1.0 + 0.6 * rng.betavariate(2.2, 6.0)


def _revert_reason(rng: random.Random, spec: FleetSpec) -> str:
    if rng.random() >= spec.reverted_share:
        return ""
    reasons, weights = [reason for reason, _ in REVERT_REASONS], [weight for _, weight in REVERT_REASONS]
    return rng.choices(reasons, weights)[0]


def _plan(rng: random.Random, spec: FleetSpec, index: int) -> TaskPlan:
    model, step = rng.choice(MODELS)
    group = rng.randrange(len(NAMESPACES))
    reason = _revert_reason(rng, spec)
    duration = min(max(rng.lognormvariate(math.log(5400.0), 1.0), 600.0), 86_400.0)
    windows = min(spec.max_windows, max(1, math.ceil(duration / spec.window_seconds)))
    revert_window = {"": windows, "nan": 0, "slowdown": min(2, windows)}.get(reason, rng.randrange(windows))
    return TaskPlan(
        key=r.JobKey(
            spec.cluster, NAMESPACES[group], f"{model}-{index % 9_000:04d}", uuid.UUID(int=rng.getrandbits(128)).hex
        ),
        team=TEAMS[group],
        model=model,
        ranks=_ranks(rng, spec),
        started_at=spec.week.start + dt.timedelta(seconds=rng.uniform(0, 7 * 86_400 - 1)),
        duration_seconds=duration,
        baseline_step_seconds=step * rng.lognormvariate(0.0, 0.35),
        speedup=_speedup(rng, reason),
        compile_seconds=min(max(rng.lognormvariate(math.log(35.0), 0.5), 8.0), 240.0),
        revert_reason=reason,
        revert_window=revert_window,
        windows=windows,
    )


def plan_tasks(spec: FleetSpec) -> Iterator[TaskPlan]:
    """The spec's tasks, drawn from one generator seeded with `spec.seed`."""
    rng = random.Random(spec.seed)
    for index in range(spec.tasks):
        yield _plan(rng, spec, index)


class WindowFigures(NamedTuple):
    """A step window's figures in `StepWindow`'s field order, its job aside (bulk loads take tuples)."""

    rank: int
    window_index: int
    first_step: int
    last_step: int
    iterations: int
    mode: str
    step_seconds_sum: float
    baseline_step_seconds: float | None
    saved_seconds: float
    recorded_at: dt.datetime


def _window(plan: TaskPlan, rank: int, index: int, noise: float) -> WindowFigures:
    """Window `index` (0: baseline) of `rank`; stitched until the revert window, then reverted."""
    base = plan.baseline_step_seconds
    chunk = plan.duration_seconds / plan.windows
    if index == 0:
        iterations, mode, step = BASELINE_ITERATIONS, "baseline", base
    else:
        mode = "stitched" if index <= plan.revert_window else "reverted"
        step = base / plan.speedup if mode == "stitched" else base
        iterations = max(1, int(chunk / step))
    total = iterations * step * noise
    saved = iterations * base - total if mode == "stitched" else 0.0
    warmup = BASELINE_ITERATIONS * base
    ended = plan.started_at + dt.timedelta(seconds=plan.compile_seconds + warmup + chunk * index)
    first = 0 if index == 0 else BASELINE_ITERATIONS + (index - 1) * iterations
    reference = None if index == 0 else base
    return WindowFigures(rank, index, first, first + iterations - 1, iterations, mode, total, reference, saved, ended)


def _revert_event(plan: TaskPlan, rng: random.Random) -> r.Event:
    # Right after the last stitched window: the guard reverts, the next window runs the original ops.
    offset = plan.compile_seconds + BASELINE_ITERATIONS * plan.baseline_step_seconds
    when = plan.started_at + dt.timedelta(seconds=offset + plan.duration_seconds / plan.windows * plan.revert_window)
    ratio = {"numeric_mismatch": rng.uniform(12.0, 80.0), "slowdown": None, "nan": None}[plan.revert_reason]
    return r.Event(
        plan.key,
        "revert",
        rank=0,
        cluster_fingerprint=f"fp-{rng.randrange(400):04x}",
        reason=plan.revert_reason,
        detail=f"synthetic {plan.revert_reason} revert",
        error_ratio=ratio,
        occurred_at=when,
        uuid=str(uuid.UUID(int=rng.getrandbits(128))),
    )


@dataclass(frozen=True)
class TaskFigures:
    """Everything one task records, its windows as plain tuples (what a bulk load takes)."""

    plan: TaskPlan
    windows: list[WindowFigures]
    revert: r.Event | None


def task_figures(plan: TaskPlan, rng: random.Random) -> TaskFigures:
    """Every rank's windows of `plan`, then its revert event when it has one (drawn in that order)."""
    windows = [
        _window(plan, rank, index, rng.uniform(0.98, 1.02))
        for rank in range(plan.ranks)
        for index in range(plan.windows + 1)
    ]
    return TaskFigures(plan, windows, _revert_event(plan, rng) if plan.revert_reason else None)


def _status(plan: TaskPlan) -> str:
    return "reverted" if plan.revert_reason else "finished"


def _finished_at(plan: TaskPlan) -> dt.datetime:
    return plan.started_at + dt.timedelta(seconds=plan.compile_seconds + plan.duration_seconds)


def rows_of(figures: TaskFigures) -> list[r.Row]:
    """The task's telemetry rows: start, compile, every rank's windows, the revert, the end."""
    plan = figures.plan
    start = r.JobStarted(
        plan.key, 0, plan.team, plan.model, f"{plan.key.job_name}-0", plan.ranks, 1, "H200", plan.started_at
    )
    rows: list[r.Row] = [start, r.JobCompiled(plan.key, 0, plan.compile_seconds)]
    rows += [r.StepWindow(plan.key, *window) for window in figures.windows]
    if figures.revert is not None:
        rows.append(figures.revert)
    return [*rows, r.JobFinished(plan.key, _status(plan), plan.revert_reason, ended_at=_finished_at(plan))]


def task_rows(plan: TaskPlan, rng: random.Random) -> list[r.Row]:
    """Everything `plan` records: start, compile, every rank's windows, the revert, the end."""
    return rows_of(task_figures(plan, rng))


def fleet_figures(spec: FleetSpec) -> Iterator[TaskFigures]:
    """Every task's figures, in order; deterministic for `spec.seed`."""
    noise = random.Random(spec.seed + 1)
    for plan in plan_tasks(spec):
        yield task_figures(plan, noise)


def fleet_tasks(spec: FleetSpec) -> Iterator[tuple[TaskPlan, list[r.Row]]]:
    """Every task with its rows, in order; deterministic for `spec.seed`."""
    for figures in fleet_figures(spec):
        yield figures.plan, rows_of(figures)


def fleet_rows(spec: FleetSpec) -> Iterator[r.Row]:
    """Every row of the fleet, task after task."""
    for _, rows in fleet_tasks(spec):
        yield from rows


Progress = Callable[[int, int], None]


def _job_values(plan: TaskPlan) -> dict[str, Any]:
    """The task's `jobs` row as the store would merge it from its start, compile and end rows."""
    return {
        "cluster": plan.key.cluster,
        "namespace": plan.key.namespace,
        "job_name": plan.key.job_name,
        "job_uid": plan.key.job_uid,
        "team": plan.team,
        "model": plan.model,
        "pod_name": f"{plan.key.job_name}-0",
        "world_size": plan.ranks,
        "gpus_per_rank": 1,
        "gpu_type": "H200",
        "started_at": plan.started_at,
        "ended_at": _finished_at(plan),
        "status": _status(plan),
        "reason": plan.revert_reason,
        "compile_seconds": plan.compile_seconds,
        "overhead_seconds": 0.0,  # synthetic tasks record no JobOverhead row
    }


def _event_values(event: r.Event) -> dict[str, Any]:
    names = ("uuid", "rank", "step", "kind", "cluster_fingerprint", "reason", "detail", "passed")
    return {name: getattr(event, name) for name in names} | {
        "max_abs_error": event.max_abs_error,
        "error_ratio": event.error_ratio,
        "occurred_at": event.occurred_at,
    }


def _bulk_task(figures: TaskFigures) -> bulk_load.BulkTask:
    events = [] if figures.revert is None else [_event_values(figures.revert)]
    return bulk_load.BulkTask(_job_values(figures.plan), figures.windows, events)


def _rows_count(figures: TaskFigures) -> int:
    # Start, compile and end, the windows, the revert: as many rows as the upsert path writes.
    return 3 + len(figures.windows) + (figures.revert is not None)


def _write_batch(connection: Connection, batch: list[TaskFigures], bulk: bool) -> int:
    if bulk:
        bulk_load.load(connection, [_bulk_task(figures) for figures in batch])
        return sum(_rows_count(figures) for figures in batch)
    return store.write_rows(connection, [row for figures in batch for row in rows_of(figures)])


def generate(
    url: str, spec: FleetSpec, *, batch_rows: int = 50_000, bulk: bool = True, progress: Progress | None = None
) -> int:
    """Writes the fleet into `url` (schema migrated first); returns the rows written.

    Tasks go in transactions of about `batch_rows` rows (a task's rows never straddle two). With
    `bulk` (the default) each batch goes through `bulk_load` (jobs rows in one statement, windows
    by COPY on PostgreSQL, aggregates from memory; tasks already stored are skipped); without it,
    every row goes through `store.write_rows`, as a recorder writes them: the same table content,
    an order of magnitude slower. `progress(tasks_done, tasks)` is called after each batch.
    """
    database.upgrade(url)
    engine = database.connect(url)
    written, done, batch, size = 0, 0, list[TaskFigures](), 0
    try:
        for figures in fleet_figures(spec):
            batch.append(figures)
            done, size = done + 1, size + _rows_count(figures)
            if size >= batch_rows or done == spec.tasks:
                with engine.begin() as connection:
                    written += _write_batch(connection, batch, bulk)
                batch, size = [], 0
                if progress is not None:
                    progress(done, spec.tasks)
    finally:
        engine.dispose()
    return written
