"""A rotated ingestion CA reaches running pods: the operator's ConfigMap copies, the pods' mounted file.

kmock plays the API server (ConfigMaps written through the real kubernetes client, TokenReview and
pods as in ingest_harness); the endpoint is the real webhook server on loopback with real TLS; the
"kubelet" is the test copying the ConfigMap's ca.crt into the pod's mounted file, as it does for a
configMap volume. The client and the Shipper are never restarted across the rotation.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import kmock
import pytest
from chart_rbac import api_calls, denied
from ingest_harness import (
    NAMESPACE,
    SERVICE,
    TokenApi,
    add_pod,
    api_client,
    as_shipped,
    declare_pods,
    job_pod,
    pod_settings,
    serving,
)
from operator_process import ALL_VERBS, free_port

from stitchfleet.operator import tls
from stitchfleet.operator.ca_publisher import CA_KEY, CaPublisher, api_configmap_writer
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, Endpoint, IngestClient
from stitchfleet.plugin.fleet.shipper import Shipper
from stitchfleet.telemetry.rows import ClusterVerdict
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, workload

pytestmark = pytest.mark.timeout(120)
CONFIGMAPS = "v1/configmaps"
# The chart's name for the default release (helm/stitchfleet/templates/_helpers.tpl, stitchfleet.ingestCaName).
CA_MAP = f"{SERVICE}-ingest-ca"
POD, POD_UID = "resnet-train-0-x7k2p", "pod-uid-1"


def declare_configmaps(api: kmock.KubernetesEmulator) -> None:
    api.resources[CONFIGMAPS] = kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=ALL_VERBS)


def published(api: kmock.KubernetesEmulator, namespace: str) -> str | None:
    try:
        return str(api.objects[CONFIGMAPS, namespace, CA_MAP]["data"][CA_KEY])
    except KeyError:
        return None


def kubelet_sync(api: kmock.KubernetesEmulator, namespace: str, mounted: Path) -> None:
    """What the kubelet does for a configMap volume: the file follows the ConfigMap (atomically)."""
    pem = published(api, namespace)
    assert pem is not None, f"no {CA_MAP} in {namespace}"
    scratch = mounted.with_name(".ca.tmp")
    scratch.write_text(pem)
    scratch.replace(mounted)


async def delivered(shipper: Shipper) -> None:
    """Flushes until everything is delivered (bounded): a request the loaded machine lets time out is retried."""
    for _attempt in range(6):
        if await asyncio.to_thread(shipper.flush, 30.0):
            return
    raise AssertionError(f"spool not delivered: {shipper.stats.last_error}")


def rotate(tls_dir: Path) -> tls.TlsMaterial:
    """A new CA and serving certificate in the operator's TLS dir (a new self-signed Secret, a renewal)."""
    material = tls.make_self_signed(tls.service_dns_names(SERVICE, NAMESPACE))
    tls.write_tls_dir(tls_dir, material)
    return material


@pytest.mark.asyncio
async def test_the_ca_is_published_once_per_namespace_and_again_when_it_changes(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_configmaps(kmock)
    tls_dir = tmp_path / "tls"
    first = tls.ensure_self_signed(tls_dir, SERVICE, NAMESPACE)
    publisher = CaPublisher(api_configmap_writer(api_client(kmock), 5.0), CA_MAP, tls_dir / tls.CA_FILE)
    for namespace in ("vision", "nlp", "vision", ""):
        publisher.want(namespace)
    assert await asyncio.to_thread(publisher.sync_once) == ["nlp", "vision"]
    assert published(kmock, "vision") == published(kmock, "nlp") == first.ca_pem.decode()
    stored = kmock.objects[CONFIGMAPS, "vision", CA_MAP]
    assert set(stored["data"]) == {CA_KEY}  # the CA only: nothing secret leaves the operator's namespace
    assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "stitchfleet"
    writes = len(list(kmock))
    assert await asyncio.to_thread(publisher.sync_once) == []
    assert len(list(kmock)) == writes, "an unchanged CA costs no API call"

    second = rotate(tls_dir)
    assert await asyncio.to_thread(publisher.sync_once) == ["nlp", "vision"]
    assert published(kmock, "vision") == published(kmock, "nlp") == second.ca_pem.decode()
    assert denied(api_calls(kmock), SERVICE, NAMESPACE) == []  # the chart's ClusterRole allows exactly these


@pytest.mark.asyncio
async def test_a_copy_made_before_this_operator_or_changed_since_is_written_again(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_configmaps(kmock)
    tls_dir = tmp_path / "tls"
    material = tls.ensure_self_signed(tls_dir, SERVICE, NAMESPACE)
    # Created by someone else first (a previous operator): the copy is patched, not refused as a conflict.
    kmock.objects[CONFIGMAPS, "vision", CA_MAP] = {"metadata": {"name": CA_MAP}, "data": {CA_KEY: "stale"}}
    publisher = CaPublisher(api_configmap_writer(api_client(kmock), 5.0), CA_MAP, tls_dir / tls.CA_FILE)
    publisher.want("vision")
    assert await asyncio.to_thread(publisher.sync_once) == ["vision"]
    assert published(kmock, "vision") == material.ca_pem.decode()
    # Edited (or deleted) in its namespace later: the next resync writes it again.
    kmock.objects[CONFIGMAPS, "vision", CA_MAP] = {"metadata": {"name": CA_MAP}, "data": {CA_KEY: "forged"}}
    assert await asyncio.to_thread(publisher.sync_once) == []  # between resyncs no call is made
    resyncing = CaPublisher(
        api_configmap_writer(api_client(kmock), 5.0), CA_MAP, tls_dir / tls.CA_FILE, resync_seconds=0
    )
    resyncing.want("vision")
    await asyncio.to_thread(resyncing.sync_once)
    del kmock.objects[CONFIGMAPS, "vision", CA_MAP]
    assert await asyncio.to_thread(resyncing.sync_once) == ["vision"]
    assert published(kmock, "vision") == material.ca_pem.decode()


@pytest.mark.asyncio
async def test_a_pod_ships_across_a_ca_rotation_without_restarting_its_client(
    kmock: kmock.KubernetesEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    declare_pods(kmock)
    declare_configmaps(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    tokens = TokenApi()
    tokens.serve(kmock)
    token_file = tmp_path / "token"
    token_file.write_text(tokens.issue("vision", POD, POD_UID))
    rows = workload(windows=30, ranks=2)
    before, after = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    port, tls_dir, url = free_port(), tmp_path / "tls", f"sqlite:///{tmp_path / 'telemetry.db'}"
    mounted = tmp_path / "ca" / "ca.crt"
    mounted.parent.mkdir()
    async with serving(kmock, tls_dir, url, port=port) as endpoint:
        publisher = CaPublisher(api_configmap_writer(api_client(kmock), 5.0), CA_MAP, tls_dir / tls.CA_FILE)
        publisher.want("vision")  # the webhook admitted the pod
        await asyncio.to_thread(publisher.sync_once)
        kubelet_sync(kmock, "vision", mounted)
        # The variable keeps the CA of the pod's admission, as in a real pod; the file is what rotation updates.
        current = pod_settings(
            port, endpoint.ca_pem, token_file, tmp_path / "state", STITCHFLEET_INGEST_CA_FILE=str(mounted)
        )
        client = IngestClient(Endpoint.from_settings(current))
        shipper = Shipper(current.spool_dir, client, batch_rows=20, interval=60.0)
        try:
            for row in before:
                shipper.record(row)
            await delivered(shipper)

            new = rotate(tls_dir)  # the server serves the new certificate from its next handshake
            for row in after[:10]:
                shipper.record(row)
            # Before the kubelet has synced the file the old CA fails to verify: rows stay spooled, none lost.
            assert await asyncio.to_thread(shipper.flush, 10.0) is False
            assert shipper.waiting_files()
            assert "CERTIFICATE_VERIFY_FAILED" in shipper.stats.last_error

            await asyncio.to_thread(publisher.sync_once)
            kubelet_sync(kmock, "vision", mounted)
            for row in after[10:]:
                shipper.record(row)
            # The next attempt fails verification once, re-reads the file and delivers in the same request.
            caplog.set_level(logging.INFO, logger="stitchfleet.plugin")
            await delivered(shipper)
            assert "the ingestion endpoint's CA changed; retrying with the new one" in caplog.text
            assert client.trusted_ca == new.ca_pem.decode() != endpoint.ca_pem
            reverted = {
                row.fingerprint for row in rows if isinstance(row, ClusterVerdict) and row.verdict == "reverted"
            }
            assert (await asyncio.to_thread(client.recall, 30.0)).reverted == reverted  # fleet memory reads follow too
        finally:
            shipper.close()
        assert figures(url) == reference_figures(as_shipped(rows, POD), tmp_path)


@pytest.mark.asyncio
async def test_the_file_wins_while_it_holds_a_certificate_and_a_broken_file_keeps_the_ca(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    declare_pods(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    tokens = TokenApi()
    tokens.serve(kmock)
    token_file = tmp_path / "token"
    token_file.write_text(tokens.issue("vision", POD, POD_UID))
    port, tls_dir, url = free_port(), tmp_path / "tls", f"sqlite:///{tmp_path / 'telemetry.db'}"
    mounted = tmp_path / "ca.crt"
    async with serving(kmock, tls_dir, url, port=port) as endpoint:
        stranger = tls.make_self_signed(tls.service_dns_names(SERVICE, NAMESPACE)).ca_pem.decode()
        mounted.write_text(stranger)  # a CA that did not sign the endpoint's certificate
        current = pod_settings(
            port, endpoint.ca_pem, token_file, tmp_path / "state", STITCHFLEET_INGEST_CA_FILE=str(mounted)
        )
        client = IngestClient(Endpoint.from_settings(current))
        assert client.trusted_ca == stranger  # the file wins over the variable while it holds a certificate
        with pytest.raises(DeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(client.recall, 30.0)

        mounted.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        assert client.reload_trust() is False and client.trusted_ca == stranger  # a broken file keeps the CA
        mounted.unlink()  # the ConfigMap not synced into a new pod yet: the variable's CA
        assert client.reload_trust() is True and client.trusted_ca == endpoint.ca_pem
        assert (await asyncio.to_thread(client.recall, 30.0)).reverted == set()
