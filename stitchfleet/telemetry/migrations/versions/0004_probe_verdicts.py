"""Probe verdicts: each job's probe outcome per (fingerprint, device profile, input shapes).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

The evidence the fleet derives its `slower` verdicts from (telemetry.slow_verdicts): one row per
job and (fingerprint, profile, shapes). Nothing to fill: jobs before this revision recorded only
the fingerprint's `disabled` verdict, without a profile or shapes, which is no evidence for one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "probe_verdicts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("profile", sa.String(length=128), nullable=False),
        sa.Column("shapes", sa.String(length=256), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_probe_verdicts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_verdicts")),
        sa.UniqueConstraint(
            "job_id", "fingerprint", "profile", "shapes", name=op.f("uq_probe_verdicts_job_id_fingerprint_profile_shapes")
        ),
    )
    op.create_index(op.f("ix_probe_verdicts_recorded_at"), "probe_verdicts", ["recorded_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_probe_verdicts_recorded_at"), table_name="probe_verdicts")
    op.drop_table("probe_verdicts")
