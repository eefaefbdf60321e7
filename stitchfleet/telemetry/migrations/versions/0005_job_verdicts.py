"""Job verdicts: each job's verdict per cluster fingerprint, the evidence of the fleet's quarantine.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

Pods' cluster verdicts used to go straight into `clusters` (fleet-wide, for any pod to forge);
they now land here, keyed by the job the operator knows the pod by, and reach the fleet only
corroborated or confirmed (telemetry.fleet_quarantine). Existing `clusters` rows stay as they are:
`stitchfleet fleet quarantine list` shows them and `clear` undoes any that no evidence supports.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "job_verdicts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("op_count", sa.Integer(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_verdicts_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_verdicts")),
        sa.UniqueConstraint("job_id", "fingerprint", name=op.f("uq_job_verdicts_job_id_fingerprint")),
    )
    op.create_index(op.f("ix_job_verdicts_fingerprint"), "job_verdicts", ["fingerprint"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_verdicts_fingerprint"), table_name="job_verdicts")
    op.drop_table("job_verdicts")
