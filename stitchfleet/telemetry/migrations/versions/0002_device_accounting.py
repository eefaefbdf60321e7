"""Device accounting: jobs.device_kind and jobs.devices_per_rank, measured by the ranks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

Rows written before this revision keep an empty device kind and no measured device count; the
report then falls back to the declared GPUs per rank (a GPU job when it declared any GPU).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("device_kind", sa.String(length=8), nullable=False, server_default=""))
        batch.add_column(sa.Column("devices_per_rank", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("devices_per_rank")
        batch.drop_column("device_kind")
