"""The fleet's memory as the weekly report shows it: what is off for a mismatch, and what is slower
where.

Input: a database URL (or engine), the time now, the jobs a slower verdict needs and its TTL (the
settings STITCHFLEET_SLOWER_JOBS and STITCHFLEET_SLOWER_TTL_DAYS, as the operator answers pods).
Output: `MemoryView`: the fingerprints quarantined fleet-wide for a numeric mismatch (confirmed, or
corroborated by jobs of several namespaces: fleet_quarantine; since when, the first job that
reverted it, why) and the live slower verdicts (fingerprint, device profile, shapes, jobs of
evidence, expiry), and both as `Section`s of table cells, which report_text and report_html render.
The memory is the fleet's state when the report is made, not the week's: a report of an earlier week
still shows what jobs start with now. At most MEMORY_ROWS rows per list.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Engine

from stitchfleet.telemetry import database, fleet_quarantine, queries
from stitchfleet.telemetry.queries import Quarantined
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict

MEMORY_ROWS = 50
QUARANTINE_HEADER = ("Fingerprint", "Quarantined since (UTC)", "First job", "Reason")
QUARANTINE_NUMERIC = (False, False, False, False)
SLOWER_HEADER = ("Fingerprint", "Device profile", "Shapes", "Jobs of evidence", "Expires (UTC)")
SLOWER_NUMERIC = (False, False, False, True, False)
TIME = "%Y-%m-%d %H:%M"


@dataclass(frozen=True)
class MemoryView:
    """The fleet's memory at `read_at`: both lists, and the rule the slower one follows."""

    read_at: dt.datetime
    quarantined: tuple[Quarantined, ...]
    slower: tuple[SlowerVerdict, ...]
    min_jobs: int
    ttl: dt.timedelta


@dataclass(frozen=True)
class Section:
    """One list as a report shows it: title, a sentence, table cells, what to say when empty, cut rows."""

    title: str
    lede: str
    header: tuple[str, ...]
    rows: list[list[str]]
    numeric: tuple[bool, ...]
    empty: str
    more: int


def read(target: Engine | str | None, *, now: dt.datetime, min_jobs: int, ttl: dt.timedelta) -> MemoryView:
    """Both lists from the database; DatabaseError (one line) when it cannot be read."""
    try:
        quarantined = queries.quarantined(target) + _corroborated(target, min_jobs)
        slower = queries.slower_verdicts(target, now=now, min_jobs=min_jobs, ttl=ttl)
    except database.DatabaseError:
        raise
    except Exception as err:
        where = target if isinstance(target, str) else database.resolve_url(None)
        raise database.DatabaseError(database.describe_failure(where, err)) from None
    return MemoryView(now, tuple(quarantined), tuple(slower), min_jobs, ttl)


def _corroborated(target: Engine | str | None, min_jobs: int) -> list[Quarantined]:
    """The reverts the fleet holds from its jobs' evidence (fleet_quarantine), not from a `clusters` row:
    since the earliest revert counted, in that job."""
    engine = target if isinstance(target, Engine) else database.connect(target)
    try:
        listed = fleet_quarantine.entries(engine, fleet_quarantine.Rule(min_jobs))
    finally:
        if engine is not target:
            engine.dispose()
    found = []
    for entry in listed:
        if entry.scope == "corroborated":
            first = min(entry.evidence, key=lambda item: item.at)
            job = f"{first.namespace}/{first.job_name}"
            reason = f"{len(entry.namespaces)} namespaces' jobs: {first.reason}".rstrip(": ")
            found.append(Quarantined(entry.fingerprint, first.at, job, reason))
    return found


def sections(view: MemoryView) -> list[Section]:
    """The quarantine, then the slower verdicts, each cut at MEMORY_ROWS rows."""
    quarantine = [
        [q.fingerprint, q.reverted_at.astimezone(dt.UTC).strftime(TIME), q.job, q.reason]
        for q in view.quarantined[:MEMORY_ROWS]
    ]
    slower = [
        [v.fingerprint, v.profile, v.shapes, f"{v.jobs:,}", v.expires.astimezone(dt.UTC).strftime(TIME)]
        for v in view.slower[:MEMORY_ROWS]
    ]
    days = view.ttl / dt.timedelta(days=1)
    return [
        Section(
            "Fleet memory: quarantined for a numeric mismatch",
            "Every job starts these clusters off, on any device and at any shapes, for good.",
            QUARANTINE_HEADER,
            quarantine,
            QUARANTINE_NUMERIC,
            "No cluster is quarantined.",
            len(view.quarantined) - len(quarantine),
        ),
        Section(
            "Fleet memory: slower than TF",
            f"Found slower by at least {view.min_jobs} jobs within {days:g} days of each other, with none faster"
            f" since; jobs on that device profile at those shapes start the cluster off, unprobed, until it"
            f" expires ({days:g} days after the latest finding), then probe it again.",
            SLOWER_HEADER,
            slower,
            SLOWER_NUMERIC,
            "No cluster is slower on any device profile.",
            len(view.slower) - len(slower),
        ),
    ]


def more(section: Section) -> str:
    """A note under a cut list ("" when nothing was cut)."""
    return f"{section.more:,} more not listed." if section.more else ""
