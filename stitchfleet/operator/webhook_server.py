"""The HTTPS server of the admission webhook, embeddable in the operator process.

Input: an `InjectionConfig`, a TLS dir (tls.crt, tls.key) and a host/port. Output:
a server thread answering POST /mutate with admission.review(); 400 for a body that
is not an AdmissionReview; the ingestion endpoint's paths (/ingest/v1/..., ingest.py) when an
`IngestService` is given, on the same port and certificate; 404 for other paths. `start()` and `stop()` are plain
calls (no event loop needed, so kopf's startup/cleanup handlers can own it), and the
certificate is reloaded when tls.crt or tls.key change on disk (cert-manager
rotation, or the operator writing fresh self-signed material).

Stdlib ThreadingHTTPServer + ssl rather than aiohttp: a thread keeps admission
answers independent of how busy kopf's event loop is, within the 5 s API timeout.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from stitchfleet.operator import admission
from stitchfleet.operator.ingest import IngestService
from stitchfleet.operator.injection import InjectionConfig
from stitchfleet.operator.tls import CERT_FILE, KEY_FILE
from stitchfleet.settings import Settings

PATH = "/mutate"
# Pods are small; the API server caps objects near 3 MiB, and a review holds at most two.
MAX_BODY = 8 * 1024 * 1024
# Covers the TLS handshake and reading the request; the API server waits 5 s at most.
CONNECTION_TIMEOUT = 10.0

log = logging.getLogger("stitchfleet.operator.webhook")

# (inode, mtime, size) of tls.crt and tls.key: an atomic replace or a Secret update always changes the inode.
Stamp = tuple[int, ...]


class _Handler(BaseHTTPRequestHandler):
    """One connection: TLS handshake, one request, close (HTTP/1.0)."""

    # Closing after each answer means the API server never reuses a connection we are about to drop.
    protocol_version = "HTTP/1.0"
    server: _HTTPServer

    def setup(self) -> None:
        self.request.settimeout(CONNECTION_TIMEOUT)
        self.request.do_handshake()
        super().setup()

    def do_POST(self) -> None:
        if self._ingest("POST"):
            return
        if self.path.split("?", 1)[0] != self.server.mutate_path:
            self._send_text(404, f"no such path {self.path!r}; the webhook serves POST {self.server.mutate_path}")
            return
        body = self._body()
        if body is None:
            return
        try:
            answer = admission.review(body, self.server.config)
        except admission.ReviewError as err:
            log.warning("bad admission request from %s: %s", self.client_address[0], err)
            self._send_text(400, f"bad AdmissionReview: {err}")
            return
        self._send(200, "application/json", json.dumps(answer).encode())

    def do_GET(self) -> None:
        if self._ingest("GET"):
            return
        self._send_text(405, f"the webhook serves POST {self.server.mutate_path}")

    def _ingest(self, method: str) -> bool:
        """Answers a request for the ingestion endpoint; False when it is not one."""
        ingest = self.server.ingest
        if ingest is None or not ingest.handles(self.path):
            return False
        body = self._body() if method == "POST" else b""
        if body is None:
            return True
        answer = ingest.answer(method, self.path, self.headers.get("Authorization", ""), body)
        self._send(answer.status, "application/json", json.dumps(answer.body).encode(), answer.headers)
        return True

    def _body(self) -> bytes | None:
        """The request body, or None after answering 411/413."""
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            self._send_text(411, "Content-Length is required")
            return None
        length = int(length_text)
        if length > MAX_BODY:
            self._send_text(413, f"body of {length} bytes exceeds {MAX_BODY}")
            return None
        return self.rfile.read(length)

    def _send_text(self, status: int, text: str) -> None:
        self._send(status, "text/plain; charset=utf-8", (text + "\n").encode())

    def _send(self, status: int, content_type: str, payload: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        config: InjectionConfig,
        tls_dir: Path,
        mutate_path: str,
        ingest: IngestService | None = None,
    ) -> None:
        self.config = config
        self.ingest = ingest
        self.mutate_path = mutate_path
        self.tls_dir = tls_dir
        self._stamp: Stamp | None = None
        self.context = self._load_context()
        super().__init__(address, _Handler)

    def _files(self) -> tuple[Path, Path]:
        return self.tls_dir / CERT_FILE, self.tls_dir / KEY_FILE

    def _current_stamp(self) -> Stamp:
        stats = [path.stat() for path in self._files()]
        return tuple(value for stat in stats for value in (stat.st_ino, stat.st_mtime_ns, stat.st_size))

    def _load_context(self) -> ssl.SSLContext:
        stamp = self._current_stamp()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        cert, key = self._files()
        context.load_cert_chain(cert, key)
        self._stamp = stamp
        return context

    def reload_if_changed(self) -> bool:
        """Swaps in a new SSL context when the files changed; a half-written pair keeps the old one."""
        try:
            if self._current_stamp() == self._stamp:
                return False
            self.context = self._load_context()
        except (OSError, ssl.SSLError) as err:
            log.warning("webhook certificate in %s not (re)loaded, keeping the current one: %s", self.tls_dir, err)
            return False
        log.info("webhook certificate reloaded from %s", self.tls_dir)
        return True

    def get_request(self) -> tuple[socket.socket, Any]:
        self.reload_if_changed()
        raw, address = self.socket.accept()
        # The handshake runs in the connection's thread (Handler.setup), not in the accept loop.
        wrapped = self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("webhook connection from %s failed: %s", client_address[0], sys.exc_info()[1])


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
    ) -> None:
        self._config = config
        self._ingest = ingest
        self._tls_dir = tls_dir
        self._address = (host, port)
        self._path = path
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(
        cls, current: Settings, *, host: str = "0.0.0.0", ingest: IngestService | None = None
    ) -> WebhookServer:
        """The server the operator runs: port, TLS dir and injection config from settings."""
        config = InjectionConfig.from_settings(current)
        return cls(config, current.webhook_tls_dir, host=host, port=current.webhook_port, ingest=ingest)

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        if self._server is None:
            raise RuntimeError("the webhook server is not started")
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Loads the certificate, binds, and serves in a daemon thread."""
        if self._server is not None:
            raise RuntimeError("the webhook server is already started")
        self._server = _HTTPServer(self._address, self._config, self._tls_dir, self._path, self._ingest)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="stitchfleet-webhook", daemon=True
        )
        self._thread.start()
        log.info("admission webhook serving https://%s:%d%s", self._address[0], self.port, self._path)

    def reload_certificates(self) -> bool:
        """Reloads tls.crt/tls.key now if they changed (the server also checks before each connection)."""
        if self._server is None:
            raise RuntimeError("the webhook server is not started")
        return self._server.reload_if_changed()

    def stop(self, timeout: float = 5.0) -> None:
        """Stops accepting, closes the socket and waits for the serving thread."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = None
        self._thread = None

    def __enter__(self) -> WebhookServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
