"""Read helpers other components need from the ledger.

Input: an Engine (or a URL). Output: plain Python values, e.g. the cluster fingerprints reverted
anywhere in the fleet, which the plugin starts off in later jobs.
"""

from __future__ import annotations

from sqlalchemy import Engine, select

from stitchfleet.telemetry import database, models


def reverted_fingerprints(target: Engine | str | None = None) -> set[str]:
    """Fingerprints whose fleet verdict is `reverted` (an engine, a URL, or the settings' database)."""
    engine = target if isinstance(target, Engine) else database.connect(target)
    try:
        with engine.connect() as connection:
            query = select(models.Cluster.fingerprint).where(models.Cluster.verdict == models.Verdict.REVERTED.value)
            return set(connection.execute(query).scalars())
    finally:
        if engine is not target:
            engine.dispose()
