"""Read helpers other components need from the ledger: the fleet's memory of its clusters.

Input: an Engine (or a URL); for the slower verdicts the time now, the jobs needed and their TTL.
Output: plain Python values: the cluster fingerprints reverted anywhere in the fleet (numeric
mismatch: quarantined fleet-wide, sticky), which the plugin starts off in later jobs; the same with
when and in which job (the report); the live `slower` verdicts (telemetry.slow_verdicts), derived
from the jobs' probe findings of the last two TTLs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from stitchfleet.telemetry import database, models
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import Finding, SlowerVerdict, derive, window_start


@dataclass(frozen=True)
class Quarantined:
    """A fingerprint reverted for the fleet: when it first was (its earliest revert event) and in which job."""

    fingerprint: str
    reverted_at: dt.datetime
    job: str
    reason: str


@contextmanager
def _connected(target: Engine | str | None) -> Iterator[Connection]:
    engine = target if isinstance(target, Engine) else database.connect(target)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        if engine is not target:
            engine.dispose()


def _read(target: Engine | str | None, read: Callable[[Connection], Any]) -> Any:
    with _connected(target) as connection:
        return read(connection)


def reverted_fingerprints(target: Engine | str | None = None) -> set[str]:
    """Fingerprints whose fleet verdict is `reverted` (an engine, a URL, or the settings' database)."""
    query = select(models.Cluster.fingerprint).where(models.Cluster.verdict == models.Verdict.REVERTED.value)
    return set(_read(target, lambda connection: connection.execute(query).scalars().all()))


def quarantined(target: Engine | str | None = None) -> list[Quarantined]:
    """Every reverted fingerprint with its earliest revert event (when, which job); by time, then fingerprint.
    A fingerprint with no revert event (its event not shipped yet) shows its verdict's time and no job."""
    cluster, event, job = models.Cluster, models.Event, models.Job
    first = (
        select(event.cluster_fingerprint, func.min(event.occurred_at).label("first_at"))
        .where(event.kind == models.EventKind.REVERT.value, event.cluster_fingerprint.is_not(None))
        .group_by(event.cluster_fingerprint)
        .subquery()
    )
    reverts = (event.cluster_fingerprint == cluster.fingerprint) & (event.occurred_at == first.c.first_at)
    query = (
        select(cluster.fingerprint, cluster.updated_at, cluster.reason, event.occurred_at, job.namespace, job.job_name)
        .outerjoin(first, first.c.cluster_fingerprint == cluster.fingerprint)
        .outerjoin(event, reverts & (event.kind == models.EventKind.REVERT.value))
        .outerjoin(job, job.id == event.job_id)
        .where(cluster.verdict == models.Verdict.REVERTED.value)
        .order_by(cluster.fingerprint, job.namespace, job.job_name)
    )
    rows = _read(target, lambda connection: connection.execute(query).all())
    found: dict[str, Quarantined] = {}
    for fp, updated, reason, occurred, namespace, name in rows:  # two jobs reverting at one instant: the first
        job_text = f"{namespace}/{name}" if name else "-"
        found.setdefault(fp, Quarantined(fp, occurred or updated, job_text, reason))
    return sorted(found.values(), key=lambda q: (q.reverted_at, q.fingerprint))


def slower_verdicts(
    target: Engine | str | None,
    *,
    now: dt.datetime,
    min_jobs: int,
    ttl: dt.timedelta,
    min_namespaces: int = 1,
    namespace: str | None = None,
    outcome: ProbeOutcome = ProbeOutcome.SLOWER,
) -> list[SlowerVerdict]:
    """The live `slower` verdicts at `now` (slow_verdicts.derive over the findings that can matter);
    `namespace`: that namespace's findings only; `outcome` FASTER: the faster verdicts instead."""
    probe, job = models.ProbeVerdict, models.Job
    query = select(
        probe.fingerprint, probe.profile, probe.shapes, probe.job_id, probe.outcome, probe.recorded_at, job.namespace
    ).join(job, job.id == probe.job_id)
    query = query.where(probe.recorded_at >= window_start(now, ttl))
    if namespace is not None:
        query = query.where(job.namespace == namespace)
    rows = _read(target, lambda connection: connection.execute(query).all())
    return derive((Finding(*row) for row in rows), now, min_jobs, ttl, min_namespaces, outcome=outcome)


@dataclass(frozen=True)
class Revert:
    """One job's revert of a cluster: its detail (with the evidence line, when kept) and the job's key."""

    detail: str
    occurred_at: dt.datetime
    cluster: str
    namespace: str
    job_name: str
    job_uid: str


def reverts_of(fingerprint: str, target: Engine | str | None = None) -> list[Revert]:
    """The revert events of a fingerprint, latest first (a recheck judges the evidence they kept)."""
    event, job = models.Event, models.Job
    query = (
        select(event.detail, event.occurred_at, job.cluster, job.namespace, job.job_name, job.job_uid)
        .join(job, job.id == event.job_id)
        .where(event.kind == models.EventKind.REVERT.value, event.cluster_fingerprint == fingerprint)
        .order_by(event.occurred_at.desc(), event.id.desc())
    )
    return [Revert(*row) for row in _read(target, lambda connection: connection.execute(query).all())]
