"""The fleet's `slower` verdicts: derived from several jobs' probe findings, never from one job's.

Input: probe findings (`Finding`: one job's outcome, slower or faster, for a cluster fingerprint on a
device profile at given input shapes, and when), the time now, the jobs needed (STITCHFLEET_SLOWER_JOBS)
and the verdict's lifetime (STITCHFLEET_SLOWER_TTL_DAYS). Output: `SlowerVerdict`s: (fingerprint,
profile, shapes) found slower than TF's own ops, by how many jobs, until when; and their JSON form,
which the operator answers a pod with and the pod caches.

The rule, per (fingerprint, profile, shapes): a faster finding clears every slower finding before it;
of the slower findings after the last faster one, those within TTL of the latest count, one per job;
with at least `min_jobs` jobs the key is slower until TTL after its latest finding. So one noisy run
never turns a cluster off for others, two noisy runs a month apart do not either, and once a verdict
expires jobs probe the cluster again: their findings renew it (with another job's within TTL) or
clear it. Standard library only: a pod without SQLAlchemy reads these.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stitchfleet.telemetry.kinds import ProbeOutcome

Key = tuple[str, str, str]  # fingerprint, device profile, shape signature


@dataclass(frozen=True)
class Finding:
    """One job's probe outcome for a key; `job` is any value naming the job (its database id)."""

    fingerprint: str
    profile: str
    shapes: str
    job: Hashable
    outcome: str
    at: dt.datetime
    namespace: str = ""

    @property
    def key(self) -> Key:
        return (self.fingerprint, self.profile, self.shapes)


@dataclass(frozen=True)
class SlowerVerdict:
    """A key the fleet found slower than TF: `jobs` jobs' evidence, until `expires` (UTC)."""

    fingerprint: str
    profile: str
    shapes: str
    jobs: int
    expires: dt.datetime
    outcome: str = ProbeOutcome.SLOWER  # a faster verdict (`derive(..., outcome=FASTER)`) has the same form

    @property
    def key(self) -> Key:
        return (self.fingerprint, self.profile, self.shapes)

    @property
    def reason(self) -> str:
        """Why a job starts the cluster off (or keeps it unprobed), e.g. "fleet: slower on cpu:Xeon x8 for these
        shapes per 3 jobs, until 2026-11-30 02:00 UTC"."""
        until = self.expires.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"fleet: {self.outcome} on {self.profile} for these shapes per {self.jobs} jobs, until {until}"

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "fingerprint": self.fingerprint,
            "profile": self.profile,
            "shapes": self.shapes,
            "jobs": self.jobs,
            "expires": self.expires.isoformat(),
        }
        if self.outcome != ProbeOutcome.SLOWER:  # the operator's answers and older caches carry slower ones only
            found["outcome"] = str(self.outcome)
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SlowerVerdict:
        """The verdict back from `to_json`; ValueError naming the problem."""
        try:
            texts = [data["fingerprint"], data["profile"], data["shapes"]]
            jobs, expires = data["jobs"], dt.datetime.fromisoformat(str(data["expires"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"slower verdict without {err}") from None
        if not all(isinstance(text, str) for text in texts) or not isinstance(jobs, int):
            raise ValueError(f"malformed slower verdict: {str(dict(data))[:200]}")
        if expires.tzinfo is None:
            raise ValueError(f"slower verdict expires without a timezone: {data['expires']!r}")
        outcome = data.get("outcome", ProbeOutcome.SLOWER)
        if outcome not in {o.value for o in ProbeOutcome}:
            raise ValueError(f"verdict with an unknown outcome {outcome!r}")
        return cls(texts[0], texts[1], texts[2], jobs, expires, ProbeOutcome(outcome))


def window_start(now: dt.datetime, ttl: dt.timedelta) -> dt.datetime:
    """The oldest finding that can still matter: a live verdict's latest finding is within TTL of now, and
    the findings counted with it (and a faster one clearing them) within TTL before that."""
    return now - 2 * ttl


def derive(
    findings: Iterable[Finding],
    now: dt.datetime,
    min_jobs: int,
    ttl: dt.timedelta,
    min_namespaces: int = 1,
    *,
    outcome: ProbeOutcome = ProbeOutcome.SLOWER,
) -> list[SlowerVerdict]:
    """The live slower verdicts (see the module docstring), ordered by fingerprint, profile, shapes;
    with `min_namespaces` > 1 the counted jobs must also span that many namespaces (the operator's
    fleet-wide rule: jobs of one namespace speak for that namespace only). With `outcome` FASTER, the
    faster verdicts by the mirror rule (a slower finding clears the faster ones before it): what lets a
    job skip a probe whose answer the fleet already has (`control.controller`)."""
    by_key: dict[Key, list[Finding]] = {}
    for finding in findings:
        by_key.setdefault(finding.key, []).append(finding)
    verdicts = []
    for key in sorted(by_key):
        verdict = _verdict(key, by_key[key], now, max(min_jobs, 1), ttl, min_namespaces, outcome)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def _verdict(  # noqa: PLR0917 (derive's arguments, passed on)
    key: Key,
    findings: list[Finding],
    now: dt.datetime,
    min_jobs: int,
    ttl: dt.timedelta,
    min_namespaces: int,
    outcome: ProbeOutcome,
) -> SlowerVerdict | None:
    other = ProbeOutcome.FASTER if outcome == ProbeOutcome.SLOWER else ProbeOutcome.SLOWER
    clearing = [f.at for f in findings if f.outcome == other]
    cleared = max(clearing) if clearing else None
    slower = [f for f in findings if f.outcome == outcome and (cleared is None or f.at > cleared)]
    if not slower:
        return None
    latest = max(f.at for f in slower)
    expires = latest + ttl
    counted = [f for f in slower if f.at >= latest - ttl]
    jobs = {f.job for f in counted}
    if len(jobs) < min_jobs or len({f.namespace for f in counted}) < min_namespaces or now >= expires:
        return None
    return SlowerVerdict(*key, jobs=len(jobs), expires=expires, outcome=outcome)


@dataclass(frozen=True)
class Remembered:
    """What one job may read of the fleet's memory: the reverted fingerprints (the numeric quarantine) and
    the live speed verdicts, keys found slower and keys found faster (the same rule, mirrored)."""

    reverted: frozenset[str] = frozenset()
    slower: tuple[SlowerVerdict, ...] = ()
    faster: tuple[SlowerVerdict, ...] = ()


def live(verdicts: Iterable[SlowerVerdict], now: dt.datetime) -> tuple[SlowerVerdict, ...]:
    """The verdicts not yet expired at `now` (a pod's cached copy ages)."""
    return tuple(verdict for verdict in verdicts if verdict.expires > now)
