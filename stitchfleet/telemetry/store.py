"""Idempotent writes of recorded rows: every row is an upsert on its natural key.

Input: a SQLAlchemy Connection (inside a transaction) and a batch of rows. Output: the rows in
the database, such that writing the same batch again changes nothing: windows are keyed by
(job, rank, window index), events by uuid, jobs by (cluster, namespace, job name, job uid),
clusters by fingerprint, job verdicts by (job, fingerprint), probe verdicts by (job, fingerprint,
profile, shapes) (the latest wins).
Merges are order-independent (earliest start, latest end, worst status, largest compile time and overhead,
sticky revert verdict, a job's latest probe verdict), so replays in any order give the same figures.
Every write also refreshes the touched tasks' weekly aggregates (task_weeks, week_rollups) in the
same transaction, which is what keeps a weekly report at O(groups) rows.
Works on PostgreSQL and SQLite (their ON CONFLICT clauses); other backends raise DatabaseError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Table, case, select

from stitchfleet.telemetry import aggregates, models
from stitchfleet.telemetry.aggregates import WindowKey
from stitchfleet.telemetry.database import dialect_insert
from stitchfleet.telemetry.rows import (
    ClusterVerdict,
    Event,
    JobCompiled,
    JobFinished,
    JobKey,
    JobOverhead,
    JobStarted,
    JobVerdict,
    ProbeVerdict,
    Row,
    StepWindow,
)
from stitchfleet.telemetry.task_weeks import Change, WindowFacts

JOBS: Table = models.Job.__table__  # type: ignore[assignment]
WINDOWS: Table = models.StepWindow.__table__  # type: ignore[assignment]
EVENTS: Table = models.Event.__table__  # type: ignore[assignment]
CLUSTERS: Table = models.Cluster.__table__  # type: ignore[assignment]
PROBES: Table = models.ProbeVerdict.__table__  # type: ignore[assignment]
JOB_VERDICTS: Table = models.JobVerdict.__table__  # type: ignore[assignment]
PROBE_KEY = ("job_id", "fingerprint", "profile", "shapes")
JOB_KEY = ("cluster", "namespace", "job_name", "job_uid")

JobIds = dict[JobKey, int]


_insert = dialect_insert


def _ranked(column: ColumnElement[Any], ranks: Mapping[Any, int]) -> ColumnElement[int]:
    return case({str(value): rank for value, rank in ranks.items()}, value=column, else_=0)


def _larger(new: Column[Any], old: Column[Any]) -> ColumnElement[Any]:
    return case((old.is_(None), new), (new > old, new), else_=old)


def _smaller(new: Column[Any], old: Column[Any]) -> ColumnElement[Any]:
    return case((old.is_(None), new), (new < old, new), else_=old)


def _filled(new: Column[Any], old: Column[Any]) -> ColumnElement[Any]:
    return case((new == "", old), else_=new)


def _key_values(key: JobKey) -> dict[str, str]:
    return {name: getattr(key, name) for name in JOB_KEY}


def job_id(connection: Connection, key: JobKey, ids: JobIds) -> int:
    """The surrogate id of the job `key`, creating a placeholder row when it is not known yet."""
    if key in ids:
        return ids[key]
    where = [JOBS.c[name] == value for name, value in _key_values(key).items()]
    found = connection.execute(select(JOBS.c.id).where(*where)).scalar()
    if found is None:
        connection.execute(_insert(connection, JOBS).values(**_key_values(key)).on_conflict_do_nothing())
        found = connection.execute(select(JOBS.c.id).where(*where)).scalar_one()
    ids[key] = found
    return int(found)


def _job_started(connection: Connection, row: JobStarted) -> None:
    stmt = _insert(connection, JOBS).values(
        **_key_values(row.job),
        team=row.team,
        model=row.model,
        pod_name=row.pod_name,
        world_size=row.world_size,
        gpus_per_rank=row.gpus_per_rank,
        gpu_type=row.gpu_type,
        started_at=row.started_at,
        device_kind=row.device_kind,
        devices_per_rank=row.devices_per_rank,
    )
    new = stmt.excluded
    # Rank 0's pod names the job; other ranks only fill it while it is empty.
    pod = new.pod_name if row.rank == 0 else case((JOBS.c.pod_name == "", new.pod_name), else_=JOBS.c.pod_name)
    # Several writers describe a job (its ranks, the operator watching its pods): an empty text
    # is "not known", never a value, and the largest world seen wins, whatever the order.
    update = {name: _filled(new[name], JOBS.c[name]) for name in ("team", "model", "gpu_type", "device_kind")}
    update |= {"gpus_per_rank": new.gpus_per_rank, "world_size": _larger(new.world_size, JOBS.c.world_size)}
    # A rank that measured its devices wins over an unmeasured view; ranks that differ keep the most.
    update |= {"devices_per_rank": _larger(new.devices_per_rank, JOBS.c.devices_per_rank)}
    update |= {"pod_name": pod, "started_at": _smaller(new.started_at, JOBS.c.started_at)}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(JOB_KEY), set_=update))


def _job_compiled(connection: Connection, row: JobCompiled) -> None:
    stmt = _insert(connection, JOBS).values(**_key_values(row.job), compile_seconds=row.compile_seconds)
    update = {"compile_seconds": _larger(stmt.excluded.compile_seconds, JOBS.c.compile_seconds)}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(JOB_KEY), set_=update))


def _job_overhead(connection: Connection, row: JobOverhead) -> None:
    # Cumulative per rank, so a replay or a late older row never lowers it; the slowest rank's wins, as the compile's.
    stmt = _insert(connection, JOBS).values(**_key_values(row.job), overhead_seconds=row.overhead_seconds)
    update = {"overhead_seconds": _larger(stmt.excluded.overhead_seconds, JOBS.c.overhead_seconds)}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(JOB_KEY), set_=update))


def _job_finished(connection: Connection, row: JobFinished) -> None:
    stmt = _insert(connection, JOBS).values(
        **_key_values(row.job), status=row.status, reason=row.reason, ended_at=row.ended_at
    )
    new = stmt.excluded
    new_rank, old_rank = _ranked(new.status, models.STATUS_RANK), _ranked(JOBS.c.status, models.STATUS_RANK)
    wins = (new_rank > old_rank) | ((new_rank == old_rank) & (JOBS.c.reason == ""))
    update = {
        "status": case((new_rank > old_rank, new.status), else_=JOBS.c.status),
        "reason": case((wins, new.reason), else_=JOBS.c.reason),
        "ended_at": _larger(new.ended_at, JOBS.c.ended_at),
    }
    connection.execute(stmt.on_conflict_do_update(index_elements=list(JOB_KEY), set_=update))


def _window_values(row: StepWindow, job: int) -> dict[str, Any]:
    return {
        "job_id": job,
        "rank": row.rank,
        "window_index": row.window_index,
        "first_step": row.first_step,
        "last_step": row.last_step,
        "iterations": row.iterations,
        "mode": row.mode,
        "baseline_step_seconds": row.baseline_step_seconds,
        "step_seconds_sum": row.step_seconds_sum,
        "saved_seconds": row.saved_seconds,
        "recorded_at": row.recorded_at,
    }


def _event_values(row: Event, job: int) -> dict[str, Any]:
    names = ("uuid", "rank", "step", "kind", "cluster_fingerprint", "reason", "detail", "passed")
    values = {name: getattr(row, name) for name in names}
    return values | {
        "job_id": job,
        "max_abs_error": row.max_abs_error,
        "error_ratio": row.error_ratio,
        "occurred_at": row.occurred_at,
    }


def _windows(connection: Connection, values: Sequence[dict[str, Any]]) -> None:
    stmt = _insert(connection, WINDOWS)
    keys = ("job_id", "rank", "window_index")
    update = {name: stmt.excluded[name] for name in values[0] if name not in keys}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update), list(values))


def _events(connection: Connection, values: Sequence[dict[str, Any]]) -> None:
    stmt = _insert(connection, EVENTS).on_conflict_do_nothing(index_elements=["uuid"])
    connection.execute(stmt, list(values))


def _cluster_verdict(connection: Connection, row: ClusterVerdict) -> None:
    stmt = _insert(connection, CLUSTERS).values(
        fingerprint=row.fingerprint,
        verdict=row.verdict,
        reason=row.reason,
        op_count=row.op_count,
        updated_at=row.updated_at,
    )
    new = stmt.excluded
    new_rank, old_rank = _ranked(new.verdict, models.VERDICT_RANK), _ranked(CLUSTERS.c.verdict, models.VERDICT_RANK)
    # `cleared` (an admin's or a recheck's) undoes any standing; anything else only raises it.
    wins = (new.verdict == models.Verdict.CLEARED.value) | (new_rank > old_rank)
    update = {
        "verdict": case((wins, new.verdict), else_=CLUSTERS.c.verdict),
        "reason": case((wins | (new_rank == old_rank), new.reason), else_=CLUSTERS.c.reason),
        "op_count": case((new.op_count.is_(None), CLUSTERS.c.op_count), else_=new.op_count),
        "updated_at": _larger(new.updated_at, CLUSTERS.c.updated_at),
    }
    connection.execute(stmt.on_conflict_do_update(index_elements=["fingerprint"], set_=update))


def _job_verdict(connection: Connection, row: JobVerdict, job: int) -> None:
    fields = ("fingerprint", "verdict", "reason", "op_count", "recorded_at")
    stmt = _insert(connection, JOB_VERDICTS).values(job_id=job, **{name: getattr(row, name) for name in fields})
    new = stmt.excluded
    new_rank = _ranked(new.verdict, models.VERDICT_RANK)
    old_rank = _ranked(JOB_VERDICTS.c.verdict, models.VERDICT_RANK)
    # Sticky per job, like the fleet's: a job's later "enabled" never takes back its own revert.
    update = {
        "verdict": case((new_rank > old_rank, new.verdict), else_=JOB_VERDICTS.c.verdict),
        "reason": case((new_rank >= old_rank, new.reason), else_=JOB_VERDICTS.c.reason),
        "op_count": case((new.op_count.is_(None), JOB_VERDICTS.c.op_count), else_=new.op_count),
        "recorded_at": case((new_rank > old_rank, new.recorded_at), else_=JOB_VERDICTS.c.recorded_at),
    }
    connection.execute(stmt.on_conflict_do_update(index_elements=["job_id", "fingerprint"], set_=update))


def _probe_verdict(connection: Connection, row: ProbeVerdict, job: int) -> None:
    fields = ("fingerprint", "profile", "shapes", "outcome", "detail", "recorded_at")
    stmt = _insert(connection, PROBES).values(job_id=job, **{name: getattr(row, name) for name in fields})
    new = stmt.excluded
    # A replayed older row never overwrites the job's later finding.
    later = new.recorded_at >= PROBES.c.recorded_at
    update = {name: case((later, new[name]), else_=PROBES.c[name]) for name in ("outcome", "detail", "recorded_at")}
    connection.execute(stmt.on_conflict_do_update(index_elements=list(PROBE_KEY), set_=update))


_JOB_WRITERS: dict[type[Any], Any] = {
    JobStarted: _job_started,
    JobCompiled: _job_compiled,
    JobOverhead: _job_overhead,
    JobFinished: _job_finished,
    ClusterVerdict: _cluster_verdict,
}


def _job_of(row: Row) -> JobKey | None:
    return None if isinstance(row, ClusterVerdict) else row.job


def _window_facts(values: Mapping[str, Any]) -> WindowFacts:
    return WindowFacts(*(values[name] for name in WindowFacts._fields))


def _window_changes(
    windows: Mapping[WindowKey, dict[str, Any]], stored: Mapping[WindowKey, WindowFacts]
) -> dict[int, list[Change]]:
    """Per task, each window written that differs from its stored version: (stored or None, new)."""
    changes: dict[int, list[Change]] = {}
    for key, values in windows.items():
        new, old = _window_facts(values), stored.get(key)
        if new != old:
            changes.setdefault(key[0], []).append((old, new))
    return changes


def write_rows(connection: Connection, rows: Iterable[Row], ids: JobIds | None = None) -> int:
    """Upserts `rows` in the caller's transaction; returns how many rows were given.

    Windows and events go in one executemany each; within a batch the last row with a given
    key wins, as it would have had the rows come in separate batches. The weekly aggregates of
    every task the batch touched move with it (telemetry.aggregates): the tasks are locked
    first (PostgreSQL), the stored versions of the batch's windows read, then everything written.
    """
    ids = {} if ids is None else ids
    batch = list(rows)
    # A probe or job verdict changes no window: its job needs an id, not an aggregate refresh.
    touched = {
        job_id(connection, key, ids)
        for row in batch
        if not isinstance(row, ProbeVerdict | JobVerdict) and (key := _job_of(row)) is not None
    }
    aggregates.lock(connection, touched)
    windows: dict[WindowKey, dict[str, Any]] = {}
    events: dict[str, dict[str, Any]] = {}
    for row in batch:
        if isinstance(row, StepWindow):
            job = ids[row.job]
            windows[(job, row.rank, row.window_index)] = _window_values(row, job)
        elif isinstance(row, Event):
            events[row.uuid] = _event_values(row, ids[row.job])
        elif isinstance(row, ProbeVerdict):
            _probe_verdict(connection, row, job_id(connection, row.job, ids))
        elif isinstance(row, JobVerdict):
            _job_verdict(connection, row, job_id(connection, row.job, ids))
        else:
            _JOB_WRITERS[type(row)](connection, row)
    stored = aggregates.stored_windows(connection, windows) if windows else {}
    if windows:
        _windows(connection, list(windows.values()))
    if events:
        _events(connection, list(events.values()))
    aggregates.refresh(connection, touched, _window_changes(windows, stored))
    return len(batch)
