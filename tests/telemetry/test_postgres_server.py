"""The tests' own PostgreSQL server (tests/telemetry/conftest.py): it starts when its first port is taken.

Input: a loopback port held by a listening socket, handed to `running_server` as its first choice. Output: a
server on another port (the port is chosen before the server starts; a run beside this one may bind it first: seen
as `AlreadyRunning` at the setup of test_outage while two test runs shared the machine).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from port_for import get_port

from tests.telemetry import conftest

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_a_server_whose_port_was_taken_starts_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports: Iterator[int] = iter([busy])
        monkeypatch.setattr(conftest, "get_port", lambda _: next(ports, None) or get_port(None))
        with conftest.running_server() as server:
            assert server.port != busy
            conftest.create_database(server)
