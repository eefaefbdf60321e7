"""Incremental rollups on the store's write path: refreshes `task_weeks` and `week_rollups`.

Input: a Connection inside the writer's transaction and the ids of the tasks (`jobs` rows) whose
rows were just written; optionally those tasks' windows and revert events, when the writer holds
them whole (the synthetic generator). Output: each task's `task_weeks` rows recomputed from its
jobs row, windows and revert events (`task_weeks.task_week_rows`), and `week_rollups` moved by the
difference between the task's new rows and its old ones.

Recomputing a whole task makes replays, late rows, duplicates and reverts after the fact
idempotent and independent of arrival order; adding differences keeps a weekly report at
O(groups) rows. On PostgreSQL the tasks' jobs rows are locked first (FOR UPDATE, in id order),
so two writers of one task refresh it one after the other and the second sees the first's rows;
rollup rows are then updated in key order, so writers never wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, and_, bindparam, delete, insert, select

from stitchfleet.telemetry import models
from stitchfleet.telemetry import task_weeks as tw
from stitchfleet.telemetry.database import dialect_insert
from stitchfleet.telemetry.kinds import EventKind

JOBS: Table = models.Job.__table__  # type: ignore[assignment]
WINDOWS: Table = models.StepWindow.__table__  # type: ignore[assignment]
EVENTS: Table = models.Event.__table__  # type: ignore[assignment]
TASK_WEEKS: Table = models.TaskWeek.__table__  # type: ignore[assignment]
ROLLUPS: Table = models.WeekRollup.__table__  # type: ignore[assignment]
ROLLUP_KEY = ("week_start", "dimension", "key", "device_kind")
# Tasks per refresh round: their ids go in IN (...) lists, well under the bound-parameter limits.
CHUNK = 2000

# What a writer that holds tasks whole passes instead of having them read back: per job id,
# its windows and revert events.
Known = Mapping[int, tuple[Sequence[tw.WindowFacts], Sequence[tw.RevertFacts]]]


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    return (ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK))


def _lock(connection: Connection, ids: Sequence[int]) -> None:
    # SQLite has one writer at a time; PostgreSQL writers of a task must take turns.
    if connection.dialect.name == "postgresql":
        connection.execute(select(JOBS.c.id).where(JOBS.c.id.in_(ids)).order_by(JOBS.c.id).with_for_update())


def _jobs(connection: Connection, ids: Sequence[int]) -> list[tw.JobFacts]:
    columns = [JOBS.c[name] for name in tw.JobFacts._fields]
    rows = connection.execute(select(*columns).where(JOBS.c.id.in_(ids)))
    # Columns written before they had defaults may be NULL: empty text and no compile time.
    return [
        tw.JobFacts(
            **dict(row._mapping)
            | {
                "team": row.team or "",
                "model": row.model or "",
                "device_kind": row.device_kind or "",
                "reason": row.reason or "",
                "compile_seconds": row.compile_seconds or 0.0,
            }
        )
        for row in rows
    ]


def _windows(connection: Connection, ids: Sequence[int]) -> dict[int, list[tw.WindowFacts]]:
    columns = [WINDOWS.c.job_id, *(WINDOWS.c[name] for name in tw.WindowFacts._fields)]
    found: dict[int, list[tw.WindowFacts]] = {}
    for row in connection.execute(select(*columns).where(WINDOWS.c.job_id.in_(ids))):
        found.setdefault(row[0], []).append(tw.WindowFacts(*row[1:]))
    return found


def _reverts(connection: Connection, ids: Sequence[int]) -> dict[int, list[tw.RevertFacts]]:
    query = select(EVENTS.c.job_id, EVENTS.c.reason, EVENTS.c.occurred_at, EVENTS.c.id).where(
        EVENTS.c.kind == EventKind.REVERT.value, EVENTS.c.job_id.in_(ids)
    )
    found: dict[int, list[tw.RevertFacts]] = {}
    for job, reason, occurred_at, event in connection.execute(query):
        found.setdefault(job, []).append(tw.RevertFacts(reason or "", occurred_at, event))
    return found


def _old_rows(connection: Connection, ids: Sequence[int]) -> list[dict[str, Any]]:
    rows = connection.execute(select(TASK_WEEKS).where(TASK_WEEKS.c.job_id.in_(ids)))
    return [dict(row._mapping) for row in rows]


def _replace_rows(connection: Connection, ids: Sequence[int], had_rows: bool, rows: list[dict[str, Any]]) -> None:
    if had_rows:
        connection.execute(delete(TASK_WEEKS).where(TASK_WEEKS.c.job_id.in_(ids)))
    if rows:
        connection.execute(insert(TASK_WEEKS), rows)


def _apply(connection: Connection, moved: list[tuple[tw.GroupKey, list[float]]]) -> None:
    """Adds each group's difference into week_rollups; drops groups no task belongs to any more."""
    if not moved:
        return
    values = [
        dict(zip(ROLLUP_KEY, key, strict=True)) | dict(zip(tw.VECTOR_FIELDS, vector, strict=True))
        for key, vector in moved
    ]
    stmt = dialect_insert(connection, ROLLUPS)
    update = {name: ROLLUPS.c[name] + stmt.excluded[name] for name in tw.VECTOR_FIELDS}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(ROLLUP_KEY), set_=update), values)
    # Only a group that lost a task can have none left.
    emptied = [dict(zip(ROLLUP_KEY, key, strict=True)) for key, vector in moved if vector[0] < 0]
    if emptied:
        match = and_(*(ROLLUPS.c[name] == bindparam(f"b_{name}") for name in ROLLUP_KEY), ROLLUPS.c.tasks == 0)
        connection.execute(
            delete(ROLLUPS).where(match), [{f"b_{name}": value for name, value in key.items()} for key in emptied]
        )


def _refresh_chunk(connection: Connection, ids: Sequence[int], known: Known | None) -> int:
    _lock(connection, ids)
    jobs = _jobs(connection, ids)
    unknown = [job.id for job in jobs if known is None or job.id not in known]
    windows = _windows(connection, unknown) if unknown else {}
    reverts = _reverts(connection, unknown) if unknown else {}
    for job, (job_windows, job_reverts) in (known or {}).items():
        windows[job], reverts[job] = list(job_windows), list(job_reverts)
    old = _old_rows(connection, ids)
    new = [row for job in jobs for row in tw.task_week_rows(job, windows.get(job.id, ()), reverts.get(job.id, ()))]
    moved: dict[tw.GroupKey, list[float]] = {}
    tw.add_into(moved, old, -1)
    tw.add_into(moved, new, 1)
    _replace_rows(connection, ids, bool(old), new)
    _apply(connection, tw.changed(moved))
    return len(new)


def refresh(connection: Connection, job_ids: Iterable[int], known: Known | None = None) -> int:
    """Recomputes the task-weeks of `job_ids` and moves the rollups; returns the task-weeks written.

    `known` gives, for some of the tasks, all their windows and revert events (a writer that
    has just inserted whole tasks); the others are read back from the database.
    """
    ids = sorted(set(job_ids))
    return sum(_refresh_chunk(connection, chunk, known) for chunk in _chunks(ids))


def rebuild(connection: Connection) -> int:
    """Recomputes every task's task-weeks and every rollup from scratch; returns the task-weeks."""
    connection.execute(delete(ROLLUPS))
    connection.execute(delete(TASK_WEEKS))
    ids = list(connection.execute(select(JOBS.c.id).order_by(JOBS.c.id)).scalars())
    return refresh(connection, ids)
