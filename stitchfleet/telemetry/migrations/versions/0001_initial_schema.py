"""Initial schema: jobs, step windows, events, clusters.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

UTC_DATETIME = sa.DateTime(timezone=True)


def _create_clusters() -> None:
    op.create_table(
        "clusters",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("op_count", sa.Integer(), nullable=True),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_clusters")),
    )


def _create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("job_name", sa.String(length=253), nullable=False),
        sa.Column("job_uid", sa.String(length=128), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("gpus_per_rank", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=64), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=True),
        sa.Column("ended_at", UTC_DATETIME, nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("compile_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint(
            "cluster", "namespace", "job_name", "job_uid", name=op.f("uq_jobs_cluster_namespace_job_name_job_uid")
        ),
    )
    op.create_index(op.f("ix_jobs_started_at"), "jobs", ["started_at"], unique=False)


def _create_events() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("cluster_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.Column("max_abs_error", sa.Float(), nullable=True),
        sa.Column("error_ratio", sa.Float(), nullable=True),
        sa.Column("occurred_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sa.UniqueConstraint("uuid", name=op.f("uq_events_uuid")),
    )
    op.create_index(op.f("ix_events_cluster_fingerprint"), "events", ["cluster_fingerprint"], unique=False)
    op.create_index(op.f("ix_events_job_id"), "events", ["job_id"], unique=False)
    op.create_index("ix_events_kind_job", "events", ["kind", "job_id"], unique=False)


def _create_step_windows() -> None:
    op.create_table(
        "step_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("window_index", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("baseline_step_seconds", sa.Float(), nullable=True),
        sa.Column("step_seconds_sum", sa.Float(), nullable=False),
        sa.Column("saved_seconds", sa.Float(), nullable=False),
        sa.Column("recorded_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_step_windows_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_windows")),
        sa.UniqueConstraint(
            "job_id", "rank", "window_index", name=op.f("uq_step_windows_job_id_rank_window_index")
        ),
    )
    op.create_index(op.f("ix_step_windows_job_id"), "step_windows", ["job_id"], unique=False)
    op.create_index(op.f("ix_step_windows_recorded_at"), "step_windows", ["recorded_at"], unique=False)


def upgrade() -> None:
    _create_clusters()
    _create_jobs()
    _create_events()
    _create_step_windows()


def downgrade() -> None:
    op.drop_table("step_windows")
    op.drop_table("events")
    op.drop_table("jobs")
    op.drop_table("clusters")
