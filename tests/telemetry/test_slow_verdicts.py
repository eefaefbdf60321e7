"""The fleet's slower verdicts: derived from several jobs' probe findings, cleared by a faster one, expiring.

The rule on findings in memory (slow_verdicts.derive), then the same through the store and the
query on SQLite and PostgreSQL (probe_verdicts rows written as pods' batches are, read back as the
operator and a local job read them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from stitchfleet.telemetry import database, queries
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import Finding, SlowerVerdict, derive, live
from tests.telemetry.workload import T0, job_key, write

TTL = dt.timedelta(days=7)
FP, CPU, SHAPES = "fp-gelu", "cpu:Xeon x8", "f32[32,768]"


def _found(job: str, outcome: str, at: dt.datetime, shapes: str = SHAPES, profile: str = CPU) -> Finding:
    return Finding(FP, profile, shapes, job, outcome, at)


def test_one_job_is_not_enough_and_two_jobs_make_a_verdict_until_ttl_after_the_latest() -> None:
    one = [_found("a", "slower", T0)]
    assert derive(one, T0 + dt.timedelta(hours=1), 2, TTL) == []
    # the same job again (a rank, a retried batch, a second probe) is still one job
    assert derive([*one, _found("a", "slower", T0 + dt.timedelta(hours=2))], T0 + dt.timedelta(hours=3), 2, TTL) == []
    two = [*one, _found("b", "slower", T0 + dt.timedelta(days=1))]
    [verdict] = derive(two, T0 + dt.timedelta(days=2), 2, TTL)
    assert verdict == SlowerVerdict(FP, CPU, SHAPES, 2, T0 + dt.timedelta(days=8))
    assert verdict.reason == f"fleet: slower on {CPU} for these shapes per 2 jobs, until 2026-11-24 08:00 UTC"
    assert derive(two, T0 + dt.timedelta(days=2), 3, TTL) == []  # the setting asks for three


def test_a_later_faster_finding_clears_the_slower_ones_before_it() -> None:
    slower = [_found("a", "slower", T0), _found("b", "slower", T0 + dt.timedelta(hours=1))]
    cleared = [*slower, _found("c", "faster", T0 + dt.timedelta(hours=2))]
    assert derive(cleared, T0 + dt.timedelta(hours=3), 2, TTL) == []
    # a faster finding before them does not: the slower ones came after it
    earlier = [_found("c", "faster", T0 - dt.timedelta(hours=1)), *slower]
    assert [v.jobs for v in derive(earlier, T0 + dt.timedelta(hours=3), 2, TTL)] == [2]
    # after a clearing, two new jobs are needed again
    again = [*cleared, _found("d", "slower", T0 + dt.timedelta(hours=4))]
    assert derive(again, T0 + dt.timedelta(hours=5), 2, TTL) == []


def test_a_verdict_expires_and_findings_further_apart_than_the_ttl_do_not_add_up() -> None:
    two = [_found("a", "slower", T0), _found("b", "slower", T0 + dt.timedelta(hours=1))]
    assert derive(two, T0 + dt.timedelta(days=7), 2, TTL)  # 7 days after the first, 1 hour before expiry
    assert derive(two, T0 + dt.timedelta(days=7, hours=1), 2, TTL) == []  # expired: jobs probe it again
    # two noisy runs a month apart are not two jobs' evidence
    apart = [_found("a", "slower", T0), _found("b", "slower", T0 + dt.timedelta(days=30))]
    assert derive(apart, T0 + dt.timedelta(days=30, hours=1), 2, TTL) == []
    # a re-probe after expiry that finds it slower again renews it with another job's finding within TTL
    renewed = [*two, _found("c", "slower", T0 + dt.timedelta(days=6))]
    [verdict] = derive(renewed, T0 + dt.timedelta(days=8), 2, TTL)
    assert verdict.jobs == 3 and verdict.expires == T0 + dt.timedelta(days=13)
    assert live([verdict], T0 + dt.timedelta(days=13)) == ()


def test_another_profile_or_other_shapes_are_another_verdict() -> None:
    mixed = [
        _found("a", "slower", T0),
        _found("b", "slower", T0, shapes="f32[64,768]"),
        _found("c", "slower", T0, profile="cuda:NVIDIA H100"),
    ]
    assert derive(mixed, T0 + dt.timedelta(hours=1), 2, TTL) == []


def test_the_json_form_round_trips_and_refuses_what_is_malformed() -> None:
    verdict = SlowerVerdict(FP, CPU, SHAPES, 3, T0 + TTL)
    assert SlowerVerdict.from_json(verdict.to_json()) == verdict
    for broken in ({}, {**verdict.to_json(), "jobs": "3"}, {**verdict.to_json(), "expires": "2026-11-30T00:00:00"}):
        with pytest.raises(ValueError, match="slower verdict"):
            SlowerVerdict.from_json(broken)


def _probe(uid: str, outcome: str, at: dt.datetime) -> r.ProbeVerdict:
    return r.ProbeVerdict(job_key(uid), FP, CPU, SHAPES, outcome, f"{outcome} in {uid}", recorded_at=at)


def test_the_database_derives_the_same_verdicts_from_stored_findings(any_url: str) -> None:
    database.upgrade(any_url)
    now = T0 + dt.timedelta(days=1)

    def slower() -> list[SlowerVerdict]:
        return queries.slower_verdicts(any_url, now=now, min_jobs=2, ttl=TTL)

    write(any_url, [_probe("run-1", "slower", T0), _probe("run-1", "slower", T0)])  # two ranks, one job
    assert slower() == []
    write(any_url, [_probe("run-2", "slower", T0 + dt.timedelta(hours=1))])
    assert slower() == [SlowerVerdict(FP, CPU, SHAPES, 2, T0 + dt.timedelta(hours=1) + TTL)]
    # a replayed older batch never overwrites a job's later finding
    write(any_url, [_probe("run-3", "faster", T0 + dt.timedelta(hours=2))])
    write(any_url, [_probe("run-3", "slower", T0 - dt.timedelta(days=1))])
    assert slower() == []
    # findings older than two TTLs are not even read
    assert queries.slower_verdicts(any_url, now=T0 + dt.timedelta(days=30), min_jobs=2, ttl=TTL) == []


def test_the_quarantine_names_when_and_which_job_first_reverted(any_url: str) -> None:
    from tests.telemetry.workload import workload

    database.upgrade(any_url)
    write(any_url, workload("run-1", windows=4, ranks=1))  # reverts fp-ln-bwd at T0, enables fp-gelu
    [entry] = queries.quarantined(any_url)
    assert (entry.fingerprint, entry.reverted_at, entry.job) == ("fp-ln-bwd", T0, "vision/resnet-train")
    assert entry.reason == "numeric_mismatch"


def test_the_quarantine_names_the_earliest_revert_whatever_order_it_arrived_in(sqlite_url: str) -> None:
    database.upgrade(sqlite_url)
    later = r.Event(job_key("run-late"), "revert", cluster_fingerprint="fp", reason="mismatch", occurred_at=T0 + TTL)
    write(sqlite_url, [later, r.ClusterVerdict("fp", "reverted", "mismatch: max error 3 > allowed 1e-3")])
    earlier = dataclasses.replace(later, job=r.JobKey("gpu-east", "nlp", "bert", "run-early"), occurred_at=T0)
    write(sqlite_url, [dataclasses.replace(earlier, uuid="e-1")])
    [entry] = queries.quarantined(sqlite_url)
    assert (entry.reverted_at, entry.job, entry.reason) == (T0, "nlp/bert", "mismatch: max error 3 > allowed 1e-3")


def test_a_local_pod_reads_the_same_memory_with_sqlite3_alone(sqlite_url: str) -> None:
    """`plugin.local_memory` (a job's `begin` outside Kubernetes imports no SQLAlchemy) finds the verdicts and
    reverted fingerprints the SQLAlchemy queries find, by the same rule."""
    from stitchfleet.plugin.fleet.local_memory import local_memory

    database.upgrade(sqlite_url)
    now = T0 + dt.timedelta(days=1)
    write(sqlite_url, [_probe("run-1", "slower", T0), _probe("run-2", "slower", T0 + dt.timedelta(hours=1))])
    memory = local_memory(sqlite_url, now=now, min_jobs=2, ttl=TTL)
    assert list(memory.slower) == queries.slower_verdicts(sqlite_url, now=now, min_jobs=2, ttl=TTL)
    assert len(memory.slower) == 1 and memory.reverted == frozenset(queries.reverted_fingerprints(sqlite_url))
    assert local_memory(sqlite_url, now=now, min_jobs=3, ttl=TTL).slower == ()


def test_faster_verdicts_follow_the_mirror_rule_and_round_trip() -> None:
    """What lets a job skip a probe the fleet already answered: two jobs' faster findings make a faster verdict,
    a later slower finding clears it, and its JSON form keeps the outcome (a slower one's stays as it was)."""
    faster = [_found("a", "faster", T0), _found("b", "faster", T0 + dt.timedelta(hours=1))]
    [verdict] = derive(faster, T0 + dt.timedelta(hours=2), 2, TTL, outcome=ProbeOutcome.FASTER)
    assert (verdict.outcome, verdict.jobs) == (ProbeOutcome.FASTER, 2)
    assert verdict.reason.startswith(f"fleet: faster on {CPU} for these shapes per 2 jobs")
    assert derive(faster, T0 + dt.timedelta(hours=2), 2, TTL) == []  # no slower verdict from faster findings
    cleared = [*faster, _found("c", "slower", T0 + dt.timedelta(hours=3))]
    assert derive(cleared, T0 + dt.timedelta(hours=4), 2, TTL, outcome=ProbeOutcome.FASTER) == []
    assert SlowerVerdict.from_json(verdict.to_json()) == verdict
    assert "outcome" not in SlowerVerdict(FP, CPU, SHAPES, 2, T0 + TTL).to_json()
    with pytest.raises(ValueError, match="unknown outcome"):
        SlowerVerdict.from_json({**verdict.to_json(), "outcome": "sideways"})


def test_a_local_pod_reads_the_faster_verdicts_as_the_database_query_does(sqlite_url: str) -> None:
    from stitchfleet.plugin.fleet.local_memory import local_memory

    database.upgrade(sqlite_url)
    now = T0 + dt.timedelta(days=1)
    write(sqlite_url, [_probe("run-1", "faster", T0), _probe("run-2", "faster", T0 + dt.timedelta(hours=1))])
    memory = local_memory(sqlite_url, now=now, min_jobs=2, ttl=TTL)
    found = queries.slower_verdicts(sqlite_url, now=now, min_jobs=2, ttl=TTL, outcome=ProbeOutcome.FASTER)
    assert list(memory.faster) == found and len(found) == 1 and memory.slower == ()
