"""A Prometheus registry of our own and its HTTP endpoint: what every metrics set shares.

Input: metrics registered on `self.registry` by a subclass. Output: the text
exposition, and /metrics served on a port in a daemon thread until `stop()`.
A dedicated registry (never the process-global one) keeps two metric sets, or two
tests, from colliding.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server


class Exposition:
    """Owns a CollectorRegistry and, when asked, the HTTP server that exposes it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._server: Any = None

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format (what the HTTP endpoint serves)."""
        return bytes(generate_latest(self.registry))

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serves /metrics on `addr:port` in a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        """Stops the HTTP server, if one runs."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
