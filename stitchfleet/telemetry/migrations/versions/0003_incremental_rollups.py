"""Incremental rollups: task_weeks (one task's week) and week_rollups (sums by dimension, day, reason).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

Both tables are derived data that the store keeps up to date on every write. The step windows'
index on job_id becomes one on (job_id, recorded_at): a task's windows of one week. Upgrading a
database that already holds telemetry fills them from its rows (every task refreshed once, in
chunks), so the first report after the upgrade shows the same figures as before it. The fill runs
the package's `aggregates.rebuild`, i.e. the code installed with the head revision, so it now runs
in 0006 (which adds columns to task_weeks): a later revision that changes these tables moves it again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def _create_task_weeks() -> None:
    op.create_table(
        "task_weeks",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("week_start", sa.Date(), nullable=False),
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("job_name", sa.String(length=253), nullable=False),
        sa.Column("job_uid", sa.String(length=128), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("device_kind", sa.String(length=8), nullable=False),
        sa.Column("devices_per_rank", sa.Integer(), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("iterations", sa.BigInteger(), nullable=False),
        sa.Column("rank_iterations", sa.JSON(), nullable=False),
        sa.Column("saved_seconds", sa.Float(), nullable=False),
        sa.Column("compile_device_seconds", sa.Float(), nullable=False),
        sa.Column("net_device_seconds", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("revert_reason", sa.Text(), nullable=False),
        sa.Column("reverts", sa.JSON(), nullable=False),
        sa.Column("daily_saved_seconds", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_task_weeks_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "week_start", name=op.f("pk_task_weeks")),
    )
    op.create_index(
        "ix_task_weeks_week_kind_net", "task_weeks", ["week_start", "device_kind", "net_device_seconds"]
    )


def _create_week_rollups() -> None:
    op.create_table(
        "week_rollups",
        sa.Column("week_start", sa.Date(), nullable=False),
        sa.Column("dimension", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=800), nullable=False),
        sa.Column("device_kind", sa.String(length=8), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        sa.Column("distributed_tasks", sa.Integer(), nullable=False),
        sa.Column("reverted_tasks", sa.Integer(), nullable=False),
        sa.Column("reverts", sa.Integer(), nullable=False),
        sa.Column("devices", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.BigInteger(), nullable=False),
        sa.Column("iterations", sa.BigInteger(), nullable=False),
        sa.Column("gross_device_seconds", sa.Float(), nullable=False),
        sa.Column("compile_device_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("week_start", "dimension", "key", "device_kind", name=op.f("pk_week_rollups")),
    )


def upgrade() -> None:
    # A task's windows of one week are read by (job_id, recorded_at); the prefix serves job_id alone.
    op.create_index("ix_step_windows_job_recorded", "step_windows", ["job_id", "recorded_at"])
    op.drop_index("ix_step_windows_job_id", table_name="step_windows")
    _create_task_weeks()
    _create_week_rollups()
    # Filled from the rows already there by 0007, the last revision that changes these tables: the package's
    # `aggregates.rebuild` writes the columns of the head revision, which this one does not have yet.


def downgrade() -> None:
    op.drop_table("week_rollups")
    op.drop_index("ix_task_weeks_week_kind_net", table_name="task_weeks")
    op.drop_table("task_weeks")
    op.create_index("ix_step_windows_job_id", "step_windows", ["job_id"])
    op.drop_index("ix_step_windows_job_recorded", table_name="step_windows")
