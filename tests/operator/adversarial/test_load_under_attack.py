"""Pods shipping while the server is attacked: every acknowledged row lands exactly once.

The real server and IngestService with kmock, on SQLite and PostgreSQL. Eight pods' Shippers (one
job each) deliver their spools while attackers hold dripping connections past the connection cap,
send unauthenticated oversized bodies, and cycle invalid tokens. Slow tier (tens of seconds); the
attacks one by one are the fast slice (test_bounded_cost.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path

import kmock
import pytest

from stitchfleet.operator.ingest import ROWS
from stitchfleet.operator.webhook_server import Limits
from stitchfleet.plugin.fleet.ingest_client import Endpoint, IngestClient
from stitchfleet.plugin.fleet.shipper import Shipper
from stitchfleet.telemetry import rows as r
from tests.operator.ingest_harness import (
    HOSTNAME,
    TokenApi,
    add_pod,
    as_shipped,
    declare_pods,
    job_pod,
    pod_settings,
    serving,
)
from tests.operator.ingest_harness import Endpoint as Served
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PODS = 8
ATTACKER = "127.0.0.2"


def attack(endpoint: Served, stop: threading.Event) -> None:
    """Drips, oversized unauthenticated bodies and invalid tokens until `stop`, from another address than
    the pods' (in a cluster each pod has its own; refused tokens are budgeted per address)."""
    context = ssl.create_default_context(cadata=endpoint.ca_pem)

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", endpoint.port), 5, source_address=(ATTACKER, 0))
        return context.wrap_socket(raw, server_hostname=HOSTNAME)

    held: list[ssl.SSLSocket] = []
    index = 0
    while not stop.is_set():
        index += 1
        with contextlib.suppress(OSError):
            tls = connect()
            tls.sendall(b"POST /ingest/v1/rows HTTP/1.1\r\nX-Drip: a")
            held.append(tls)
        with contextlib.suppress(OSError):
            big = f"POST {ROWS} HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n"
            tls = connect()
            tls.sendall(f"{big}Authorization: Bearer forged-{index}\r\n\r\n".encode() + b"{" * 65536)
            tls.close()
        time.sleep(0.02)
    for tls in held:
        with contextlib.suppress(OSError):
            tls.close()


@pytest.mark.asyncio
async def test_every_acknowledged_row_lands_once_while_the_server_is_attacked(
    kmock: kmock.KubernetesEmulator, any_url: str, tmp_path: Path
) -> None:
    declare_pods(kmock)
    api = TokenApi()
    api.serve(kmock)
    every: list[r.Row] = []
    limits = Limits(connections=64)  # small, so the drip reaches the cap within the test
    async with serving(kmock, tmp_path / "tls", any_url, limits=limits) as endpoint:
        shippers = []
        for pod in range(PODS):
            add_pod(kmock, job_pod("vision", f"pod-{pod}", f"pod-uid-{pod}", "resnet-train", f"run-{pod}"))
            token = tmp_path / f"token-{pod}"
            token.write_text(api.issue("vision", f"pod-{pod}", f"pod-uid-{pod}"))
            current = pod_settings(endpoint.port, endpoint.ca_pem, token, tmp_path / f"state-{pod}")
            shipper = Shipper(
                current.spool_dir, IngestClient(Endpoint.from_settings(current)), batch_rows=20, interval=0.2
            )
            rows = workload(uid=f"run-{pod}", windows=30, ranks=1)
            every += as_shipped(rows, f"pod-{pod}")
            shippers.append((shipper, rows))
        stop = threading.Event()
        attacker = threading.Thread(target=attack, args=(endpoint, stop), daemon=True)
        attacker.start()
        try:
            began = time.monotonic()
            while endpoint.server.open_connections < limits.connections:  # the drip fills the server first
                assert time.monotonic() - began < 60, "the attack did not reach the connection cap"
                await asyncio.sleep(0.1)
            for shipper, rows in shippers:
                for row in rows:
                    shipper.record(row)
            deadline = time.monotonic() + 180
            while any(shipper.waiting_files() for shipper, _ in shippers):
                stats = [shipper.stats for shipper, _ in shippers]
                assert time.monotonic() < deadline, f"the pods' spools did not drain under attack: {stats}"
                await asyncio.sleep(0.2)
            assert endpoint.server.evicted > 0  # the drip did reach the cap
        finally:
            stop.set()
            attacker.join(30)
            for shipper, _ in shippers:
                shipper.close()
        assert all(shipper.stats.dead_lettered == 0 for shipper, _ in shippers)
        assert figures(endpoint.url) == reference_figures(every, tmp_path)
