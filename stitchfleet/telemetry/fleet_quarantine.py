"""The fleet's quarantine of reverted clusters: what a job reads, and what an admin may change.

Input: an engine; a caller's namespace and job uid (a pod's read) or nothing (an admin's view); how
many jobs and namespaces corroborate. Output: `reverted_for` (the fingerprints a job starts with
off), `entries` (every fingerprint with evidence or a standing, its scope and evidence), and
`clear`/`confirm`, which write the fleet's standing with an audit Event saying who and why. The
rules (a job's revert applies to its job and namespace at once, to the fleet when corroborated or
confirmed; a clear discounts the evidence before it) are in docs/fleet-quarantine.md.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select

from stitchfleet.telemetry import models, store
from stitchfleet.telemetry.kinds import EventKind, Verdict
from stitchfleet.telemetry.rows import ClusterVerdict, Event, JobKey, Row, utcnow

# The pseudo job admin actions are recorded under (events belong to a job).
AUDIT_NAMESPACE, AUDIT_JOB, AUDIT_UID = "stitchfleet-admin", "fleet-quarantine", "audit"
MAX_REASON = 500


@dataclass(frozen=True)
class Evidence:
    """One job's revert of a fingerprint."""

    fingerprint: str
    namespace: str
    job_name: str
    job_uid: str
    reason: str
    at: dt.datetime


@dataclass(frozen=True)
class Entry:
    """A fingerprint's standing for an admin: `scope` is confirmed (an admin or a pre-0005 row), corroborated
    (jobs of several namespaces), namespace (one namespace's jobs only), or cleared (nothing since the clear)."""

    fingerprint: str
    scope: str
    reason: str
    updated_at: dt.datetime | None
    evidence: tuple[Evidence, ...]

    @property
    def namespaces(self) -> list[str]:
        return sorted({item.namespace for item in self.evidence})


@dataclass(frozen=True)
class Rule:
    """How much evidence makes a revert fleet-wide."""

    min_jobs: int = 2
    min_namespaces: int = 2

    def corroborated(self, evidence: Sequence[Evidence]) -> bool:
        jobs = {(item.namespace, item.job_uid) for item in evidence}
        return len(jobs) >= self.min_jobs and len({item.namespace for item in evidence}) >= self.min_namespaces


def _standings(connection: Connection) -> dict[str, tuple[str, str, dt.datetime]]:
    cluster = models.Cluster
    query = select(cluster.fingerprint, cluster.verdict, cluster.reason, cluster.updated_at).where(
        cluster.verdict.in_([Verdict.REVERTED.value, Verdict.CLEARED.value])
    )
    return {fingerprint: (verdict, reason, at) for fingerprint, verdict, reason, at in connection.execute(query)}


def _evidence(connection: Connection) -> list[Evidence]:
    verdict, job = models.JobVerdict, models.Job
    query = (
        select(verdict.fingerprint, job.namespace, job.job_name, job.job_uid, verdict.reason, verdict.recorded_at)
        .join(job, job.id == verdict.job_id)
        .where(verdict.verdict == Verdict.REVERTED.value)
        .order_by(verdict.fingerprint, verdict.recorded_at)
    )
    return [Evidence(*row) for row in connection.execute(query)]


def _since_clear(evidence: Sequence[Evidence], standing: tuple[str, str, dt.datetime] | None) -> list[Evidence]:
    if standing is None or standing[0] != Verdict.CLEARED.value:
        return list(evidence)
    return [item for item in evidence if item.at > standing[2]]


def _grouped(evidence: Sequence[Evidence]) -> dict[str, list[Evidence]]:
    grouped: dict[str, list[Evidence]] = {}
    for item in evidence:
        grouped.setdefault(item.fingerprint, []).append(item)
    return grouped


def reverted_for(engine: Engine, namespace: str, job_uid: str, rule: Rule | None = None) -> set[str]:
    """The fingerprints the job (namespace, job_uid) starts with off: the fleet's (confirmed or
    corroborated), its namespace's since the last clear, and its own job's always."""
    rule = rule or Rule()
    with engine.connect() as connection:
        standings, evidence = _standings(connection), _evidence(connection)
    found = {fingerprint for fingerprint, (verdict, _, _) in standings.items() if verdict == Verdict.REVERTED.value}
    for fingerprint, items in _grouped(evidence).items():
        live = _since_clear(items, standings.get(fingerprint))
        own = any(item.namespace == namespace and item.job_uid == job_uid for item in items)
        if own or any(item.namespace == namespace for item in live) or rule.corroborated(live):
            found.add(fingerprint)
    return found


def entries(engine: Engine, rule: Rule | None = None) -> list[Entry]:
    """Every fingerprint with a standing or revert evidence, by fingerprint (the admin's list)."""
    rule = rule or Rule()
    with engine.connect() as connection:
        standings, evidence = _standings(connection), _evidence(connection)
    grouped = _grouped(evidence)
    listed = []
    for fingerprint in sorted(set(standings) | set(grouped)):
        standing = standings.get(fingerprint)
        live = _since_clear(grouped.get(fingerprint, []), standing)
        verdict, reason, at = standing if standing is not None else ("", "", None)
        if verdict == Verdict.REVERTED.value:
            scope = "confirmed"
        elif rule.corroborated(live):
            scope = "corroborated"
        elif live:
            scope = "namespace"
        else:
            scope = "cleared"
        listed.append(Entry(fingerprint, scope, reason, at, tuple(live)))
    return listed


def audit_job(cluster: str) -> JobKey:
    """The pseudo job admin actions are recorded under."""
    return JobKey(cluster, AUDIT_NAMESPACE, AUDIT_JOB, AUDIT_UID)


def clear(engine: Engine, fingerprint: str, *, actor: str, why: str, cluster: str) -> None:
    """Clears `fingerprint` fleet-wide: a `cleared` standing and a quarantine_cleared Event (who, why)."""
    _act(
        engine, fingerprint, (Verdict.CLEARED, EventKind.QUARANTINE_CLEARED), f"{actor.strip()}: {why.strip()}", cluster
    )


def confirm(engine: Engine, fingerprint: str, *, actor: str, why: str, cluster: str) -> None:
    """Makes `fingerprint` reverted fleet-wide: a `reverted` standing and a quarantine_confirmed Event."""
    _act(
        engine,
        fingerprint,
        (Verdict.REVERTED, EventKind.QUARANTINE_CONFIRMED),
        f"{actor.strip()}: {why.strip()}",
        cluster,
    )


def _act(engine: Engine, fingerprint: str, action: tuple[Verdict, EventKind], who_why: str, cluster: str) -> None:
    verdict, kind = action
    actor, _, why = who_why.partition(": ")
    if not actor or not why:
        raise ValueError("an admin action needs who (--by) and why (--reason)")
    detail = who_why[:MAX_REASON]
    now = utcnow()
    rows: list[Row] = [
        ClusterVerdict(fingerprint, verdict.value, reason=f"{verdict.value} by {detail}", updated_at=now),
        Event(
            audit_job(cluster),
            kind.value,
            cluster_fingerprint=fingerprint,
            reason="admin",
            detail=detail,
            occurred_at=now,
        ),
    ]
    with engine.begin() as connection:
        store.write_rows(connection, rows)


def audit_trail(
    engine: Engine, fingerprint: str | None = None, limit: int = 50
) -> list[tuple[dt.datetime, str, str, str]]:
    """The latest clear and confirm events (when, kind, fingerprint, who: why), newest first."""
    event = models.Event
    kinds = [EventKind.QUARANTINE_CLEARED.value, EventKind.QUARANTINE_CONFIRMED.value]
    query = select(event.occurred_at, event.kind, event.cluster_fingerprint, event.detail).where(event.kind.in_(kinds))
    if fingerprint is not None:
        query = query.where(event.cluster_fingerprint == fingerprint)
    query = query.order_by(event.occurred_at.desc()).limit(limit)
    with engine.connect() as connection:
        return [(at, kind, fp or "", detail) for at, kind, fp, detail in connection.execute(query)]
