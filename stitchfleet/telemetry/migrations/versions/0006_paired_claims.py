"""Paired claims: task_weeks keeps its claimed saving and the sums its confidence interval is computed from.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

A task-week's saving is claimed only when its 95% interval over its paired windows excludes zero
(telemetry.paired); gross and net count the claimed saving. The new columns are derived data: the
revision 0007 fills them, and every rollup, from the rows already there with the package's `aggregates.rebuild`
(which writes the head revision's columns: the last revision that changes these tables brings the fill).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

FLOATS = ("claimed_seconds", "paired_step_seconds", "saved_square", "saved_by_steps", "steps_square")
INTEGERS = (("paired_windows", sa.Integer()), ("paired_steps", sa.BigInteger()), ("baseline_windows", sa.Integer()))


def upgrade() -> None:
    with op.batch_alter_table("task_weeks") as batch:
        for name in FLOATS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0"))
        for name, kind in INTEGERS:
            batch.add_column(sa.Column(name, kind, nullable=False, server_default="0"))
    # Filled by 0007 (see the module docstring).


def downgrade() -> None:
    with op.batch_alter_table("task_weeks") as batch:
        for name in (*FLOATS, *(name for name, _ in INTEGERS)):
            batch.drop_column(name)
