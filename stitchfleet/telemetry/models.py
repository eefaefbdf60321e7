"""The telemetry schema: SQLAlchemy 2.0 typed ORM classes for jobs, step windows, events, clusters.

Input: nothing (declarations). Output: `Base.metadata`, the single source of truth that the
Alembic migrations in `stitchfleet/telemetry/migrations` must match (a test runs `alembic check`).

Identity of a job (its natural key) is (cluster, namespace, job_name, job_uid). `job_uid` is the
id of one run of the job: the Kubernetes Job/owner uid plus the restart attempt where the webhook
knows it (STITCHFLEET_JOB_UID), else a uuid chosen by rank 0 and shared with the other ranks. Two
runs of a same-named job therefore stay two rows. Rows of the other tables reference the job's
surrogate integer id, which is what reports join on.

All times are stored as UTC; `UtcDateTime` returns timezone-aware datetimes on every backend.
Table and column names are a public contract (reports, operator rollups): change them only with
a migration.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from stitchfleet.telemetry.kinds import (
    STATUS_RANK,
    VERDICT_RANK,
    DeviceKind,
    EventKind,
    JobStatus,
    ProbeOutcome,
    Verdict,
    WindowMode,
)

__all__ = [  # the vocabulary moved to kinds (pods import it without SQLAlchemy); callers still name it here
    "STATUS_RANK",
    "VERDICT_RANK",
    "DeviceKind",
    "EventKind",
    "JobStatus",
    "ProbeOutcome",
    "Verdict",
    "WindowMode",
]

# Explicit constraint names: PostgreSQL and SQLite then agree, and migrations can drop them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Stores UTC, returns aware UTC datetimes (SQLite keeps no zone, PostgreSQL does)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: telemetry times must carry a timezone")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base carrying the shared metadata."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """One run of a training job (all ranks together)."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("cluster", "namespace", "job_name", "job_uid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    job_name: Mapped[str] = mapped_column(String(253))
    job_uid: Mapped[str] = mapped_column(String(128))
    team: Mapped[str] = mapped_column(String(128), default="")
    model: Mapped[str] = mapped_column(String(128), default="")
    pod_name: Mapped[str] = mapped_column(String(253), default="")
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    gpus_per_rank: Mapped[int] = mapped_column(Integer, default=1)
    gpu_type: Mapped[str] = mapped_column(String(64), default="")
    # What the ranks measured they compute on ("" until a rank says): GPU jobs are accounted in
    # GPU-hours, CPU jobs in CPU core-hours. devices_per_rank is what one rank uses (its visible
    # GPUs, or its CPU cores), which is not the pod's allocation when a pod runs several ranks.
    device_kind: Mapped[str] = mapped_column(String(8), default="")
    devices_per_rank: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, index=True)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.RUNNING.value)
    reason: Mapped[str] = mapped_column(Text, default="")
    # Wall seconds the slowest rank spent compiling: the overhead charged against the savings.
    compile_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # Wall seconds the slowest rank's plugin spent on its own work beyond what the user's graph costs, over the
    # steps no saving pays it (measured: rows.JobOverhead); charged against the savings like the compile.
    overhead_seconds: Mapped[float] = mapped_column(Float, default=0.0)

    windows: Mapped[list[StepWindow]] = relationship(back_populates="job")
    events: Mapped[list[Event]] = relationship(back_populates="job")


class StepWindow(Base):
    """Figures of one rank over a run of consecutive steps; keyed by (job, rank, window_index)."""

    __tablename__ = "step_windows"
    __table_args__ = (UniqueConstraint("job_id", "rank", "window_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    window_index: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    iterations: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))
    # Median step seconds of the latest baseline window (all clusters off): the reference.
    baseline_step_seconds: Mapped[float | None] = mapped_column(Float)
    step_seconds_sum: Mapped[float] = mapped_column(Float)
    saved_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    recorded_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)

    job: Mapped[Job] = relationship(back_populates="windows")


class Event(Base):
    """Something that happened once: a revert, a compile failure, a guard check; keyed by uuid."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    cluster_fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    # A short label (metrics use it) and a free text explanation.
    reason: Mapped[str] = mapped_column(String(64), default="")
    detail: Mapped[str] = mapped_column(Text, default="")
    passed: Mapped[bool | None] = mapped_column()
    max_abs_error: Mapped[float | None] = mapped_column(Float)
    # Distance of the stitched result from fp64, divided by that of the unfused fp32 result.
    error_ratio: Mapped[float | None] = mapped_column(Float)
    occurred_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)

    job: Mapped[Job] = relationship(back_populates="events")


class Cluster(Base):
    """A stitch cluster fingerprint (hash of its subgraph) and its fleet-wide verdict."""

    __tablename__ = "clusters"

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    op_count: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class JobVerdict(Base):
    """One job's verdict for a cluster fingerprint, as its pods reported it through the operator.

    The evidence the fleet's `reverted` memory is built from (telemetry.fleet_quarantine): it applies to
    its job and namespace at once, to the fleet only when jobs of distinct namespaces agree or an
    admin confirms it (then a `clusters` row). `reverted` is sticky for the job.
    """

    __tablename__ = "job_verdicts"
    __table_args__ = (UniqueConstraint("job_id", "fingerprint"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    op_count: Mapped[int | None] = mapped_column(Integer)
    recorded_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class ProbeVerdict(Base):
    """One job's probe outcome (slower or faster) for a fingerprint on a device profile at input shapes.

    The evidence the fleet's `slower` verdicts are derived from (telemetry.slow_verdicts): one row per
    job and (fingerprint, profile, shapes), its latest outcome; the job's ranks write the same row.
    """

    __tablename__ = "probe_verdicts"
    __table_args__ = (UniqueConstraint("job_id", "fingerprint", "profile", "shapes"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    fingerprint: Mapped[str] = mapped_column(String(64))
    profile: Mapped[str] = mapped_column(String(128))
    shapes: Mapped[str] = mapped_column(String(256))
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(Text, default="")
    # The fleet reads the evidence of the last two TTLs only (see slow_verdicts.derive).
    recorded_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)


class TaskWeek(Base):
    """One task's figures of one ISO week, kept up to date by the store as its rows arrive.

    Derived data (telemetry.aggregates keeps it, or rebuilds it from jobs, step windows and
    events): the task's identity and accounting facts are copied here so that a report lists
    tasks, and a refresh knows which rollups a stale row contributed to, without reading
    anything else. Median step times are not kept (they cannot move by differences).
    """

    __tablename__ = "task_weeks"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    week_start: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    job_name: Mapped[str] = mapped_column(String(253))
    job_uid: Mapped[str] = mapped_column(String(128))
    team: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    world_size: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(8))
    devices_per_rank: Mapped[int] = mapped_column(Integer)
    windows: Mapped[int] = mapped_column(Integer)
    iterations: Mapped[int] = mapped_column(BigInteger)
    # {rank: its iterations this week}; `iterations` is the busiest rank's (ranks step in lockstep).
    rank_iterations: Mapped[dict[str, int]] = mapped_column(JSON)
    # Saved wall seconds summed over ranks (x devices per rank = device-seconds): measured, and claimed (the
    # measured when its interval excludes zero, else 0: telemetry.paired), which gross and net count.
    saved_seconds: Mapped[float] = mapped_column(Float)
    claimed_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # Sums over the week's paired windows (stitched, with a baseline): the interval's inputs (`paired.PairedSums`).
    paired_windows: Mapped[int] = mapped_column(Integer, default=0)
    paired_steps: Mapped[int] = mapped_column(BigInteger, default=0)
    paired_step_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    saved_square: Mapped[float] = mapped_column(Float, default=0.0)
    saved_by_steps: Mapped[float] = mapped_column(Float, default=0.0)
    steps_square: Mapped[float] = mapped_column(Float, default=0.0)
    baseline_windows: Mapped[int] = mapped_column(Integer, default=0)
    # Device-seconds: compile and the plugin's own cost (0 unless charged to this week), and
    # net = gross - compile - overhead.
    compile_device_seconds: Mapped[float] = mapped_column(Float)
    overhead_device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    net_device_seconds: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    revert_reason: Mapped[str] = mapped_column(Text)
    # {revert reason label: revert events}, and the saved seconds of each UTC day, Monday first.
    reverts: Mapped[dict[str, int]] = mapped_column(JSON)
    daily_saved_seconds: Mapped[list[float]] = mapped_column(JSON)


class WeekRollup(Base):
    """Sums of the task-weeks of one week by one dimension value and device kind (derived data).

    Dimensions: `fleet` (key ""), `namespace`, `team`, `model`, `reason` (a revert reason label),
    `job` (cluster, namespace and job name joined by a unit separator: counts distinct jobs),
    `day` (an ISO date; `gross_device_seconds` is what that day's windows saved). Kept by adding
    each refreshed task-week's change, so a weekly report reads O(groups) rows.
    """

    __tablename__ = "week_rollups"

    week_start: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    dimension: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[str] = mapped_column(String(800), primary_key=True)
    device_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    tasks: Mapped[int] = mapped_column(Integer)
    distributed_tasks: Mapped[int] = mapped_column(Integer)
    reverted_tasks: Mapped[int] = mapped_column(Integer)
    reverts: Mapped[int] = mapped_column(Integer)
    devices: Mapped[int] = mapped_column(BigInteger)
    windows: Mapped[int] = mapped_column(BigInteger)
    iterations: Mapped[int] = mapped_column(BigInteger)
    gross_device_seconds: Mapped[float] = mapped_column(Float)
    compile_device_seconds: Mapped[float] = mapped_column(Float)
    overhead_device_seconds: Mapped[float] = mapped_column(Float, default=0.0)


Index("ix_events_kind_job", Event.kind, Event.job_id)
# A task's windows of one week (median step times of the tasks a report lists); serves job_id alone too.
Index("ix_step_windows_job_recorded", StepWindow.job_id, StepWindow.recorded_at)
# The top and bottom tasks of a week and device kind come straight off this index.
Index("ix_task_weeks_week_kind_net", TaskWeek.week_start, TaskWeek.device_kind, TaskWeek.net_device_seconds)
