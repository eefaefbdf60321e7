"""StitchQuarantine objects (GitOps) reconciled into the fleet quarantine by the real kopf handlers.

kopf runs in-process against kmock (objects listed and streamed, status written back through the real
kubernetes client), into a real SQLite telemetry database. The audit trail must read as the command's
(`stitchfleet fleet quarantine confirm|clear`), each generation applied once across operator restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import api_client
from test_operator_kmock import declare, put

from stitchfleet.operator import handlers, process
from stitchfleet.operator.quarantine_requests import QuarantineRequests, api_status_writer
from stitchfleet.telemetry import database, fleet_quarantine
from stitchfleet.telemetry.fleet_metrics import FleetMetrics

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]
QUARANTINES = "stitchfleet.io/v1alpha1/stitchquarantines"
NAMESPACE = "stitchfleet-system"
WAIT_SECONDS = 20.0


class Discard:
    """No pods here: nothing may be recorded."""

    def record(self, row: object) -> None:
        raise AssertionError(f"unexpected row {row!r}")


def request(name: str, action: str, *, namespace: str = NAMESPACE, generation: int = 1, **spec: Any) -> dict[str, Any]:
    body = {"fingerprint": "c0ffee42", "action": action, "reason": "reproduced on A100", "requestedBy": "alice"}
    metadata = {"name": name, "namespace": namespace, "generation": generation, "uid": f"uid-{name}"}
    kind = {"apiVersion": "stitchfleet.io/v1alpha1", "kind": "StitchQuarantine"}
    return {**kind, "metadata": metadata, "spec": body | spec}


async def change(api: kmock.KubernetesEmulator, body: dict[str, Any]) -> None:
    """Patches an object through the API (as `kubectl apply` from Git would), so watchers get MODIFIED."""
    meta = body["metadata"]
    path = f"/apis/stitchfleet.io/v1alpha1/namespaces/{meta['namespace']}/stitchquarantines/{meta['name']}"
    async with aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/merge-patch+json"}
        response = await session.patch(f"{str(api.url).rstrip('/')}{path}", json=body, headers=headers)
        assert response.status == 200, await response.text()


def declare_quarantines(api: kmock.KubernetesEmulator) -> None:
    declare(api)
    verbs = {"list", "watch", "get", "patch"}
    api.resources[QUARANTINES] = kmock.ResourceInfo(
        kind="StitchQuarantine", namespaced=True, verbs=verbs, subresources={"status"}
    )


@contextlib.asynccontextmanager
async def operator(api: kmock.KubernetesEmulator, url: str) -> AsyncIterator[None]:
    """One life of the operator with only what StitchQuarantine objects need."""
    requests = QuarantineRequests(url, "gpu-east", NAMESPACE, api_status_writer(api_client(api), 5.0))
    context = handlers.OperatorContext("gpu-east", Discard(), FleetMetrics(), quarantine=requests)
    context.quarantine_retry_seconds = 0.2
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(lambda **_: kopf.ConnectionInfo(server=str(api.url).rstrip("/")))
    handlers.build_registry(context, registry)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(process.operate(context, registry, stop_flag=stop, ready_flag=ready))
    try:
        await asyncio.wait_for(ready.wait(), WAIT_SECONDS)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_SECONDS)
        requests.close()


def status_of(api: kmock.KubernetesEmulator, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return dict(api.objects[QUARANTINES, namespace, name].get("status") or {})


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def trail(url: str) -> list[tuple[str, str, str]]:
    engine = database.connect(url)
    try:
        return [(kind, fp, detail) for _at, kind, fp, detail in reversed(fleet_quarantine.audit_trail(engine))]
    finally:
        engine.dispose()


def scope(url: str, fingerprint: str) -> str | None:
    engine = database.connect(url)
    try:
        found = [entry.scope for entry in fleet_quarantine.entries(engine) if entry.fingerprint == fingerprint]
        return found[0] if found else None
    finally:
        engine.dispose()


async def test_confirm_then_clear_from_objects_with_the_commands_audit_trail_once_across_restarts(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_quarantines(kmock)
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    database.upgrade(url)
    put(kmock, QUARANTINES, request("ln-bwd", "confirm"))
    put(kmock, QUARANTINES, request("elsewhere", "confirm", namespace="ml", fingerprint="beef"))
    put(kmock, QUARANTINES, request("bad", "confirm", fingerprint="not a fingerprint"))
    async with operator(kmock, url):
        await until(lambda: status_of(kmock, "ln-bwd").get("phase") == "Applied", "ln-bwd applied")
        await until(lambda: status_of(kmock, "bad").get("phase") == "Invalid", "bad refused")
        assert scope(url, "c0ffee42") == "confirmed"
        assert status_of(kmock, "ln-bwd")["observedGeneration"] == 1
        assert "spec.fingerprint" in status_of(kmock, "bad")["message"]
        # The action changes in Git: a new generation, applied once more.
        await change(kmock, request("ln-bwd", "clear", generation=2, reason="fixed in compiler 0.9"))
        await until(lambda: status_of(kmock, "ln-bwd").get("observedGeneration") == 2, "generation 2 applied")
    async with operator(kmock, url):  # a restart re-lists every object: nothing is applied twice
        await asyncio.sleep(1.0)
    who = "alice via StitchQuarantine stitchfleet-system/ln-bwd"
    assert trail(url) == [
        ("quarantine_confirmed", "c0ffee42", f"{who}: reproduced on A100"),
        ("quarantine_cleared", "c0ffee42", f"{who}: fixed in compiler 0.9"),
    ]
    assert scope(url, "c0ffee42") == "cleared" and scope(url, "beef") is None
    assert status_of(kmock, "elsewhere", "ml") == {}  # outside the release namespace: ignored, untouched
    # The command writes the same trail: one row of the same form per action.
    engine = database.connect(url)
    try:
        fleet_quarantine.confirm(engine, "c0ffee42", actor="bob", why="again", cluster="gpu-east")
    finally:
        engine.dispose()
    assert trail(url)[-1] == ("quarantine_confirmed", "c0ffee42", "bob: again")
    # The chart's RBAC allows every call the operator made (the patch of the object itself is Git's, above).
    made = [call for call in api_calls(kmock) if (call.verb, call.resource) != ("patch", "stitchquarantines")]
    assert denied(made, "stitchfleet", NAMESPACE) == []


async def test_a_request_the_database_refuses_is_failed_then_applied_by_the_retry_pass(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_quarantines(kmock)
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"  # no schema yet: every write fails
    put(kmock, QUARANTINES, request("ln-bwd", "confirm"))
    async with operator(kmock, url):
        await until(lambda: status_of(kmock, "ln-bwd").get("phase") == "Failed", "ln-bwd failed")
        database.upgrade(url)  # the database is back
        await until(lambda: status_of(kmock, "ln-bwd").get("phase") == "Applied", "ln-bwd applied by a retry")
    assert [kind for kind, _, _ in trail(url)] == ["quarantine_confirmed"]
