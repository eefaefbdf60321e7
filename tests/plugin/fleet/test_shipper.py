"""The pod's side of ingestion: spool, ship, survive outages, restarts and SIGKILL; the ledger's modes.

Against the real endpoint in this process (tests/operator/ingest_harness.py: webhook server,
IngestService, kmock serving TokenReview and pods, SQLite). Whatever happens in between, the
database ends with exactly the figures of the same rows written straight into a reference one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import kmock
import pytest

from stitchfleet import settings
from stitchfleet.plugin.fleet.dead_letter import refused_for_good
from stitchfleet.plugin.fleet.ingest_client import DeliveryError, Endpoint, IngestClient
from stitchfleet.plugin.fleet.ledger import Ledger, SpoolSink
from stitchfleet.plugin.fleet.shipper import Shipper
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry import spool
from stitchfleet.telemetry.rows import Row
from tests.operator.ingest_harness import (
    TokenApi,
    add_pod,
    as_shipped,
    declare_pods,
    job_pod,
    pod_settings,
    serving,
)
from tests.operator.operator_process import free_port
from tests.telemetry.test_recorder import reference_figures
from tests.telemetry.workload import figures, windows_in, workload

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[3]
POD, POD_UID = "resnet-train-0-x7k2p", "pod-uid-1"
WAIT_SECONDS = 60.0


@pytest.fixture
def tokens(kmock: kmock.KubernetesEmulator) -> TokenApi:
    declare_pods(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    api = TokenApi()
    api.serve(kmock)
    return api


def pod_env(tmp_path: Path, tokens: TokenApi, port: int, ca_pem: str) -> settings.Settings:
    token_file = tmp_path / "token"
    token_file.write_text(tokens.issue("vision", POD, POD_UID))
    return pod_settings(port, ca_pem, token_file, tmp_path / "state", STITCHFLEET_INGEST_TIMEOUT_SECONDS="2")


async def eventually(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"


@pytest.mark.asyncio
async def test_endpoint_unreachable_for_a_while_keeps_rows_then_delivers_them_once(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    rows = workload(windows=40, ranks=2)
    port, tls_dir = free_port(), tmp_path / "tls"
    async with serving(kmock, tls_dir, db(tmp_path)) as first:
        ca_pem = first.ca_pem  # the CA the pod was injected with; the endpoint restarts with it below
    current = pod_env(tmp_path, tokens, port, ca_pem)
    client = IngestClient(Endpoint.from_settings(current))
    shipper = Shipper(current.spool_dir, client, batch_rows=50, interval=0.2, max_backoff=1.0)
    try:
        for row in rows:
            shipper.record(row)
        await eventually(lambda: shipper.stats.failures >= 4, "four failed attempts")
        assert shipper.stats.shipped == 0
        assert sum(len(spool.read(p).rows) for p in shipper.waiting_files()) == len(rows)  # all on disk
        assert 0 < shipper._backoff <= 1.0  # bounded: it keeps trying, at most a second apart
        async with serving(kmock, tls_dir, db(tmp_path), port=port) as endpoint:
            await eventually(lambda: not shipper.waiting_files(), "the spool to drain by itself")
            assert figures(endpoint.url) == reference_figures(as_shipped(rows, POD), tmp_path)
    finally:
        shipper.close()
    assert shipper.stats.shipped == len(rows)


@pytest.mark.asyncio
async def test_operator_restarted_mid_ingest_loses_and_doubles_nothing(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    rows = workload(windows=300, ranks=2)
    port, tls_dir, url = free_port(), tmp_path / "tls", db(tmp_path)
    windows = sum(isinstance(row, r.StepWindow) for row in rows)
    first_life = contextlib.AsyncExitStack()
    endpoint = await first_life.enter_async_context(serving(kmock, tls_dir, url, port=port))
    current = pod_env(tmp_path, tokens, port, endpoint.ca_pem)
    shipper = Shipper(current.spool_dir, IngestClient(Endpoint.from_settings(current)), batch_rows=5)
    try:
        for row in rows:
            shipper.record(row)
        flushing = asyncio.create_task(asyncio.to_thread(shipper.flush, WAIT_SECONDS))
        await eventually(lambda: windows_in(url) > 0, "the first batches")
        # The operator stops between two batches, or under one (its answer then never comes).
        await first_life.aclose()
        assert windows_in(url) < windows
        assert await flushing is False
        async with serving(kmock, tls_dir, url, port=port) as again:
            # ~240 requests: at load 16 they took longer than one flush's bound, so flush again while each
            # flush delivers something (the claim is "delivers everything once", not a speed)
            shipped = shipper.stats.shipped
            while not await asyncio.to_thread(shipper.flush, WAIT_SECONDS):
                assert shipper.stats.shipped > shipped, f"nothing delivered in {WAIT_SECONDS} s after the restart"
                shipped = shipper.stats.shipped
            assert figures(again.url) == reference_figures(as_shipped(rows, POD), tmp_path)
    finally:
        await first_life.aclose()
        shipper.close()


def _read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(WAIT_SECONDS):
            raise AssertionError(f"the shipping process said nothing for {WAIT_SECONDS} s")
    return process.stdout.readline().strip()


@pytest.mark.asyncio
async def test_pod_sigkilled_mid_batch_is_shipped_by_its_next_process(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    url = db(tmp_path)
    async with serving(kmock, tmp_path / "tls", url) as endpoint:
        current = pod_env(tmp_path, tokens, endpoint.port, endpoint.ca_pem)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_")}
        env |= {"PYTHONPATH": str(REPO), "STITCHFLEET_INGEST_URL": current.ingest_url}
        env |= {
            "STITCHFLEET_INGEST_CA": current.ingest_ca,
            "STITCHFLEET_INGEST_SERVER_NAME": current.ingest_server_name,
        }
        env |= {"STITCHFLEET_INGEST_TOKEN_FILE": str(current.ingest_token_file)}
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.plugin.shipping_child", str(current.spool_dir)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert (await asyncio.to_thread(_read_line, child)).startswith("half")
            # The kubelet rotated the token; the API server is slow to review the new one.
            current.ingest_token_file.write_text(tokens.issue("vision", POD, POD_UID))
            tokens.open.clear()
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            assert await asyncio.to_thread(_read_line, child) == "shipping"
            await eventually(lambda: tokens.pending > 0, "the second half's first batch in flight")
            child.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(child.wait, WAIT_SECONDS) == -signal.SIGKILL
        finally:
            tokens.open.set()
            if child.poll() is None:
                child.kill()
                child.wait(WAIT_SECONDS)
        [orphan] = current.spool_dir.glob("*.jsonl")  # the batch in flight: still on disk
        rows = workload(windows=60, ranks=2)
        assert figures(url) != reference_figures(as_shipped(rows, POD), tmp_path)
        successor = Shipper(current.spool_dir, IngestClient(Endpoint.from_settings(current)))
        try:
            assert await asyncio.to_thread(successor.flush, WAIT_SECONDS)
        finally:
            successor.close()
        assert not orphan.exists()
        assert figures(url) == reference_figures(as_shipped(rows, POD), tmp_path)


@pytest.mark.asyncio
async def test_ledger_in_a_pod_ships_reads_the_quarantine_and_never_opens_the_database(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        current = pod_env(tmp_path, tokens, endpoint.port, endpoint.ca_pem)
        first = Ledger(_job(current), 0, 1)
        assert isinstance(first.recorder, Shipper)
        for row in workload(windows=3, ranks=1):
            first.record(row)
        assert await asyncio.to_thread(first.reverted) == set()  # asked before anything arrived
        await asyncio.to_thread(first.close)
        again = Ledger(_job(current), 0, 1)
        assert await asyncio.to_thread(again.reverted) == {"fp-ln-bwd"}
        await asyncio.to_thread(again.close)
        assert not (tmp_path / "state" / "telemetry.db").exists()  # no SQLite beside the spool
        assert any(job[0] == "run-1" for job in figures(endpoint.url)["jobs"])  # type: ignore[index,union-attr]


@pytest.mark.asyncio
async def test_unreachable_fleet_memory_proceeds_from_the_cache_or_without_and_says_so(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        current = pod_env(tmp_path, tokens, endpoint.port, endpoint.ca_pem)
        ledger = Ledger(_job(current), 0, 1)
        for row in workload(windows=3, ranks=1):
            ledger.record(row)
        await asyncio.to_thread(ledger.close)
        fresh = Ledger(_job(current), 0, 1)
        assert await asyncio.to_thread(fresh.reverted) == {"fp-ln-bwd"}  # cached in the pod's state dir
        await asyncio.to_thread(fresh.close)
    # The operator is gone: the next begin uses the pod's copy and records that it did.
    down = pod_settings(free_port(), endpoint.ca_pem, current.ingest_token_file, tmp_path / "state")
    cached = Ledger(_job(down), 0, 1)
    started = time.monotonic()
    assert cached.reverted() == {"fp-ln-bwd"}
    assert time.monotonic() - started < 5.0
    cached.close()
    (tmp_path / "state" / "fleet-memory.json").unlink()
    blind = Ledger(_job(down), 0, 1)
    assert blind.reverted() == set()
    blind.close()
    events = [
        row
        for path in (tmp_path / "state" / "spool").glob("*.jsonl")
        for row in spool.read(path).rows
        if isinstance(row, r.Event) and row.kind == "fleet_memory"
    ]
    assert sorted(event.reason for event in events) == ["fleet memory from cache", "fleet memory unavailable"]
    assert all("cannot reach" in event.detail for event in events)


def test_local_mode_without_an_endpoint_is_as_before(tmp_path: Path) -> None:
    local = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / "state"), "STITCHFLEET_JOB_UID": "u"})
    ledger = Ledger(local, 0, 1)
    try:
        assert type(ledger.recorder).__name__ == "Recorder"  # SQLAlchemy is here: SQLite directly
        assert ledger.memory is None
    finally:
        ledger.close()
    plain = {"STITCHFLEET_INGEST_URL": "http://plain.example/ingest", "STITCHFLEET_JOB_UID": "u"}
    fallback = Ledger(settings.load({**plain, "STITCHFLEET_STATE_DIR": str(tmp_path / "s2")}), 0, 1)
    assert isinstance(fallback.recorder, SpoolSink)  # a bad endpoint never loses rows: the spool keeps them
    fallback.close()


def _job(current: settings.Settings) -> settings.Settings:
    """The pod's settings with the job identity the webhook injects."""
    return dataclasses.replace(current, namespace="vision", job_name="resnet-train", job_uid="run-1")


class WatchedClient(IngestClient):
    """The real client, noting every request that did not deliver (the shipper's stats count only some)."""

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self.errors: list[DeliveryError] = []

    def post_rows(self, rows: Sequence[Row], timeout: float | None = None) -> int:
        try:
            return super().post_rows(rows, timeout=timeout)
        except DeliveryError as err:
            self.errors.append(err)
            raise


@pytest.mark.asyncio
async def test_a_row_refused_for_good_is_dead_lettered_with_an_event_and_the_rest_ships(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    rows = workload(windows=30, ranks=1)
    # A row of another job (what a pod gets when its job uid comes from valueFrom): 403 for good.
    foreign = dataclasses.replace(rows[5], job=dataclasses.replace(rows[5].job, job_uid="run-of-another-job"))  # type: ignore[union-attr]
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        current = pod_env(tmp_path, tokens, endpoint.port, endpoint.ca_pem)
        client = WatchedClient(Endpoint.from_settings(current))
        shipper = Shipper(current.spool_dir, client, batch_rows=16, interval=0.2)
        try:
            for row in [*rows[:10], foreign, *rows[10:]]:
                shipper.record(row)
            await eventually(
                lambda: shipper.stats.dead_lettered == 1 and not shipper.waiting_files(), "the spool to drain"
            )
            stored = figures(endpoint.url)
        finally:
            shipper.close()
        [entry] = shipper.dead_letters.rows()
        assert entry["status"] == 403 and entry["row"]["job"]["job_uid"] == "run-of-another-job"  # type: ignore[index]
        reference = reference_figures(as_shipped(rows, POD), tmp_path)
        assert stored["per_job"] == reference["per_job"] and stored["jobs"] == reference["jobs"]  # all the rest
        assert stored["events"] == reference["events"] + 1  # and the event saying one row was refused
        # The refusals (403: the foreign row alone, and the halves holding it) are never counted as failures; only
        # requests left without an answer are (none on a quiet machine; a read timed out once under load 16)
        refusals = [err.status for err in client.errors if refused_for_good(err.status)]
        assert refusals and set(refusals) == {403}
        transient = [err for err in client.errors if not refused_for_good(err.status)]
        assert shipper.stats.shipped == len(rows) and shipper.stats.failures == len(transient), client.errors
