"""The bundled PostgreSQL's generated password: created once in the cluster, never rewritten.

kmock plays the API server (Secrets written through the real kubernetes client); the init container's
command runs as a real child process against it. The chart renders no password (tests/helm), so this
Secret is the only place one is made.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path

import kmock
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import api_client
from operator_process import ALL_VERBS, ROOT, Ports, child_environment, write_kubeconfig

from stitchfleet.operator import password_secret

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
NAMESPACE, NAME = "stitchfleet-system", "stitchfleet-postgresql"
SECRETS = "v1/secrets"
# The chart's generated-password mode, with cert-manager: the Role's only Secret permission is this create.
VALUES = {"postgresql": {"enabled": True}, "certManager": {"enabled": True}}


def stored_password(api: kmock.KubernetesEmulator) -> str:
    return base64.b64decode(api.objects[SECRETS, NAMESPACE, NAME]["data"][password_secret.KEY]).decode()


@pytest.mark.asyncio
async def test_the_password_is_made_once_and_every_later_start_keeps_it(
    kmock: kmock.KubernetesEmulator,
) -> None:
    kmock.resources[SECRETS] = kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=ALL_VERBS)
    client = api_client(kmock)
    created = await asyncio.to_thread(password_secret.ensure, client, NAMESPACE, NAME, timeout=5.0)
    first = stored_password(kmock)
    assert created and len(first) == password_secret.LENGTH and first.isalnum()
    for _restart in range(3):  # every start of the operator pod runs the init container again
        assert await asyncio.to_thread(password_secret.ensure, client, NAMESPACE, NAME, timeout=5.0) is False
    assert stored_password(kmock) == first
    assert kmock.objects[SECRETS, NAMESPACE, NAME]["type"] == "Opaque"
    # It never reads a Secret: create only, which the chart's Role grants in this mode.
    assert {call.verb for call in api_calls(kmock) if call.resource == "secrets"} == {"create"}
    assert denied(api_calls(kmock), "stitchfleet", NAMESPACE, VALUES) == []


@pytest.mark.asyncio
async def test_the_init_containers_command_creates_it_and_fails_loudly_without_an_api_server(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.resources[SECRETS] = kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=ALL_VERBS)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = child_environment(tmp_path, Ports.pick(), kubeconfig, STITCHFLEET_API_TIMEOUT_SECONDS="5")
    command = [sys.executable, "-m", "stitchfleet.cli", "operator", "password-secret", NAME]

    def run(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60)

    done = await asyncio.to_thread(run, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Secret {NAMESPACE}/{NAME}: created"
    first = stored_password(kmock)
    again = await asyncio.to_thread(run, env)
    assert (again.returncode, again.stdout.strip()) == (0, f"Secret {NAMESPACE}/{NAME}: exists, kept as it is")
    assert stored_password(kmock) == first
    unreachable = write_kubeconfig(tmp_path / "nowhere", "http://127.0.0.1:9")
    failed = await asyncio.to_thread(run, {**env, "KUBECONFIG": str(unreachable)})
    # The init container fails (the kubelet retries it); the operator never starts without its password.
    assert failed.returncode == 1 and failed.stderr.startswith("stitchfleet operator password-secret: ")
