"""Self-signed webhook material in a Secret: a replaced operator pod keeps the CA the running pods trust.

kmock plays the API server (Secrets as objects, read and written through the real kubernetes client);
each "operator pod" has its own empty TLS dir, as an emptyDir would be.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import kmock
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import api_client
from operator_process import ALL_VERBS

from stitchfleet.operator import tls, tls_secret

SERVICE, NAMESPACE = "stitchfleet", "stitchfleet-system"

pytestmark = pytest.mark.timeout(60)


@pytest.mark.asyncio
async def test_a_replaced_operator_pod_serves_the_same_ca_from_the_secret(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.resources["v1/secrets"] = kmock_resource()
    client = api_client(kmock)
    first = await asyncio.to_thread(tls_secret.ensure, client, NAMESPACE, SERVICE, tmp_path / "pod-1", timeout=5.0)
    second = await asyncio.to_thread(tls_secret.ensure, client, NAMESPACE, SERVICE, tmp_path / "pod-2", timeout=5.0)
    assert second == first  # before: a new CA per pod, and every running pod's TLS failed
    assert (tmp_path / "pod-2" / tls.CA_FILE).read_bytes() == first.ca_pem
    stored = kmock.objects["v1/secrets", NAMESPACE, tls_secret.secret_name(SERVICE)]
    assert base64.b64decode(stored["data"]["ca.crt"]) == first.ca_pem and stored["type"] == "kubernetes.io/tls"
    assert denied(api_calls(kmock), SERVICE, NAMESPACE) == []  # the chart's Role allows exactly these


@pytest.mark.asyncio
async def test_material_that_no_longer_serves_the_service_is_replaced_in_the_secret(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    kmock.resources["v1/secrets"] = kmock_resource()
    client = api_client(kmock)
    old = await asyncio.to_thread(tls_secret.ensure, client, NAMESPACE, "old-name", tmp_path / "a", timeout=5.0)
    stored = kmock.objects["v1/secrets", NAMESPACE, tls_secret.secret_name("old-name")]
    kmock.objects["v1/secrets", NAMESPACE, tls_secret.secret_name(SERVICE)] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": tls_secret.secret_name(SERVICE), "namespace": NAMESPACE},
        "data": {name: str(stored["data"][name]) for name in ("ca.crt", "tls.crt", "tls.key")},
    }
    new = await asyncio.to_thread(tls_secret.ensure, client, NAMESPACE, SERVICE, tmp_path / "b", timeout=5.0)
    assert new.ca_pem != old.ca_pem  # the stored material names another Service
    replaced = kmock.objects["v1/secrets", NAMESPACE, tls_secret.secret_name(SERVICE)]
    assert base64.b64decode(replaced["data"]["tls.crt"]) == new.cert_pem


def kmock_resource() -> kmock.ResourceInfo:
    return kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=ALL_VERBS)
