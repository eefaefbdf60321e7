"""Running `stitchfleet operator` as a real child process against kmock, and probing it from outside.

A plain module (imported by the tests next to it): kmock declarations of a cluster with our
webhook configuration, a kubeconfig pointing at kmock, the child's environment, and the
clients the checks use (plain HTTP for /healthz and /metrics, HTTPS verified against a CA for
the webhook). Everything blocking is wrapped for the test's event loop, which serves kmock.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, SERVICE, CONFIG_NAME = "stitchfleet-system", "stitchfleet", "stitchfleet"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"
WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
REPORTS = "stitchfleet.io/v1alpha1/savingsreports"
QUARANTINES = "stitchfleet.io/v1alpha1/stitchquarantines"
ALL_VERBS = {"list", "watch", "get", "patch", "create", "delete"}
T = TypeVar("T")


# A cluster with Kubeflow's training operator (kubeflow.org/v1: TFJob) and the MPI operator v2
# (kubeflow.org/v2beta1: MPIJob): the API server prefers the GA version of the group.
PREFERRED_VERSIONS = {"kubeflow.org": "v1"}


def declare_cluster(api: kmock.KubernetesEmulator) -> None:
    """The resources the operator reads and writes, and our MutatingWebhookConfiguration."""
    namespaced = {
        "v1/pods": "Pod",
        "v1/events": "Event",
        "v1/secrets": "Secret",
        "v1/configmaps": "ConfigMap",
        "batch/v1/jobs": "Job",
        "kubeflow.org/v2beta1/mpijobs": "MPIJob",
        "kubeflow.org/v1/tfjobs": "TFJob",
    }
    for resource, kind in namespaced.items():
        api.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=ALL_VERBS)
    api.resources[REPORTS] = kmock.ResourceInfo(
        kind="SavingsReport", namespaced=True, verbs=ALL_VERBS, subresources={"status"}
    )
    api.resources[QUARANTINES] = kmock.ResourceInfo(
        kind="StitchQuarantine", namespaced=True, verbs=ALL_VERBS, subresources={"status"}
    )
    cluster_wide = {
        "v1/namespaces": "Namespace",
        "apiextensions.k8s.io/v1/customresourcedefinitions": "CustomResourceDefinition",
        WEBHOOKS: "MutatingWebhookConfiguration",
    }
    for resource, kind in cluster_wide.items():
        api.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=False, verbs=ALL_VERBS)
    api.objects[WEBHOOKS, None, CONFIG_NAME] = webhook_configuration()
    resources = [*namespaced, REPORTS, QUARANTINES, *cluster_wide]
    api["get /apis"] << group_discovery(resources)


def group_discovery(resources: list[str]) -> dict[str, Any]:
    """/apis as an API server serves it, with PREFERRED_VERSIONS (kmock would pick any version)."""
    versions: dict[str, list[str]] = {}
    for resource in resources:
        parts = resource.split("/")
        if len(parts) == 3 and parts[1] not in versions.setdefault(parts[0], []):
            versions[parts[0]].append(parts[1])
    groups = []
    for group, served in sorted(versions.items()):
        preferred = PREFERRED_VERSIONS.get(group, served[0])
        entries = [{"groupVersion": f"{group}/{version}", "version": version} for version in served]
        preferred_entry = {"groupVersion": f"{group}/{preferred}", "version": preferred}
        groups.append({"name": group, "versions": entries, "preferredVersion": preferred_entry})
    return {"apiVersion": "v1", "kind": "APIGroupList", "groups": groups}


def webhook_configuration() -> dict[str, Any]:
    """Our MutatingWebhookConfiguration as the chart installs it (no caBundle yet)."""
    service = {"name": SERVICE, "namespace": NAMESPACE, "path": "/mutate", "port": 443}
    webhook = {
        "name": "pods.stitchfleet.io",
        "clientConfig": {"service": service},
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
    }
    metadata = {"name": CONFIG_NAME, "resourceVersion": "1"}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [webhook],
    }


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig whose only context is kmock over plain HTTP, without credentials."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
        "current-context": "kmock",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def free_port() -> int:
    """A port free on loopback right now (the child binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Ports:
    """The child's three listening ports."""

    health: int
    metrics: int
    webhook: int

    @classmethod
    def pick(cls) -> Ports:
        """Three distinct free ports."""
        chosen: set[int] = set()
        while len(chosen) < 3:
            chosen.add(free_port())
        health, metrics, webhook = sorted(chosen)
        return cls(health, metrics, webhook)


def child_environment(base: Path, ports: Ports, kubeconfig: Path, **extra: str) -> dict[str, str]:
    """The child's environment: ours alone for STITCHFLEET_* and the Kubernetes login."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STITCHFLEET_", "KUBERNETES_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        KUBECONFIG=str(kubeconfig),
        STITCHFLEET_DB_URL=f"sqlite:///{base / 'db' / 'telemetry.db'}",
        STITCHFLEET_STATE_DIR=str(base / "state"),
        STITCHFLEET_CLUSTER="gpu-east",
        STITCHFLEET_HEALTH_PORT=str(ports.health),
        STITCHFLEET_METRICS_PORT=str(ports.metrics),
        STITCHFLEET_WEBHOOK_PORT=str(ports.webhook),
        STITCHFLEET_WEBHOOK_TLS_DIR=str(base / "tls"),
        STITCHFLEET_WEBHOOK_SELF_SIGNED="true",
        STITCHFLEET_WEBHOOK_CONFIG_NAME=CONFIG_NAME,
        STITCHFLEET_WEBHOOK_SERVICE=SERVICE,
        STITCHFLEET_OPERATOR_NAMESPACE=NAMESPACE,
        STITCHFLEET_ROLLUP_SECONDS="1",
        STITCHFLEET_FLUSH_SECONDS="5",
    )
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def operator_process(env: dict[str, str], log_path: Path) -> AsyncIterator[Watched]:
    """`stitchfleet operator` as a child (the CLI's own entry); killed if a test leaves it running."""
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "stitchfleet.cli", "operator"],
            env=env,
            cwd=log_path.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: `left_behind` asks whether any of it outlived it
        )
        try:
            yield Watched(child, log_path)
        finally:
            if child.poll() is None:
                child.kill()
                await asyncio.to_thread(child.wait, 10)


async def stop(child: subprocess.Popen[bytes], seconds: float) -> int:
    """SIGTERM, as the kubelet sends it; the exit status once the child is gone (bounded)."""
    child.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(child.wait, seconds)


@dataclass
class Watched:
    """A running child and its log: waits on it fail fast, with the log, once it has died."""

    child: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    async def eventually(self, probe: Callable[[], T | None], what: str, seconds: float = 30.0) -> T:
        """Polls `probe` (in a thread: it may block) until it returns a value; fails naming `what`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            value = await asyncio.to_thread(probe)
            if value is not None:
                return value
            if self.child.poll() is not None:
                raise AssertionError(f"the operator exited ({self.child.returncode}) before {what}:\n{self.log_tail()}")
            if loop.time() > deadline:
                raise AssertionError(f"no {what} within {seconds:.0f} s; operator log tail:\n{self.log_tail()}")
            await asyncio.sleep(0.2)


def http_get(port: int, path: str) -> tuple[int, str] | None:
    """(status, body) of GET http://127.0.0.1:port/path; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return None


def left_behind(child: subprocess.Popen[bytes]) -> bool:
    """Whether a process of the exited child's group (itself, or anything it started) is still alive: one would
    hold the child's listening sockets. Asked of the group, not of the ports: once the child is gone another
    process on the machine (another test, another pytest worker) may listen on the same port number."""
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    return True


def admission_review(pod: dict[str, Any], uid: str = "e2e-review-1") -> bytes:
    """An AdmissionReview v1 for creating `pod`, as the API server posts it."""
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": pod["metadata"]["namespace"],
        "operation": "CREATE",
        "object": pod,
        "dryRun": False,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def post_review(port: int, ca_pem: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
    """POSTs to /mutate over HTTPS, verifying the server as the Service's name against `ca_pem`."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    head = f"POST /mutate?timeout=5s HTTP/1.1\r\nHost: {HOSTNAME}\r\nContent-Type: application/json\r\n"
    request = f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=HOSTNAME) as tls,
    ):
        tls.sendall(request)
        response = http.client.HTTPResponse(tls)
        response.begin()
        return response.status, json.loads(response.read())
