"""Alembic environment: runs migrations on the engine that `database.alembic_config` attached.

Input: the Alembic config (its attributes carry the Engine). Output: schema changes inside one
transaction. Configured programmatically, so no alembic.ini is read at runtime.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from stitchfleet.telemetry.models import Base


def _run_online() -> None:
    engine: Engine = context.config.attributes["engine"]
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            compare_type=True,
            # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("stitchfleet migrations run online only (stitchfleet db upgrade)")
_run_online()
