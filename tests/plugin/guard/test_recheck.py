"""A revert carries its evidence, and `stitchfleet fleet recheck FINGERPRINT` judges it again offline.

Issue 30 item 3: one job's mismatch quarantined a cluster for every team, for good, with no way to look
again. A revert's telemetry detail now holds the inputs' digest and a sample, both results at the worst
output and the rule (`guard/evidence.py`); the recheck re-runs the guard's rule in float64 from the kept
values and, when every revert passes, clears the quarantine with an audit event (who, why). A true
mismatch, a revert without evidence, or evidence whose blob is gone keeps the quarantine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from stitchfleet import cli
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, load
from stitchfleet.plugin.guard import evidence, recheck
from stitchfleet.plugin.guard.numeric import Finding, judge
from stitchfleet.telemetry import database, queries
from stitchfleet.telemetry import models as tables
from stitchfleet.telemetry.rows import ClusterVerdict, Event, JobKey, JobStarted
from stitchfleet.telemetry.store import write_rows

WORKLOAD = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads" / "transformer_block" / "cluster_03.json"
FP = "0f" * 16
JOB = JobKey("c1", "team-a", "bert", "uid-1")


def _values(graph: Graph, scale: float) -> tuple[list[Any], list[Any], list[Any]]:
    """A check step's values: TF's result is numpy's float32 evaluation, the stitched one scaled by `scale`."""
    given = random_inputs(graph, 3)
    names = [str(p.attrs["name"]) for p in graph.parameters]
    outputs = [name for name, _ in graph.outputs]
    tf_like = evaluate(graph, given)
    stitched = [np.asarray(tf_like[n]) * np.float32(scale) for n in outputs]
    return [given[n] for n in names], [np.asarray(tf_like[n]) for n in outputs], stitched


def _reverted(url: str, detail: str) -> None:
    """What a job's revert writes: its revert event (with `detail`) and the fleet's `reverted` verdict."""
    rows = [JobStarted(JOB), Event(JOB, "revert", 0, 12, FP, "mismatch", detail), ClusterVerdict(FP, "reverted", "x")]
    engine = database.connect(url)
    with engine.begin() as connection:
        write_rows(connection, rows)
    engine.dispose()


def _kept(tmp: Path, scale: float, reason: str = "") -> tuple[str, Finding]:
    graph = load(WORKLOAD)
    inputs, original, stitched = _values(graph, scale)
    finding = judge(graph, inputs, original, stitched, 8.0)
    if reason:  # a revert judged by an older, wrong rule: its values are right, its finding was not
        finding = dataclasses.replace(finding, ok=False, reason=reason)
    kept = evidence.kept(evidence.captured(graph, inputs, original, stitched, 8.0), finding, tmp / "evidence")
    return dataclasses.replace(finding, evidence=kept).detail, finding


@pytest.fixture
def url(tmp_path: Path) -> str:
    found = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(found)
    return found


def test_a_revert_keeps_its_evidence(tmp_path: Path) -> None:
    detail, finding = _kept(tmp_path, 1.01)
    assert not finding.ok
    doc = evidence.parsed(detail)
    assert doc is not None and detail.startswith(finding.reason)
    assert len(doc["digest"]) == 64 and doc["inputs"] and doc["inputs"][0]["first"]
    assert doc["tf"]["first"] != doc["stitched"]["first"] and doc["rule"]["factor"] == 8.0
    assert Path(doc["path"]).is_file() and "blob" not in doc  # 2 MiB of inputs: the file only
    again = evidence.recheck(evidence.loaded(doc))
    assert not again.ok and again.output == finding.output


def test_small_evidence_is_inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evidence, "INLINE_MAX", 64 << 20)
    detail, finding = _kept(tmp_path, 1.01)
    doc = evidence.parsed(detail)
    assert doc is not None and "blob" in doc
    Path(doc["path"]).unlink()  # the database alone is enough
    assert evidence.recheck(evidence.loaded(doc)).reason == finding.reason


def test_a_false_quarantine_is_cleared_with_an_audit_event(tmp_path: Path, url: str) -> None:
    detail, _ = _kept(tmp_path, 1.0, reason="error 0.00105 exceeds 8 x native error (4.77e-07 allowed)")
    _reverted(url, detail)
    assert FP in queries.reverted_fingerprints(url)
    status = cli.main(["fleet", "recheck", FP, "--db", url, "--by", "alice", "--why", "ref variables fix"])
    assert status == 0
    assert FP not in queries.reverted_fingerprints(url)
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        verdict = connection.execute(
            sa.select(tables.Cluster.verdict).where(tables.Cluster.fingerprint == FP)
        ).scalar_one()
        cleared = connection.execute(sa.select(tables.Event).where(tables.Event.kind == "quarantine_cleared")).all()
    engine.dispose()
    assert verdict == "cleared"
    assert len(cleared) == 1 and "alice" in cleared[0].detail and "ref variables fix" in cleared[0].detail
    # a later revert of the same fingerprint quarantines it again
    _reverted(url, detail)
    assert FP in queries.reverted_fingerprints(url)


def test_a_true_mismatch_keeps_the_quarantine(tmp_path: Path, url: str) -> None:
    detail, _ = _kept(tmp_path, 1.01)
    _reverted(url, detail)
    done = recheck.recheck(FP, url, "bob", "try")
    assert not done.cleared and done.findings and not done.findings[0].ok
    assert FP in queries.reverted_fingerprints(url)


def test_no_evidence_keeps_the_quarantine(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reverted(url, "error 0.00105 exceeds 8 x native error")
    done = recheck.recheck(FP, url, "bob", "try")
    assert not done.cleared and done.missing and FP in queries.reverted_fingerprints(url)
    monkeypatch.setattr(evidence, "INLINE_MAX", 0)  # a large blob: only its file, and the file is gone
    detail, _ = _kept(tmp_path, 1.0, reason="older rule")
    doc = evidence.parsed(detail)
    assert doc is not None and "blob" not in doc
    Path(doc["path"]).unlink()
    _reverted(url, detail)
    done = recheck.recheck(FP, url, "bob", "try")
    assert not done.cleared and any("cannot be read" in why for why in done.missing)


@pytest.mark.tf
def test_a_jobs_numeric_revert_carries_evidence_that_a_recheck_confirms(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    from stitchfleet.plugin.native.faults import Fault
    from tests.plugin.hook_harness import events, hooked, train

    hook, url = hooked(tmp_path, "evidence", Fault("constant", cluster=5))
    train(12, hook)
    reverts = [e for e in events(url, "revert") if e.cluster_fingerprint]
    assert reverts, "the corrupted cluster was reverted"
    doc = evidence.parsed(reverts[0].detail)
    assert doc is not None and doc["reason"] in reverts[0].detail and len(doc["digest"]) == 64
    done = recheck.recheck(reverts[0].cluster_fingerprint, url, "carol", "a true fault")
    assert done.findings and not done.findings[0].ok and not done.cleared
