"""The ingestion endpoint in the test process, against kmock playing the API server, and pods' clients.

A plain module (imported by operator and plugin tests). kmock 0.8 has no TokenReview semantics of
its own, but it serves any route with a callable: `TokenApi` answers
POST authentication.k8s.io/v1/tokenreviews as a real API server does for projected tokens
(authenticated only for a token it issued, only for the audience it was bound to, naming the
ServiceAccount and the pod in `user.extra`). Pods are kmock objects, read through the real
kubernetes client. `serving` runs the real webhook server with the real IngestService on
loopback; `pod_settings` are the settings an injected pod would get, pointing at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import secrets
import socket
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, generate_latest

from stitchfleet import settings
from stitchfleet.operator.ingest import BASE, IngestService
from stitchfleet.operator.injection import InjectionConfig
from stitchfleet.operator.pod_jobs import PodJobs, api_pod_fetcher
from stitchfleet.operator.tls import CA_FILE, ensure_self_signed
from stitchfleet.operator.token_review import POD_NAME, POD_UID, TokenReviewer, api_review
from stitchfleet.operator.webhook_server import Limits, WebhookServer
from stitchfleet.telemetry import database
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.batch_writer import BatchWriter
from stitchfleet.telemetry.job_metrics import JobMetrics

SERVICE, NAMESPACE = "stitchfleet", "stitchfleet-system"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"
AUDIENCE = "stitchfleet"
CLUSTER = "gpu-east"
TOKENREVIEWS = "post /apis/authentication.k8s.io/v1/tokenreviews"
TOKENREVIEW_RESOURCE = "authentication.k8s.io/v1/tokenreviews"


@dataclass(frozen=True)
class IssuedToken:
    """What the API server knows of a token it issued."""

    namespace: str
    pod_name: str
    pod_uid: str
    audience: str
    account: str = "default"


@dataclass
class TokenApi:
    """TokenReview as the API server answers it, for the tokens issued here."""

    issued: dict[str, IssuedToken] = field(default_factory=dict)
    api: kmock.KubernetesEmulator | None = None
    # Cleared: reviews wait (an API server that is slow to answer); `pending` counts them.
    open: asyncio.Event = field(default_factory=asyncio.Event)
    pending: int = 0

    def __post_init__(self) -> None:
        self.open.set()

    def issue(self, namespace: str, pod_name: str, pod_uid: str, audience: str = AUDIENCE) -> str:
        token = secrets.token_urlsafe(32)
        self.issued[token] = IssuedToken(namespace, pod_name, pod_uid, audience)
        return token

    async def review(self, request: kmock.Request) -> dict[str, Any]:
        # kmock keeps every created object by name, a TokenReview (it has none) under None: dropped here, or the
        # next review's create would conflict with it. kmock's key type says a name is a str, its create stores None.
        if self.api is not None:
            del self.api.objects[TOKENREVIEW_RESOURCE, None, None]  # type: ignore[arg-type]
        self.pending += 1
        try:
            await self.open.wait()
        finally:
            self.pending -= 1
        spec = (request.data or {}).get("spec") or {}
        wanted = spec.get("audiences") or []
        known = self.issued.get(str(spec.get("token")))
        if known is None or (wanted and known.audience not in wanted):
            status: dict[str, Any] = {"authenticated": False, "error": "invalid bearer token"}
        else:
            user = {
                "username": f"system:serviceaccount:{known.namespace}:{known.account}",
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, known.account)),
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{known.namespace}"],
                "extra": {POD_NAME: [known.pod_name], POD_UID: [known.pod_uid]},
            }
            status = {"authenticated": True, "user": user, "audiences": [known.audience]}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": status}

    def serve(self, api: kmock.KubernetesEmulator) -> None:
        self.api = api
        api[TOKENREVIEWS] << self.review


def declare_pods(api: kmock.KubernetesEmulator) -> None:
    """Pods are a namespaced resource kmock serves from its objects."""
    api.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True, verbs={"get", "list", "watch"})


def job_pod(namespace: str, name: str, pod_uid: str, job_name: str, job_uid: str) -> dict[str, Any]:
    """A pod of a batch Job, as the API server stores it."""
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid, "controller": True}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": pod_uid, "ownerReferences": [owner]}
    metadata["labels"] = {"stitchfleet.io/enabled": "true", "job-name": job_name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [{"name": "t"}]}}


def add_pod(api: kmock.KubernetesEmulator, pod: Mapping[str, Any]) -> None:
    metadata = pod["metadata"]
    api.objects["v1/pods", metadata["namespace"], metadata["name"]] = dict(pod)


def api_client(api: kmock.KubernetesEmulator) -> k8s.ApiClient:
    configuration = k8s.Configuration(host=str(api.url).rstrip("/"))
    return k8s.ApiClient(configuration)


@dataclass
class Endpoint:
    """A running endpoint: its port, CA, service (reviewer counts, metrics) and registry."""

    server: WebhookServer
    service: IngestService
    ca_pem: str
    registry: CollectorRegistry
    url: str

    @property
    def port(self) -> int:
        return self.server.port

    def metrics(self) -> str:
        return bytes(generate_latest(self.registry)).decode()

    def call(self, method: str, path: str, authorization: str = "", body: bytes = b"") -> tuple[int, dict[str, Any]]:
        """One request over HTTPS as a pod sends it (blocking): the status and the JSON answer."""
        context = ssl.create_default_context(cadata=self.ca_pem)
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=20, context=context)
        connection.sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", self.port), timeout=20), server_hostname=HOSTNAME
        )
        headers = {"Authorization": authorization} if authorization else {}
        try:
            connection.request(method, path, body=body if method != "GET" else None, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        return response.status, json.loads(payload) if payload.startswith(b"{") else {"text": payload.decode()}


def make_service(api: kmock.KubernetesEmulator, db_url: str) -> tuple[IngestService, CollectorRegistry]:
    """The operator's IngestService, wired as process.make_ingest wires it, on a fresh registry."""
    api_calls = api_client(api)
    reviewer = TokenReviewer(api_review(api_calls, 5.0), AUDIENCE)
    registry = CollectorRegistry()
    service = IngestService(
        CLUSTER, reviewer, PodJobs(api_pod_fetcher(api_calls, 5.0)), BatchWriter(db_url), JobMetrics(registry)
    )
    return service, registry


@contextlib.asynccontextmanager
async def serving(
    api: kmock.KubernetesEmulator, tls_dir: Path, db_url: str, port: int = 0, limits: Limits | None = None
) -> AsyncIterator[Endpoint]:
    """The webhook server with the ingestion endpoint on loopback (schema upgraded first)."""
    database.upgrade(db_url)
    ensure_self_signed(tls_dir, SERVICE, NAMESPACE)
    service, registry = make_service(api, db_url)
    config = InjectionConfig(cluster=CLUSTER, shim_image="unused")
    server = WebhookServer(config, tls_dir, host="127.0.0.1", port=port, ingest=service, limits=limits)
    server.start()
    try:
        yield Endpoint(server, service, (tls_dir / CA_FILE).read_text(), registry, db_url)
    finally:
        server.stop()
        service.writer.close()


def pod_settings(port: int, ca_pem: str, token_file: Path, state_dir: Path, **extra: str) -> settings.Settings:
    """What an injected pod's plugin reads: the endpoint on loopback, verified as the Service's name."""
    env = {
        "STITCHFLEET_INGEST_URL": f"https://127.0.0.1:{port}{BASE}",
        "STITCHFLEET_INGEST_CA": ca_pem,
        "STITCHFLEET_INGEST_SERVER_NAME": HOSTNAME,
        "STITCHFLEET_INGEST_TOKEN_FILE": str(token_file),
        "STITCHFLEET_INGEST_TIMEOUT_SECONDS": "5",
        "STITCHFLEET_STATE_DIR": str(state_dir),
        "STITCHFLEET_FLUSH_SECONDS": "10",
        **extra,
    }
    return settings.load(env, strict=True)


def as_shipped(rows: list[r.Row], pod_name: str) -> list[r.Row]:
    """The rows as the operator stores them for `pod_name`: the token's pod names the job's starts,
    and a cluster verdict is the job's evidence (a JobVerdict), never the fleet's standing."""
    job = next(row.job for row in rows if not isinstance(row, r.ClusterVerdict))
    shipped: list[r.Row] = []
    for row in rows:
        if isinstance(row, r.JobStarted):
            shipped.append(dataclasses.replace(row, pod_name=pod_name))
        elif isinstance(row, r.ClusterVerdict):
            shipped.append(r.JobVerdict.of(row, job))
        else:
            shipped.append(row)
    return shipped


async def eventually(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    """Waits (bounded) until condition holds: the server's side of a connection closes after the client's."""
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)
