"""A deterministic job workload for telemetry tests, and the figures a report would read back."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import func, select

from stitchfleet.telemetry import database, models, store
from stitchfleet.telemetry import rows as r

T0 = dt.datetime(2026, 11, 16, 8, 0, tzinfo=dt.UTC)


def job_key(uid: str = "run-1") -> r.JobKey:
    return r.JobKey("gpu-east", "vision", "resnet-train", uid)


def workload(uid: str = "run-1", windows: int = 40, ranks: int = 2) -> list[r.Row]:
    """Start, compile, windows per rank (one revert midway), finish: every row with a fixed id."""
    key = job_key(uid)
    rows: list[r.Row] = []
    for rank in range(ranks):
        rows.append(
            r.JobStarted(
                key,
                rank=rank,
                team="ml",
                model="resnet50",
                pod_name=f"pod-{rank}",
                world_size=ranks,
                gpus_per_rank=8,
                gpu_type="H200",
                started_at=T0,
            )
        )
        rows.append(r.JobCompiled(key, rank=rank, compile_seconds=12.5 + rank))
    for index in range(windows):
        for rank in range(ranks):
            mode = "baseline" if index % 10 == 0 else "stitched"
            rows.append(
                r.StepWindow(
                    key,
                    rank,
                    index,
                    index * 100,
                    index * 100 + 99,
                    100,
                    mode,
                    step_seconds_sum=9.0 + 0.01 * index,
                    baseline_step_seconds=0.1,
                    saved_seconds=0.0 if mode == "baseline" else 1.0 - 0.01 * index,
                    recorded_at=T0 + dt.timedelta(seconds=10 * index),
                )
            )
        if index == windows // 2:
            rows.append(
                r.Event(
                    key,
                    "revert",
                    rank=0,
                    step=index * 100,
                    cluster_fingerprint="fp-ln-bwd",
                    reason="numeric_mismatch",
                    max_abs_error=0.3,
                    error_ratio=40.0,
                    occurred_at=T0,
                    uuid=str(uuid.UUID(int=index)),
                )
            )
            rows.append(r.ClusterVerdict("fp-ln-bwd", "reverted", "numeric_mismatch", op_count=14, updated_at=T0))
    rows.append(r.ClusterVerdict("fp-gelu", "enabled", op_count=6, updated_at=T0))
    for _rank in range(ranks):  # every rank's controller records the same finding: one row per job and key
        rows.append(r.ProbeVerdict(key, "fp-gelu", "cpu:test x4", "f32[8,768]", "faster", recorded_at=T0))
    for rank in range(ranks):
        rows.append(r.JobFinished(key, "finished", rank=rank, ended_at=T0 + dt.timedelta(hours=1)))
    return rows


def figures(url: str) -> dict[str, object]:
    """What reports depend on: per-job totals, row counts, job state, verdicts."""
    engine = database.connect(url)
    try:
        with engine.connect() as c:
            per_job = c.execute(
                select(
                    models.Job.job_uid,
                    func.sum(models.StepWindow.iterations),
                    func.sum(models.StepWindow.saved_seconds),
                    func.count(models.StepWindow.id),
                )
                .join(models.StepWindow)
                .group_by(models.Job.job_uid)
                .order_by(models.Job.job_uid)
            ).all()
            jobs = c.execute(
                select(
                    models.Job.job_uid,
                    models.Job.status,
                    models.Job.compile_seconds,
                    models.Job.pod_name,
                    models.Job.world_size,
                ).order_by(models.Job.job_uid)
            ).all()
            events = c.execute(select(func.count(models.Event.id))).scalar_one()
            verdicts = c.execute(
                select(models.Cluster.fingerprint, models.Cluster.verdict).order_by(models.Cluster.fingerprint)
            ).all()
            probes = c.execute(
                select(models.Job.job_uid, models.ProbeVerdict.fingerprint, models.ProbeVerdict.outcome)
                .join(models.ProbeVerdict)
                .order_by(models.Job.job_uid, models.ProbeVerdict.fingerprint)
            ).all()
    finally:
        engine.dispose()
    return {
        "per_job": [(uid, int(it), round(float(saved), 9), int(n)) for uid, it, saved, n in per_job],
        "jobs": [tuple(j) for j in jobs],
        "events": events,
        "verdicts": [tuple(v) for v in verdicts],
        "probes": [tuple(p) for p in probes],
    }


def write(url: str, rows: list[r.Row]) -> None:
    """Writes `rows` into the database at `url` (its schema already there), as the store does."""
    engine = database.connect(url)
    try:
        with engine.begin() as connection:
            store.write_rows(connection, rows)
    finally:
        engine.dispose()


def windows_in(url: str) -> int:
    """Windows the database holds so far (0 before its schema exists): how far a delivery has got."""
    try:
        return sum(n for *_, n in figures(url)["per_job"])  # type: ignore[misc]
    except Exception:  # before the schema
        return 0
