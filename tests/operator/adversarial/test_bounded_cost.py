"""What a client that is not a pod of ours can make the operator's server do: little, and briefly.

The real server and IngestService on loopback (kmock as the API server, ingest_harness.TokenApi as
TokenReview), attacked over raw TLS sockets: bodies announced but never sent, oversized and
chunked bodies, a dripping client, more connections than the cap, cycling invalid tokens, deep
JSON. Each test fails against the hand-written http.server this replaced (body read before the
token, 8 MB bodies parsed, a per-read timeout, no caps, no refusal cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest

from stitchfleet.operator.failure_budget import FailureBudget
from stitchfleet.operator.ingest import QUARANTINE, ROWS
from stitchfleet.operator.webhook_server import Limits
from tests.operator.ingest_harness import (
    HOSTNAME,
    Endpoint,
    TokenApi,
    add_pod,
    declare_pods,
    eventually,
    job_pod,
    serving,
)

pytestmark = pytest.mark.timeout(120)
POD, POD_UID = "resnet-train-0-x7k2p", "pod-uid-1"


@pytest.fixture
def tokens(kmock: kmock.KubernetesEmulator) -> TokenApi:
    declare_pods(kmock)
    add_pod(kmock, job_pod("vision", POD, POD_UID, "resnet-train", "run-1"))
    api = TokenApi()
    api.serve(kmock)
    return api


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'telemetry.db'}"


@contextlib.contextmanager
def tls_socket(endpoint: Endpoint, timeout: float = 20.0) -> Iterator[ssl.SSLSocket]:
    context = ssl.create_default_context(cadata=endpoint.ca_pem)
    raw = socket.create_connection(("127.0.0.1", endpoint.port), timeout=timeout)
    with context.wrap_socket(raw, server_hostname=HOSTNAME) as tls:
        yield tls


def read_answer(tls: ssl.SSLSocket) -> tuple[int, bytes]:
    """The status and everything the server sent before closing (0 when it closed without an answer)."""
    data = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while chunk := tls.recv(65536):
            data += chunk
    if not data.startswith(b"HTTP/"):
        return 0, data
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[-1]


def head(method: str, path: str, *lines: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", f"Host: {HOSTNAME}", *lines, "", ""]).encode()


def announced_body(endpoint: Endpoint, method: str, path: str, length: int, *lines: str) -> tuple[int, float]:
    """Announces a `length`-byte body, sends 1 KiB of it, and waits: the status and seconds to the answer."""
    with tls_socket(endpoint) as tls:
        started = time.monotonic()
        tls.sendall(head(method, path, f"Content-Length: {length}", "Content-Type: application/json", *lines))
        tls.sendall(b"{" + b" " * 1023)
        status, _ = read_answer(tls)
        return status, time.monotonic() - started


@pytest.mark.asyncio
async def test_an_unauthenticated_batch_is_refused_before_its_body_is_read(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        # 100 MB announced, 1 KiB sent: the answer comes at once, not after the body (which never comes).
        status, seconds = await asyncio.to_thread(
            announced_body, endpoint, "POST", ROWS, 100 * 1024 * 1024, "Authorization: Bearer not-a-token"
        )
        assert status == 401 and seconds < 5
        status, _ = await asyncio.to_thread(announced_body, endpoint, "POST", ROWS, 100 * 1024 * 1024)
        assert status == 401


@pytest.mark.asyncio
async def test_a_pods_oversized_batch_is_a_413_without_reading_it(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        bearer = f"Authorization: Bearer {tokens.issue('vision', POD, POD_UID)}"
        status, seconds = await asyncio.to_thread(announced_body, endpoint, "POST", ROWS, 100 * 1024 * 1024, bearer)
        assert status == 413 and seconds < 5


@pytest.mark.asyncio
async def test_a_review_larger_than_any_storable_pod_is_a_413_declared_or_chunked(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        status, seconds = await asyncio.to_thread(announced_body, endpoint, "POST", "/mutate", 8 * 1024 * 1024)
        assert status == 413 and seconds < 5

        def chunked() -> int:
            with tls_socket(endpoint) as tls:
                tls.sendall(head("POST", "/mutate", "Transfer-Encoding: chunked", "Content-Type: application/json"))
                chunk = b"[" * 65536
                try:
                    for _ in range(8 * 16):  # 8 MiB in 64 KiB chunks; the server stops reading past 2 MiB
                        tls.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except (ConnectionError, ssl.SSLError):
                    pass
                return read_answer(tls)[0]

        assert await asyncio.to_thread(chunked) in (413, 0)
        assert endpoint.server.limits.review_bytes == 2 * 1024 * 1024


@pytest.mark.asyncio
async def test_deeply_nested_json_is_answered_400_on_both_routes(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        deep = b"[" * 200_000 + b"]" * 200_000
        bearer = f"Bearer {tokens.issue('vision', POD, POD_UID)}"
        status, answer = await asyncio.to_thread(endpoint.call, "POST", ROWS, bearer, deep)
        assert status == 400 and "nested too deeply" in answer["error"]
        status, answer = await asyncio.to_thread(endpoint.call, "POST", "/mutate", "", deep)
        assert status == 400 and "nested too deeply" in answer["text"]


@pytest.mark.asyncio
async def test_a_dripping_client_is_cut_off_at_the_deadline_whatever_it_sends(
    kmock: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    limits = Limits(request_seconds=1.5)
    async with serving(kmock, tmp_path / "tls", db(tmp_path), limits=limits) as endpoint:

        def drip() -> float:
            with tls_socket(endpoint) as tls:
                started = time.monotonic()
                try:
                    for byte in head("POST", "/mutate", "X-Padding: " + "a" * 4000):
                        tls.sendall(bytes([byte]))
                        time.sleep(0.05)  # well within any per-read timeout
                except (ConnectionError, ssl.SSLError, OSError):
                    pass
                read_answer(tls)
                return time.monotonic() - started

        seconds = await asyncio.to_thread(drip)
        assert seconds < 1.5 + 5  # the deadline, not the 200 s the drip would take


@pytest.mark.asyncio
async def test_at_the_connection_cap_a_pod_evicts_an_idle_connection_and_is_answered(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    limits = Limits(connections=4, request_seconds=30.0)
    async with serving(kmock, tmp_path / "tls", db(tmp_path), limits=limits) as endpoint:
        context = ssl.create_default_context(cadata=endpoint.ca_pem)
        held = [
            context.wrap_socket(socket.create_connection(("127.0.0.1", endpoint.port)), server_hostname=HOSTNAME)
            for _ in range(4)
        ]
        try:
            for connection in held:
                connection.sendall(b"POST /mutate HTTP/1.1\r\nX-Drip: a")  # headers begun, never ended
            await eventually(lambda: endpoint.server.open_connections == 4, "four dripping connections", 20)
            bearer = f"Bearer {tokens.issue('vision', POD, POD_UID)}"
            for _ in range(3):  # the first evicts the oldest dripping connection; then its own slot is free
                status, answer = await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, bearer)
                assert status == 200 and answer["reverted"] == []
            assert endpoint.server.evicted == 1
            # The last client has its answer before the server has seen that connection close.
            await eventually(lambda: endpoint.server.open_connections == 3, "the last call's connection closed", 20)
            assert read_answer(held[0])[0] == 0  # closed, unanswered
        finally:
            for connection in held:
                connection.close()


REFILL_PER_SECOND = 0.001


@pytest.mark.asyncio
async def test_invalid_tokens_are_cached_and_an_address_cycling_them_is_rate_limited(
    kmock: kmock.KubernetesEmulator, tokens: TokenApi, tmp_path: Path
) -> None:
    async with serving(kmock, tmp_path / "tls", db(tmp_path)) as endpoint:
        reviewer = endpoint.service.reviewer
        # The default burst (20), refilled 1000 times slower than the default 1 a second: the burst, not the
        # machine's speed, decides what the calls below meet (at load 16 a call took over a second, a refusal
        # came back between two calls and the last status was a 401)
        endpoint.service.budget = FailureBudget(burst=20.0, per_second=REFILL_PER_SECOND)
        started = time.monotonic()
        for _ in range(5):
            assert (await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, "Bearer same-bad-token"))[0] == 401
        assert reviewer.reviews == 1  # a repeated bad token costs one TokenReview
        statuses = [
            (await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, f"Bearer bad-{index}"))[0] for index in range(60)
        ]
        assert set(statuses) == {401, 429} and statuses[-1] == 429
        refilled = math.ceil((time.monotonic() - started) * REFILL_PER_SECOND)  # 1 unless the calls took 1000 s
        assert reviewer.reviews <= 1 + 20 + refilled, (reviewer.reviews, refilled)  # the burst, and what refilled
        # A pod whose token is already verified is not held back by its address's refusals.
        good = f"Bearer {tokens.issue('vision', POD, POD_UID)}"
        endpoint.service.budget = type(endpoint.service.budget)()  # a fresh budget to verify the token once
        assert (await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, good))[0] == 200
        for index in range(40):
            await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, f"Bearer worse-{index}")
        assert (await asyncio.to_thread(endpoint.call, "GET", QUARANTINE, good))[0] == 200
