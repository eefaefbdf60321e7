"""The telemetry events a test job recorded, read back from its SQLite database (no TensorFlow needed).

Input: a database URL and an event kind. Output: the Event rows of that kind.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from stitchfleet.telemetry import models as tables


def events(url: str, kind: str) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.select(tables.Event).where(tables.Event.kind == kind)))
    finally:
        engine.dispose()
