"""Pods trying to write the fleet's memory: a revert is evidence for its job and namespace, never the fleet's word.

The real server and IngestService on loopback with kmock and the TokenReview fake; pods in three
namespaces post cluster verdicts and probe findings, and read the quarantine as their jobs may. An
admin confirms and clears with telemetry.fleet_quarantine (what `stitchfleet fleet quarantine` runs).
Against the code before issue 31 the first test fails: one pod's "reverted" was every pod's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import kmock
import pytest

from stitchfleet.operator.ingest import QUARANTINE, ROWS
from stitchfleet.telemetry import database, fleet_quarantine
from stitchfleet.telemetry import rows as r
from tests.operator.ingest_harness import CLUSTER, Endpoint, TokenApi, add_pod, declare_pods, job_pod, serving

pytestmark = pytest.mark.timeout(120)
# (namespace, pod, pod uid, job name, job uid)
PODS = {
    "a": ("vision", "a-0", "pod-a", "train-a", "job-a"),
    "a2": ("vision", "a2-0", "pod-a2", "train-a2", "job-a2"),
    "b": ("research", "b-0", "pod-b", "train-b", "job-b"),
    "c": ("speech", "c-0", "pod-c", "train-c", "job-c"),
}


@pytest.fixture
def tokens(kmock: kmock.KubernetesEmulator) -> dict[str, str]:
    declare_pods(kmock)
    api = TokenApi()
    api.serve(kmock)
    issued = {}
    for name, (namespace, pod, pod_uid, job, job_uid) in PODS.items():
        add_pod(kmock, job_pod(namespace, pod, pod_uid, job, job_uid))
        issued[name] = api.issue(namespace, pod, pod_uid)
    return issued


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"


async def post(endpoint: Endpoint, token: str, *rows: r.Row) -> int:
    body = json.dumps({"rows": [r.to_json(row) for row in rows]}).encode()
    status, _ = await asyncio.to_thread(endpoint.call, "POST", ROWS, f"Bearer {token}", body)
    return status


async def reverted(endpoint: Endpoint, token: str) -> set[str]:
    status, answer = await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, f"Bearer {token}")
    assert status == 200, answer
    return set(answer["reverted"])


async def slower(endpoint: Endpoint, token: str) -> set[str]:
    status, answer = await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, f"Bearer {token}")
    assert status == 200, answer
    return {item["fingerprint"] for item in answer["slower"]}


def key(name: str) -> r.JobKey:
    namespace, _, _, job, job_uid = PODS[name]
    return r.JobKey(CLUSTER, namespace, job, job_uid)


@pytest.mark.asyncio
async def test_one_pods_revert_applies_to_its_job_and_namespace_not_the_fleet(
    kmock: kmock.KubernetesEmulator, tokens: dict[str, str], tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        assert await post(endpoint, tokens["a"], r.ClusterVerdict("fp-forged", "reverted", reason="trust me")) == 200
        assert await reverted(endpoint, tokens["a"]) == {"fp-forged"}  # its own job, at once
        assert await reverted(endpoint, tokens["a2"]) == {"fp-forged"}  # its namespace, at once
        assert await reverted(endpoint, tokens["b"]) == set()  # not another namespace's
        assert await reverted(endpoint, tokens["c"]) == set()
        # Two jobs of one namespace are still one namespace's word.
        assert await post(endpoint, tokens["a2"], r.ClusterVerdict("fp-forged", "reverted")) == 200
        assert await reverted(endpoint, tokens["c"]) == set()


@pytest.mark.asyncio
async def test_jobs_of_two_namespaces_make_it_fleet_wide_and_an_admin_clear_undoes_it(
    kmock: kmock.KubernetesEmulator, tokens: dict[str, str], tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        assert await post(endpoint, tokens["a"], r.ClusterVerdict("fp-ln", "reverted")) == 200
        assert await post(endpoint, tokens["b"], r.ClusterVerdict("fp-ln", "reverted")) == 200
        assert await reverted(endpoint, tokens["c"]) == {"fp-ln"}  # corroborated: vision and research
        engine = database.connect(endpoint.url)
        try:
            [entry] = fleet_quarantine.entries(engine)
            assert (entry.scope, entry.namespaces) == ("corroborated", ["research", "vision"])
            fleet_quarantine.clear(engine, "fp-ln", actor="alice", why="fixed in compiler 0.9", cluster=CLUSTER)
            assert await reverted(endpoint, tokens["c"]) == set()
            assert await reverted(endpoint, tokens["a2"]) == set()  # the namespace's evidence predates the clear
            assert await reverted(endpoint, tokens["a"]) == {"fp-ln"}  # a job's own revert holds for it
            [entry] = fleet_quarantine.entries(engine)
            assert entry.scope == "cleared" and entry.reason == "cleared by alice: fixed in compiler 0.9"
            [(_, kind, fingerprint, detail)] = fleet_quarantine.audit_trail(engine)
            assert (kind, fingerprint, detail) == ("quarantine_cleared", "fp-ln", "alice: fixed in compiler 0.9")
            # A pod replaying its old verdict after the clear is still the old evidence: nothing changes.
            assert await post(endpoint, tokens["b"], r.ClusterVerdict("fp-ln", "reverted")) == 200
            assert await reverted(endpoint, tokens["c"]) == set()
        finally:
            engine.dispose()


@pytest.mark.asyncio
async def test_a_confirmed_entry_is_fleet_wide_and_no_pod_can_undo_it(
    kmock: kmock.KubernetesEmulator, tokens: dict[str, str], tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        assert await post(endpoint, tokens["a"], r.ClusterVerdict("fp-gelu", "reverted")) == 200
        engine = database.connect(endpoint.url)
        try:
            fleet_quarantine.confirm(engine, "fp-gelu", actor="bob", why="reproduced on A100", cluster=CLUSTER)
            for name in PODS:
                assert await reverted(endpoint, tokens[name]) == {"fp-gelu"}
            # "enabled" from a pod, even the one that reverted it, and a forged "cleared", change nothing.
            assert await post(endpoint, tokens["a"], r.ClusterVerdict("fp-gelu", "enabled")) == 200
            assert await post(endpoint, tokens["c"], r.ClusterVerdict("fp-gelu", "enabled")) == 200
            forged = {"type": "ClusterVerdict", "fingerprint": "fp-gelu", "verdict": "cleared"}
            status, _ = await asyncio.to_thread(
                endpoint.call, "POST", ROWS, f"Bearer {tokens['c']}", json.dumps({"rows": [forged]}).encode()
            )
            assert status == 400
            assert await reverted(endpoint, tokens["c"]) == {"fp-gelu"}
            assert fleet_quarantine.entries(engine)[0].scope == "confirmed"
        finally:
            engine.dispose()


@pytest.mark.asyncio
async def test_slower_needs_jobs_of_two_namespaces_for_the_fleet(
    kmock: kmock.KubernetesEmulator, tokens: dict[str, str], tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)

    def finding(name: str) -> r.ProbeVerdict:
        return r.ProbeVerdict(key(name), "fp-gelu", "cpu:Xeon x8", "f32[8,768]", "slower", recorded_at=now)

    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        assert await post(endpoint, tokens["a"], finding("a")) == 200
        assert await post(endpoint, tokens["a2"], finding("a2")) == 200
        assert await slower(endpoint, tokens["a"]) == {"fp-gelu"}  # two jobs of vision: vision's
        assert await slower(endpoint, tokens["c"]) == set()  # two jobs of one namespace: not the fleet's
        assert await post(endpoint, tokens["b"], finding("b")) == 200
        assert await slower(endpoint, tokens["c"]) == {"fp-gelu"}  # vision and research agree
