"""The fleet's memory from a local SQLite telemetry database, read with the standard library only.

Input: a SQLite URL (`sqlite:///path`), the time now and the slower rule's settings (jobs of evidence, TTL).
Output: the reverted fingerprints, the slower verdicts and, by the mirror rule, the faster ones.
The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from urllib.parse import quote

from stitchfleet.plugin.fleet.fleet_memory import Recollection
from stitchfleet.telemetry.kinds import ProbeOutcome, Verdict
from stitchfleet.telemetry.slow_verdicts import Finding, derive, window_start

CLUSTERS_TABLE = "clusters"  # telemetry.models.Cluster's table (a test holds them equal)
PROBES_TABLE = "probe_verdicts"  # telemetry.models.ProbeVerdict's table


def local_memory(url: str, *, now: dt.datetime, min_jobs: int, ttl: dt.timedelta) -> Recollection:
    """The reverted fingerprints and live slower verdicts in the SQLite database at `url`."""
    connection = _connect(url)
    if connection is None:
        return Recollection(frozenset(), "database")
    try:
        findings = _findings(connection, now, ttl)
        return Recollection(
            frozenset(_reverted(connection)),
            "database",
            slower=tuple(derive(findings, now, min_jobs, ttl)),
            faster=tuple(derive(findings, now, min_jobs, ttl, outcome=ProbeOutcome.FASTER)),
        )
    finally:
        connection.close()


def sqlite_reverted(url: str) -> set[str]:
    """`queries.reverted_fingerprints` for a SQLite URL, with the standard library."""
    connection = _connect(url)
    if connection is None:
        return set()
    try:
        return _reverted(connection)
    finally:
        connection.close()


def _connect(url: str) -> sqlite3.Connection | None:
    scheme, _, path = url.partition(":///")
    if scheme.split("+")[0] != "sqlite" or not path or path.startswith(":memory:"):
        return None  # an in-memory database is empty in a fresh process
    try:
        return sqlite3.connect(f"file:{quote(path.split('?')[0])}?mode=ro", uri=True)
    except sqlite3.OperationalError:
        return None


def _reverted(connection: sqlite3.Connection) -> set[str]:
    try:
        query = f"SELECT fingerprint FROM {CLUSTERS_TABLE} WHERE verdict = ?"  # the table name is a constant
        return {str(row[0]) for row in connection.execute(query, (Verdict.REVERTED.value,))}
    except sqlite3.OperationalError:  # no table yet: no job has recorded here
        return set()


def _findings(connection: sqlite3.Connection, now: dt.datetime, ttl: dt.timedelta) -> list[Finding]:
    # SQLAlchemy keeps SQLite times as UTC text "YYYY-MM-DD HH:MM:SS.ffffff" (models.UtcDateTime): they
    # compare as text, and read back as naive UTC.
    since = window_start(now, ttl).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    query = (
        f"SELECT fingerprint, profile, shapes, job_id, outcome, recorded_at FROM {PROBES_TABLE} WHERE recorded_at >= ?"
    )
    try:
        rows = connection.execute(query, (since,)).fetchall()
    except sqlite3.OperationalError:  # a database from before migration 0004, or none yet
        return []
    return [Finding(str(f), str(p), str(s), job, str(o), _utc(str(at))) for f, p, s, job, o, at in rows]


def _utc(text: str) -> dt.datetime:
    moment = dt.datetime.fromisoformat(text)
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)
