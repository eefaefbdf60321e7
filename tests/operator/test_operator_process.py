"""The whole `stitchfleet operator` process, end to end: a real child process against kmock.

One life of the process as the Deployment runs it: the schema is migrated at start, the
self-signed CA reaches the webhook configuration, the webhook answers over HTTPS, /healthz and
the fleet gauges are served, pod events become job rows, the rollup publishes the week's
SavingsReport, and SIGTERM stops everything within a bound with exit status 0.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from chart_rbac import ApiCall, api_calls, denied
from operator_bodies import bare_pod, batch_job, job_pod, launcher_job, mpi_pod
from operator_process import (
    CONFIG_NAME,
    NAMESPACE,
    REPORTS,
    SERVICE,
    WEBHOOKS,
    Ports,
    admission_review,
    child_environment,
    declare_cluster,
    http_get,
    left_behind,
    operator_process,
    post_review,
    stop,
    write_kubeconfig,
)
from sqlalchemy import select

from stitchfleet.operator import handlers
from stitchfleet.operator.savings import report_name, week_label
from stitchfleet.telemetry import database, models
from stitchfleet.telemetry.fleet_metrics import FleetMetrics

pytestmark = pytest.mark.timeout(120)
STOP_SECONDS = 20.0
# Well below the stuck call's own timeout (60 s in that test) and the kubelet's 30 s grace.
HUNG_STOP_SECONDS = 10.0


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_now(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod started just now: its job lands in the current week's report."""
    pod["status"]["startTime"] = now_rfc3339()
    return pod


def job_rows(url: str) -> list[tuple[Any, ...]] | None:
    """(namespace, job name, job uid, world size, GPUs per rank) of every job; None before the schema."""
    engine = database.connect(url)
    try:
        with engine.connect() as connection:
            job = models.Job
            query = select(job.namespace, job.job_name, job.job_uid, job.world_size, job.gpus_per_rank)
            return [tuple(row) for row in connection.execute(query.order_by(job.namespace))]
    except Exception:  # the child has not created the schema yet
        return None
    finally:
        engine.dispose()


async def create(api: kmock.KubernetesEmulator, path: str, body: dict[str, Any]) -> None:
    """Creates an object through the API, so that watchers get an ADDED event."""
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{str(api.url).rstrip('/')}{path}", json=body)
        assert response.status in (200, 201), await response.text()


def stored_ca(api: kmock.KubernetesEmulator) -> bytes | None:
    webhook = api.objects[WEBHOOKS, None, CONFIG_NAME]["webhooks"][0]
    bundle = webhook["clientConfig"].get("caBundle")
    return base64.b64decode(bundle) if bundle else None


def report_of(api: kmock.KubernetesEmulator, week: str, tasks: int) -> dict[str, Any] | None:
    try:
        report = dict(api.objects[REPORTS, NAMESPACE, report_name(week)])
    except KeyError:
        return None
    return report if (report.get("status") or {}).get("tasks") == tasks else None


@pytest.mark.asyncio
async def test_the_operator_process_from_start_to_sigterm(kmock: kmock.KubernetesEmulator, tmp_path: Path) -> None:
    declare_cluster(kmock)
    kmock.objects["batch/v1/jobs", "ml", "resnet-train"] = batch_job()
    kmock.objects["v1/pods", "ml", "resnet-train-0abcd"] = running_now(job_pod(0))
    ports = Ports.pick()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = child_environment(tmp_path, ports, kubeconfig)
    url, log = env["STITCHFLEET_DB_URL"], tmp_path / "operator.log"
    assert not (tmp_path / "db").exists()

    async with operator_process(env, log) as run:
        health = await run.eventually(lambda: http_get(ports.health, "/healthz"), "/healthz answer", 60)
        assert health[0] == 200
        database.check(url)  # the schema is at head: the process upgraded it before serving

        ca_pem = await run.eventually(lambda: stored_ca(kmock), "caBundle on the webhook configuration")
        assert ca_pem == (tmp_path / "tls" / "ca.crt").read_bytes()
        status, review = await asyncio.to_thread(post_review, ports.webhook, ca_pem, admission_review(bare_pod()))
        assert status == 200 and review["response"]["uid"] == "e2e-review-1"
        assert review["response"]["allowed"] is True
        patch = json_patch(review)
        assert {"name": "STITCHFLEET_CLUSTER", "value": "gpu-east"} in env_added(patch)

        await create(kmock, "/api/v1/namespaces/research/pods", running_now(bare_pod()))
        rows = await run.eventually(lambda: _rows_when(url, 2), "two job rows")
        assert sorted(rows) == [
            ("ml", "resnet-train", batch_job()["metadata"]["uid"], 1, 4),
            ("research", "notebook", "bare-pod-uid-1", 1, 1),
        ]
        week = week_label(dt.datetime.now(dt.UTC))
        report = await run.eventually(lambda: report_of(kmock, week, 2), f"SavingsReport of {week} with 2 tasks")
        assert report["spec"] == {"week": week} and report["status"]["jobs"] == 2

        needle = "stitchfleet_fleet_week_tasks 2.0"
        metrics = await run.eventually(lambda: _metrics_when(ports.metrics, needle), f"{needle} in /metrics")
        assert "stitchfleet_fleet_jobs_tracked 2.0" in metrics
        assert "stitchfleet_fleet_last_rollup_timestamp_seconds" in metrics

        assert await stop(run.child, STOP_SECONDS) == 0
    output = log.read_text(errors="replace")
    assert "Traceback" not in output, output[-4000:]
    assert "pod_event' succeeded" not in output and "GET /healthz" not in output, "no line per event or probe"
    assert "Signal SIGTERM is received" in output
    assert not left_behind(run.child), "a process of the operator's group outlived it, holding its ports"


CA_MAP = f"{SERVICE}-ingest-ca"  # the chart's name for the default release


def in_namespace(pod: Any, namespace: str) -> dict[str, Any]:
    copied = json.loads(json.dumps(pod))
    copied["metadata"]["namespace"] = namespace
    return dict(copied)


def ca_copy(api: kmock.KubernetesEmulator, namespace: str) -> str | None:
    try:
        return str(api.objects["v1/configmaps", namespace, CA_MAP]["data"]["ca.crt"])
    except KeyError:
        return None


def fetched_job(api: kmock.KubernetesEmulator) -> ApiCall | None:
    return next((call for call in api_calls(api) if call.verb == "get" and call.resource == "jobs"), None)


def _rows_when(url: str, count: int) -> list[tuple[Any, ...]] | None:
    rows = job_rows(url)
    return rows if rows is not None and len(rows) >= count else None


def _metrics_when(port: int, needle: str) -> str | None:
    answer = http_get(port, "/metrics")
    return answer[1] if answer is not None and answer[0] == 200 and needle in answer[1] else None


def json_patch(review: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch of an AdmissionReview response, decoded."""
    response = review["response"]
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def env_added(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every env entry the patch adds (whole lists or single entries)."""
    added: list[dict[str, Any]] = []
    for op in patch:
        if op["op"] != "add" or "/env" not in op["path"]:
            continue
        value = op["value"]
        added += value if isinstance(value, list) else [value]
    return added


def test_the_default_registry_logs_in_through_the_kubernetes_client() -> None:
    context = handlers.OperatorContext("gpu-east", sink=Discard(), metrics=FleetMetrics())
    registry = handlers.build_registry(context)
    # kopf has no public view of a registry's activities; the private one is what the operator runs.
    activities = registry._activities.get_all_handlers()
    logins = [handler for handler in activities if handler.activity.value == "authentication"]
    assert [handler.fn for handler in logins] == [kopf.login_via_client]


class Discard:
    """A sink for a registry that is built but never run."""

    def record(self, row: object) -> None:
        raise AssertionError(f"nothing runs, yet {row!r} was recorded")


@pytest.mark.asyncio
async def test_sigterm_while_an_api_call_hangs_still_exits_within_the_bound(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_cluster(kmock)
    release = asyncio.Event()

    async def hang() -> dict[str, Any]:
        await release.wait()  # an API server that accepted the call and never answers
        return {}

    report = f"/apis/stitchfleet.io/v1alpha1/namespaces/{NAMESPACE}/savingsreports"
    path = f"{report}/{report_name(week_label(dt.datetime.now(dt.UTC)))}"
    kmock[f"get {path}"] << hang
    ports = Ports.pick()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = child_environment(tmp_path, ports, kubeconfig, STITCHFLEET_API_TIMEOUT_SECONDS="60")
    try:
        async with operator_process(env, tmp_path / "operator.log") as run:
            await run.eventually(lambda: len(list(kmock[f"get {path}"])) or None, "the rollup's call to the API", 60)
            assert await stop(run.child, HUNG_STOP_SECONDS) == 0, "the stuck rollup did not hold the exit"
    finally:
        release.set()
    assert "Signal SIGTERM is received" in (tmp_path / "operator.log").read_text()


@pytest.mark.asyncio
async def test_every_api_call_of_the_process_is_allowed_by_the_charts_rbac(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_cluster(kmock)
    # An MPIJob's launcher Job that no watch event shows: the operator has to get it by name.
    kmock.objects["batch/v1/jobs", "nlp", "bert-mpi-launcher"] = launcher_job(opted_in=False)
    kmock.objects["v1/pods", "nlp", "bert-mpi-launcher-0"] = running_now(mpi_pod("launcher"))
    kmock.objects["v1/pods", "research", "notebook-x7k2p"] = running_now(bare_pod())
    ports = Ports.pick()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    # The chart's default: the ingestion CA kept in a ConfigMap of every namespace with opted-in pods.
    env = child_environment(tmp_path, ports, kubeconfig, STITCHFLEET_INGEST_CA_CONFIGMAP=CA_MAP)
    week = week_label(dt.datetime.now(dt.UTC))
    async with operator_process(env, tmp_path / "operator.log") as run:
        await run.eventually(lambda: report_of(kmock, week, 1), f"SavingsReport of {week} with 1 task")
        ca_pem = await run.eventually(lambda: stored_ca(kmock), "caBundle on the webhook configuration")
        await run.eventually(lambda: fetched_job(kmock), "a get of the launcher Job")
        # From the pod events of the listing (a restarted operator refreshes every copy so) ...
        copy = await run.eventually(lambda: ca_copy(kmock, "research"), "the CA's ConfigMap in research")
        assert copy == ca_pem.decode()
        # ... and from an admission, before the pod exists.
        review = admission_review(in_namespace(bare_pod(), "vision"))
        status, _ = await asyncio.to_thread(post_review, ports.webhook, ca_pem, review)
        assert status == 200
        await run.eventually(lambda: ca_copy(kmock, "vision"), "the CA's ConfigMap in vision")
        assert await stop(run.child, STOP_SECONDS) == 0
    calls = api_calls(kmock)
    made = {(call.verb, call.resource) for call in calls}
    expected = {("watch", "pods"), ("get", "jobs"), ("create", "savingsreports"), ("patch", "savingsreports/status")}
    assert expected | {("patch", "mutatingwebhookconfigurations")} <= made, sorted(made)
    assert denied(calls, "stitchfleet", NAMESPACE) == []


def test_the_rbac_check_refuses_what_the_chart_does_not_grant() -> None:
    others = {
        ApiCall("get", "", "secrets", "ml", "stitchfleet-db"),
        ApiCall("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", None, "someone-else"),
        ApiCall("get", "", "configmaps", "ml", "settings"),
    }
    assert denied(others, "stitchfleet", NAMESPACE) == sorted(str(call) for call in others)
    assert denied({ApiCall("get", "", "configmaps", NAMESPACE, "settings")}, "stitchfleet", NAMESPACE) == []
    # The ingestion endpoint may ask who a token is, and nothing else of authentication/authorization.
    assert (
        denied({ApiCall("create", "authentication.k8s.io", "tokenreviews", None, None)}, "stitchfleet", NAMESPACE) == []
    )
    asks = {
        ApiCall("create", "authorization.k8s.io", "subjectaccessreviews", None, None),
        ApiCall("create", "", "serviceaccounts/token", "ml", "default"),
    }
    assert denied(asks, "stitchfleet", NAMESPACE) == sorted(str(call) for call in asks)
