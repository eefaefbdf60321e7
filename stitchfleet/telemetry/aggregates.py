"""Incremental rollups on the store's write path: refreshes `task_weeks` and `week_rollups`.

Input: a Connection inside the writer's transaction, the ids of the tasks (`jobs` rows) whose
rows were just written, and the windows written: each one's stored version before the write (None
when new) and its new version. Output: each task's `task_weeks` rows moved by those window changes
and re-derived from its jobs row and revert events (`task_weeks.task_week_rows`), and
`week_rollups` moved by the difference between the task's new rows and its old ones.

A write costs what it writes: the window sums move by differences, and what depends on the whole
task (its device kind, status, revert reason, the week charged with its compile) is re-derived
from its small jobs row, its revert events and its few task_weeks rows. Replays change nothing
(a window identical to its stored version is no change), late rows and reverts after the fact
move the sums like any other, in any order. On PostgreSQL a writer locks its tasks' jobs rows
(FOR UPDATE, in id order) before it reads the stored windows, so two writers of one task take
turns and the second moves the sums from the first's rows; rollup rows are updated in key order,
so writers never wait on each other in a cycle. `rebuild` recomputes everything from scratch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import JSON, Connection, Table, and_, bindparam, delete, insert, select, tuple_

from stitchfleet.telemetry import models
from stitchfleet.telemetry import task_weeks as tw
from stitchfleet.telemetry.database import copy_rows, dialect_insert
from stitchfleet.telemetry.kinds import EventKind

JOBS: Table = models.Job.__table__  # type: ignore[assignment]
WINDOWS: Table = models.StepWindow.__table__  # type: ignore[assignment]
EVENTS: Table = models.Event.__table__  # type: ignore[assignment]
TASK_WEEKS: Table = models.TaskWeek.__table__  # type: ignore[assignment]
ROLLUPS: Table = models.WeekRollup.__table__  # type: ignore[assignment]
T = TypeVar("T")
ROLLUP_KEY = ("week_start", "dimension", "key", "device_kind")
# Tasks per refresh round: their ids go in IN (...) lists, well under the bound-parameter limits.
CHUNK = 2000
# Task-weeks written at once from which PostgreSQL gets them by COPY rather than an executemany.
COPY_FROM = 200


def _chunks(items: Sequence[T]) -> Iterable[Sequence[T]]:
    return (items[start : start + CHUNK] for start in range(0, len(items), CHUNK))


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
                "overhead_seconds": row.overhead_seconds or 0.0,
            }
        )
        for row in rows
    ]


def _windows(connection: Connection, ids: Sequence[int]) -> dict[int, list[tw.Change]]:
    """Every window of the tasks `ids`, as new windows (a rebuild from scratch)."""
    columns = [WINDOWS.c.job_id, *(WINDOWS.c[name] for name in tw.WindowFacts._fields)]
    found: dict[int, list[tw.Change]] = {}
    for row in connection.execute(select(*columns).where(WINDOWS.c.job_id.in_(ids))):
        found.setdefault(row[0], []).append((None, tw.WindowFacts(*row[1:])))
    return found


WindowKey = tuple[int, int, int]  # job id, rank, window index


def stored_windows(connection: Connection, keys: Iterable[WindowKey]) -> dict[WindowKey, tw.WindowFacts]:
    """The stored versions of the windows `keys` (those that exist), read before a writer replaces them."""
    wanted = list(keys)
    names = ("job_id", "rank", "window_index")
    columns = [*(WINDOWS.c[name] for name in names), *(WINDOWS.c[name] for name in tw.WindowFacts._fields)]
    found: dict[WindowKey, tw.WindowFacts] = {}
    for chunk in _chunks(wanted):
        query = select(*columns).where(tuple_(*(WINDOWS.c[name] for name in names)).in_(chunk))
        found |= {(row[0], row[1], row[2]): tw.WindowFacts(*row[3:]) for row in connection.execute(query)}
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
    if len(rows) >= COPY_FROM and connection.dialect.name == "postgresql":
        # Many rows (a bulk load, a rebuild): COPY, JSON columns as their text.
        columns = [column.name for column in TASK_WEEKS.columns]
        as_json = {column.name for column in TASK_WEEKS.columns if isinstance(column.type, JSON)}
        values = ([json.dumps(row[name]) if name in as_json else row[name] for name in columns] for row in rows)
        copy_rows(connection, "task_weeks", columns, values)
    elif rows:
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


def lock(connection: Connection, job_ids: Iterable[int]) -> None:
    """Locks the tasks' jobs rows for the rest of the transaction (PostgreSQL), in id order.

    A writer takes them before it reads the windows it is about to replace, so two writers of
    one task take turns: the second sees the first's rows and moves the sums from there.
    SQLite needs nothing: it has one writer at a time.
    """
    ids = sorted(set(job_ids))
    if connection.dialect.name == "postgresql":
        for chunk in _chunks(ids):
            connection.execute(select(JOBS.c.id).where(JOBS.c.id.in_(chunk)).order_by(JOBS.c.id).with_for_update())


Changes = Mapping[int, Sequence[tw.Change]]


def _refresh_chunk(connection: Connection, ids: Sequence[int], changes: Changes) -> int:
    jobs = _jobs(connection, ids)
    reverts = _reverts(connection, ids)
    old = _old_rows(connection, ids)
    old_by_job: dict[int, list[dict[str, Any]]] = {}
    for row in old:
        old_by_job.setdefault(row["job_id"], []).append(row)
    new = [
        row
        for job in jobs
        for row in tw.task_week_rows(job, old_by_job.get(job.id, ()), changes.get(job.id, ()), reverts.get(job.id, ()))
    ]
    moved: dict[tw.GroupKey, list[float]] = {}
    tw.add_into(moved, old, -1)
    tw.add_into(moved, new, 1)
    _replace_rows(connection, ids, bool(old), new)
    _apply(connection, tw.changed(moved))
    return len(new)


def refresh(connection: Connection, job_ids: Iterable[int], changes: Changes | None = None) -> int:
    """Brings the task-weeks of `job_ids` up to date and moves the rollups; returns the task-weeks written.

    `changes` gives, per task, each window written since the last refresh: its stored version
    before (None when new) and the version written. The caller holds the tasks' locks (`lock`)
    since before it read those stored versions. Job rows and revert events are read afresh.
    """
    ids = sorted(set(job_ids))
    return sum(_refresh_chunk(connection, chunk, changes or {}) for chunk in _chunks(ids))


def rebuild(connection: Connection) -> int:
    """Recomputes every task's task-weeks and every rollup from scratch; returns the task-weeks."""
    connection.execute(delete(ROLLUPS))
    connection.execute(delete(TASK_WEEKS))
    ids = list(connection.execute(select(JOBS.c.id).order_by(JOBS.c.id)).scalars())
    lock(connection, ids)
    return sum(refresh(connection, chunk, _windows(connection, chunk)) for chunk in _chunks(ids))
