"""The telemetry events a test job recorded, read back from its SQLite database (no TensorFlow needed).

Input: a database URL, an event kind, and the job's spool directory when its rows may wait there (a job that ran
as written without setting up spools them: `Ledger.spool_meanwhile`; loaded first, as `stitchfleet report` does).
Output: the Event rows of that kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry import spool_ingest


def events(url: str, kind: str, spool: Path | None = None) -> list[Any]:
    if spool is not None:
        spool_ingest.claim(spool, url)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.select(tables.Event).where(tables.Event.kind == kind)))
    finally:
        engine.dispose()
