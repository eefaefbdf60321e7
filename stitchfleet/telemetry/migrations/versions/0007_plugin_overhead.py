"""Plugin overhead: a job's measured own cost beyond the user's graph, charged against its savings beside compile.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25

`jobs.overhead_seconds` holds the slowest rank's plugin work on the steps no window's saving pays (rows.JobOverhead);
`task_weeks` and `week_rollups` carry it in device-seconds, charged to the week of the task's start like compile, and
net = gross - compile - overhead. The derived columns are filled, and net recomputed, from the rows already there with
the package's `aggregates.rebuild` (jobs recorded before this revision have no overhead: 0). It writes the head
revision's columns, so the last revision that changes task_weeks or week_rollups runs it (0003 and 0006 leave it here).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

TABLES = (
    ("jobs", "overhead_seconds"),
    ("task_weeks", "overhead_device_seconds"),
    ("week_rollups", "overhead_device_seconds"),
)


def upgrade() -> None:
    for table, column in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(column, sa.Float(), nullable=False, server_default="0"))
    # Derived from the rows already there: the same code the store runs on every write.
    from stitchfleet.telemetry import aggregates

    aggregates.rebuild(op.get_bind())


def downgrade() -> None:
    for table, column in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
