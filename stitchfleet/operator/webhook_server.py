"""The HTTPS server of the admission webhook and the ingestion endpoint, embeddable in the operator.

Input: an `InjectionConfig`, a TLS dir (tls.crt, tls.key), a host/port and optionally an
`IngestService`. Output: a server answering POST /mutate with admission.review() (400 for a body
that is not an AdmissionReview), the ingestion endpoint's paths (ingest.py), 404 elsewhere. aiohttp's
low-level server on its own event loop in a thread: admissions never wait on kopf's loop, and
`start()`/`stop()` are plain calls. Every request's cost is bounded before it is authenticated
(`Limits`; docs/operator-limits.md): a connection cap, a handshake timeout and a whole-connection
deadline, per-route body limits checked before reading, the token checked before an ingest body is
read, and worker caps. A changed tls.crt/tls.key is served from the next handshake on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from stitchfleet.operator import admission
from stitchfleet.operator.ingest import QUARANTINE, IngestService, Refused
from stitchfleet.operator.injection import InjectionConfig
from stitchfleet.operator.tls import CA_FILE, CERT_FILE, KEY_FILE
from stitchfleet.settings import Settings

PATH = "/mutate"
log = logging.getLogger("stitchfleet.operator.webhook")
T = TypeVar("T")
# (inode, mtime, size) of tls.crt and tls.key: an atomic replace or a Secret update always changes the inode.
Stamp = tuple[int, ...]


@dataclass(frozen=True)
class Limits:
    """What one client may cost the server; the reasons for each figure are in docs/operator-limits.md."""

    # etcd refuses objects over 1.5 MiB by default, so no pod that can be stored makes a larger
    # review; 2 MiB leaves room for the review's envelope (userInfo, options).
    review_bytes: int = 2 * 1024 * 1024
    # 5000 rows (ingest.MAX_ROWS) of a few hundred bytes each.
    ingest_bytes: int = 4 * 1024 * 1024
    connections: int = 256
    handshake_seconds: float = 5.0
    # From the end of the handshake to the last byte of the answer, whatever the client drips.
    request_seconds: float = 15.0
    # Reviews parsed at once (a 2 MiB review costs ~25 MB of Python objects while parsed).
    review_workers: int = 2
    # Bodies read, parsed and written at once; the others wait for a slot without holding a body.
    ingest_workers: int = 4
    # TokenReviews and pod reads in flight.
    auth_workers: int = 4
    # How long a request may wait for a worker before it is answered 503 (ingest) or the review is refused.
    queue_seconds: float = 4.0


class _BodyTooLargeError(Exception):
    pass


class _BodyIncompleteError(Exception):
    pass


class _GuardedServer(web.Server):
    """aiohttp's low-level server with a connection cap and a deadline on each connection.

    At the cap a new connection evicts the oldest one that has no request in progress (a client
    that connected and sends nothing, or drips its headers), so idle attackers cannot crowd out
    a pod or the API server; only when every connection is busy is the new one closed.
    """

    def __init__(self, handler: _Routes, limits: Limits) -> None:
        # After an early answer (401, 413) the unread body is drained for a second at most, not 10.
        super().__init__(handler, keepalive_timeout=limits.request_seconds, lingering_time=1.0)
        self.limits, self._routes = limits, handler
        self._deadlines: dict[RequestHandler, tuple[asyncio.Transport, asyncio.TimerHandle]] = {}
        self.evicted = 0

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        if len(self._deadlines) >= self.limits.connections and not self._evict_idle():
            transport.abort()
            return
        super().connection_made(handler, transport)
        timer = asyncio.get_running_loop().call_later(self.limits.request_seconds, transport.abort)
        self._deadlines[handler] = (transport, timer)

    def _evict_idle(self) -> bool:
        # Oldest first: one that never completed its headers, else one whose answer is already sent.
        waiting = [handler for handler in self._deadlines if handler not in self._routes.started]
        done = [handler for handler in self._deadlines if handler not in self._routes.busy]
        for handler in (waiting or done)[:1]:
            self.evicted += 1
            self._deadlines[handler][0].abort()
            self._forget(handler)
            return True
        return False

    def _forget(self, handler: RequestHandler) -> None:
        entry = self._deadlines.pop(handler, None)
        if entry is not None:
            entry[1].cancel()
        self._routes.started.discard(handler)
        self._routes.busy.discard(handler)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._forget(handler)
        super().connection_lost(handler, exc)

    @property
    def open_connections(self) -> int:
        return len(self._deadlines)

    def abort_all(self) -> None:
        """Closes every connection now (the server is stopping)."""
        for handler, (transport, _) in list(self._deadlines.items()):
            transport.abort()
            self._forget(handler)


class _Certificates:
    """The serving certificate, reloaded when its files change (checked at each TLS handshake)."""

    def __init__(self, tls_dir: Path) -> None:
        self.tls_dir = tls_dir
        self._stamp: Stamp | None = None
        self.current = self._load()
        # The listening context hands each handshake to the newest loaded context.
        self.listening = self._load()
        self.listening.sni_callback = self._pick

    def _files(self) -> tuple[Path, Path]:
        return self.tls_dir / CERT_FILE, self.tls_dir / KEY_FILE

    def _current_stamp(self) -> Stamp:
        stats = [path.stat() for path in self._files()]
        return tuple(value for stat in stats for value in (stat.st_ino, stat.st_mtime_ns, stat.st_size))

    def _load(self) -> ssl.SSLContext:
        stamp = self._current_stamp()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        cert, key = self._files()
        context.load_cert_chain(cert, key)
        self._stamp = stamp
        return context

    def reload_if_changed(self) -> bool:
        """Swaps in a new context when the files changed; a half-written pair keeps the old one."""
        try:
            if self._current_stamp() == self._stamp:
                return False
            self.current = self._load()
        except (OSError, ssl.SSLError) as err:
            log.warning("webhook certificate in %s not (re)loaded, keeping the current one: %s", self.tls_dir, err)
            return False
        log.info("webhook certificate reloaded from %s", self.tls_dir)
        return True

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _context: ssl.SSLContext) -> None:
        self.reload_if_changed()
        connection.context = self.current


class _Routes:
    """The request handler: routing, limits, and the blocking work on bounded worker pools."""

    def __init__(
        self,
        config: InjectionConfig,
        tls_dir: Path,
        mutate_path: str,
        ingest: IngestService | None,
        limits: Limits,
        *,
        on_injected: Callable[[str], None] | None = None,
    ) -> None:
        self.config, self.mutate_path, self.ingest, self.limits = config, mutate_path, ingest, limits
        self.on_injected = on_injected
        self._ca_file, self._ca_stamp = tls_dir / CA_FILE, _stamp_of(tls_dir / CA_FILE)
        self._reviews = concurrent.futures.ThreadPoolExecutor(limits.review_workers, "stitchfleet-review")
        self._auth = concurrent.futures.ThreadPoolExecutor(limits.auth_workers, "stitchfleet-auth")
        self._writes = concurrent.futures.ThreadPoolExecutor(limits.ingest_workers, "stitchfleet-ingest")
        self._review_slots = asyncio.Semaphore(limits.review_workers)
        self._auth_slots = asyncio.Semaphore(limits.auth_workers * 4)
        self._write_slots = asyncio.Semaphore(limits.ingest_workers)
        # Connections whose request began (headers complete), and those being handled (never evicted).
        self.started: set[object] = set()
        self.busy: set[object] = set()

    def close(self) -> None:
        for pool in (self._reviews, self._auth, self._writes):
            pool.shutdown(wait=False, cancel_futures=True)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        self.started.add(request.protocol)
        self.busy.add(request.protocol)
        try:
            async with asyncio.timeout(self.limits.request_seconds):
                response = await self._route(request)
        except TimeoutError:
            response = _text(408, "the request took longer than the server allows")
        finally:
            self.busy.discard(request.protocol)
        # One request per connection: the connection's deadline is the request's.
        response.force_close()
        return response

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        if self.ingest is not None and self.ingest.handles(request.path):
            return await self._ingest(request)
        if request.path != self.mutate_path:
            return _text(404, f"no such path {request.path!r}; the webhook serves POST {self.mutate_path}")
        if request.method != "POST":
            return _text(405, f"the webhook serves POST {self.mutate_path}")
        return await self._mutate(request)

    async def _mutate(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            async with _slot(self._review_slots, self.limits.queue_seconds):
                body = await _body(request, self.limits.review_bytes)
                config = self._current_config()
                answer = await _run(self._reviews, lambda: admission.review(body, config, self.on_injected))
        except _BodyTooLargeError:
            return _text(413, f"an AdmissionReview is at most {self.limits.review_bytes} bytes")
        except _BodyIncompleteError:
            return _text(400, "the body ended before its announced length")
        except _BusyError:
            return _text(503, "too many reviews in progress")
        except admission.ReviewError as err:
            log.warning("bad admission request from %s: %s", request.remote, err)
            return _text(400, f"bad AdmissionReview: {err}")
        return web.Response(status=200, body=json.dumps(answer).encode(), content_type="application/json")

    def _current_config(self) -> InjectionConfig:
        """The injection config with the CA now in the TLS dir: a renewal (cert-manager, a new Secret)
        reaches the pods admitted after it at once, not after an operator restart."""
        if not self.config.ingest_ca:
            return self.config  # no CA injected (system CAs): nothing to follow
        stamp = _stamp_of(self._ca_file)
        if stamp is not None and stamp != self._ca_stamp:
            try:
                ca_pem = self._ca_file.read_text()
            except OSError:
                return self.config
            if "BEGIN CERTIFICATE" in ca_pem:
                self.config, self._ca_stamp = dataclasses.replace(self.config, ingest_ca=ca_pem), stamp
                log.info("pods admitted from now on get the CA in %s", self._ca_file)
        return self.config

    async def _ingest(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self.ingest is not None
        ingest, method, path = self.ingest, request.method, request.path
        try:
            route = ingest.route(method, path)
            authorization, address = request.headers.get("Authorization", ""), request.remote or ""
            # The token first: nothing of the body is read for a caller that is not a pod of ours.
            async with _slot(self._auth_slots, self.limits.queue_seconds):
                job = await _run(self._auth, lambda: ingest.authenticate(authorization, address))
            async with _slot(self._write_slots, self.limits.queue_seconds):
                if route == QUARANTINE:
                    answer = await _run(self._writes, lambda: ingest.memory(job))
                else:
                    body = await _body(request, self.limits.ingest_bytes)
                    answer = await _run(self._writes, lambda: ingest.store(job, body))
        except Refused as refusal:
            answer = ingest.refusal(method, path, refusal)
        except _BodyTooLargeError:
            answer = ingest.refusal(method, path, Refused(413, f"a batch is at most {self.limits.ingest_bytes} bytes"))
        except _BodyIncompleteError:
            answer = ingest.refusal(method, path, Refused(400, "the body ended before its announced length"))
        except _BusyError:
            answer = ingest.refusal(method, path, Refused(503, "the endpoint is busy; retry later"))
        return _json(answer.status, answer.body, answer.headers)


class _BusyError(Exception):
    pass


class _slot:  # noqa: N801 (used as a context manager, like asyncio.timeout)
    """A semaphore slot, waited for at most `seconds`; _BusyError after that."""

    def __init__(self, semaphore: asyncio.Semaphore, seconds: float) -> None:
        self._semaphore, self._seconds = semaphore, seconds

    async def __aenter__(self) -> None:
        try:
            await asyncio.wait_for(self._semaphore.acquire(), self._seconds)
        except TimeoutError:
            raise _BusyError from None

    async def __aexit__(self, *_: object) -> None:
        self._semaphore.release()


def _stamp_of(path: Path) -> Stamp | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


async def _run(pool: concurrent.futures.ThreadPoolExecutor, call: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool, call)


async def _body(request: web.BaseRequest, limit: int) -> bytes:
    """The body, read only up to `limit` bytes (declared or chunked); _BodyTooLargeError beyond."""
    if request.content_length is not None and request.content_length > limit:
        raise _BodyTooLargeError
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = await request.content.readany()
        except ConnectionError:  # the client went away mid-body (its own timeout): nothing to answer
            raise _BodyIncompleteError from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise _BodyTooLargeError
        chunks.append(chunk)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain", charset="utf-8")


def _json(status: int, body: Mapping[str, object], headers: Mapping[str, str]) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json", headers=headers)


class WebhookServer:
    """The admission webhook over HTTPS; start() binds and serves in a thread, stop() ends it."""

    def __init__(
        self,
        config: InjectionConfig,
        tls_dir: Path,
        *,
        host: str = "0.0.0.0",
        port: int = 8443,
        path: str = PATH,
        ingest: IngestService | None = None,
        limits: Limits | None = None,
        on_injected: Callable[[str], None] | None = None,
    ) -> None:
        self._config, self._ingest, self._tls_dir = config, ingest, tls_dir
        self._on_injected = on_injected
        self._address, self._path = (host, port), path
        self.limits = limits or Limits()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._certificates: _Certificates | None = None
        self._server: _GuardedServer | None = None
        self._listener: asyncio.Server | None = None
        self._routes: _Routes | None = None
        self._stopped: asyncio.Event | None = None

    @classmethod
    def from_settings(
        cls,
        current: Settings,
        *,
        host: str = "0.0.0.0",
        ingest: IngestService | None = None,
        on_injected: Callable[[str], None] | None = None,
    ) -> WebhookServer:
        """The server the operator runs: port, TLS dir and injection config from settings; `on_injected` gets the
        namespace of each pod the webhook patches (the CA publisher's cue)."""
        config = InjectionConfig.from_settings(current)
        port = current.webhook_port
        return cls(config, current.webhook_tls_dir, host=host, port=port, ingest=ingest, on_injected=on_injected)

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        if self._listener is None:
            raise RuntimeError("the webhook server is not started")
        return int(self._listener.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        """Connections past their handshake and not yet closed."""
        return 0 if self._server is None else self._server.open_connections

    @property
    def evicted(self) -> int:
        """Idle connections closed to make room for a new one at the cap."""
        return 0 if self._server is None else self._server.evicted

    def start(self) -> None:
        """Loads the certificate, binds, and serves on an event loop in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the webhook server is already started")
        self._certificates = _Certificates(self._tls_dir)  # a missing file fails here, in the caller
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="stitchfleet-webhook", daemon=True)
        self._thread.start()
        try:
            started.result()
        except BaseException:
            self._thread.join(5.0)
            self._thread = None
            raise
        log.info("admission webhook serving https://%s:%d%s", self._address[0], self.port, self._path)

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(started))
        except BaseException as err:
            if not started.done():
                started.set_exception(err)
        finally:
            loop.close()

    async def _main(self, started: concurrent.futures.Future[None]) -> None:
        assert self._certificates is not None
        self._stopped = asyncio.Event()
        self._routes = _Routes(
            self._config, self._tls_dir, self._path, self._ingest, self.limits, on_injected=self._on_injected
        )
        self._server = _GuardedServer(self._routes, self.limits)
        self._listener = await asyncio.get_running_loop().create_server(
            self._server,
            self._address[0],
            self._address[1],
            ssl=self._certificates.listening,
            ssl_handshake_timeout=self.limits.handshake_seconds,
            backlog=128,
        )
        started.set_result(None)
        try:
            await self._stopped.wait()
        finally:
            self._listener.close()
            await self._server.shutdown(1.0)
            self._server.abort_all()  # idle and dripping ones too: wait_closed waits for every connection
            await self._listener.wait_closed()
            self._routes.close()

    def reload_certificates(self) -> bool:
        """Reloads tls.crt/tls.key now if they changed (the server also checks at each handshake)."""
        if self._certificates is None:
            raise RuntimeError("the webhook server is not started")
        return self._certificates.reload_if_changed()

    def stop(self, timeout: float = 5.0) -> None:
        """Stops accepting, closes the connections and waits for the serving thread."""
        if self._thread is None:
            return
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(timeout)
        self._thread = None
        self._listener = None
        self._server = None

    def __enter__(self) -> WebhookServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
