"""The real `stitchfleet operator` process SIGKILLed mid-ingest and started again, into PostgreSQL.

A pod's Shipper (this process) delivers a workload in small batches; once some of it is in the
database the operator is killed (no goodbye: a batch may be committed but never acknowledged),
then a new operator process starts on the same TLS dir (it keeps the CA the pod trusts) and the
pod's shipper delivers the rest on its own. The database then holds exactly the figures of the
same rows written straight into a reference database: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest
from ingest_harness import HOSTNAME, TokenApi, add_pod, as_shipped, eventually, job_pod
from operator_process import Ports, child_environment, declare_cluster, http_get, operator_process, write_kubeconfig

from stitchfleet import settings
from stitchfleet.operator.ingest import BASE
from stitchfleet.plugin.fleet.ingest_client import Endpoint, IngestClient
from stitchfleet.plugin.fleet.shipper import Shipper
from stitchfleet.telemetry import rows as r
from tests.telemetry.conftest import create_database, running_server
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, windows_in, workload

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]
POD, POD_UID = "resnet-train-0-x7k2p", "pod-uid-1"


@pytest.fixture
def pg_url() -> Iterator[str]:
    with running_server() as server:
        yield create_database(server)


@pytest.mark.asyncio
async def test_operator_sigkilled_mid_ingest_and_restarted(
    kmock: kmock.KubernetesEmulator, pg_url: str, tmp_path: Path
) -> None:
    declare_cluster(kmock)
    tokens = TokenApi()
    tokens.serve(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    ports = Ports.pick()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))
    env = child_environment(tmp_path, ports, kubeconfig, STITCHFLEET_DB_URL=pg_url)
    rows = workload(windows=400, ranks=2)
    windows = sum(isinstance(row, r.StepWindow) for row in rows)
    token_file = tmp_path / "token"
    token_file.write_text(tokens.issue("vision", POD, POD_UID))
    shipper: Shipper | None = None
    try:
        async with operator_process(env, tmp_path / "operator-1.log") as first:
            await first.eventually(lambda: http_get(ports.health, "/healthz"), "/healthz answer", 60)
            ca_pem = (tmp_path / "tls" / "ca.crt").read_text()  # what the webhook injects into the pod
            current = settings.load(
                {
                    "STITCHFLEET_INGEST_URL": f"https://127.0.0.1:{ports.webhook}{BASE}",
                    "STITCHFLEET_INGEST_CA": ca_pem,
                    "STITCHFLEET_INGEST_SERVER_NAME": HOSTNAME,
                    "STITCHFLEET_INGEST_TOKEN_FILE": str(token_file),
                }
            )
            client = IngestClient(Endpoint.from_settings(current))
            shipper = Shipper(tmp_path / "spool", client, batch_rows=4, interval=0.2, max_backoff=1.0)
            for row in rows:
                shipper.record(row)
            await eventually(lambda: windows_in(pg_url) > 0, "the first batches in PostgreSQL")
            first.child.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(first.child.wait, 30) == -signal.SIGKILL
        assert windows_in(pg_url) < windows, "killed too late: everything had arrived"
        async with operator_process(env, tmp_path / "operator-2.log") as second:
            await second.eventually(lambda: http_get(ports.health, "/healthz"), "the restarted operator", 60)
            assert (tmp_path / "tls" / "ca.crt").read_text() == ca_pem  # the pod's CA still verifies
            await eventually(lambda: not shipper.waiting_files(), "the pod's spool to drain", 120)
            assert figures(pg_url) == reference_figures(as_shipped(rows, POD), tmp_path)
            assert shipper.stats.failures >= 1
    finally:
        if shipper is not None:
            shipper.close()
