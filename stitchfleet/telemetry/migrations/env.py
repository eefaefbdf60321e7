"""Alembic environment: runs migrations on the engine that `database.alembic_config` attached.

Input: the Alembic config (its attributes carry the Engine). Output: schema changes inside one
transaction. Configured programmatically, so no alembic.ini is read at runtime.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine, text

from stitchfleet.telemetry.models import Base

# Any fixed 64-bit number, the same in every process: PostgreSQL advisory locks are keyed by it.
MIGRATION_LOCK_KEY = 0x5717C4F1EE7


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
            if connection.dialect.name == "postgresql":
                # Transactional DDL alone lets two ranks both start creating the schema; the loser
                # then fails on a duplicate table. The lock (held until commit) makes the second wait
                # and, in READ COMMITTED, then read the winner's revision and find nothing to do.
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("stitchfleet migrations run online only (stitchfleet db upgrade)")
_run_online()
