"""The pod's HTTPS client of the operator's ingestion endpoint, with the standard library only.

Input: the settings (endpoint URL, the CA that signs its certificate: the mounted file rotation updates, else
the variable; the name that certificate must carry, the projected ServiceAccount token file, a timeout).
Output: rows delivered and the fleet's memory read; a certificate that fails to verify makes the client re-read
the CA file once and retry when it changed. The rules in full: docs/plugin/fleet.md.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stitchfleet import settings as settings_module
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.rows import Row, to_json
from stitchfleet.telemetry.slow_verdicts import Remembered, SlowerVerdict

log = logging.getLogger("stitchfleet.plugin")

ROWS_PATH = "/rows"
QUARANTINE_PATH = "/quarantine"


class DeliveryError(Exception):
    """A request did not get its answer; `status` is the HTTP status when the operator answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """Where the endpoint is and how to trust it."""

    host: str
    port: int
    base_path: str
    server_name: str
    ca_pem: str
    token_file: Path
    timeout: float
    # The CA as a mounted file (the webhook's ConfigMap volume): rotation rewrites it under a running pod.
    ca_file: Path | None = None

    @classmethod
    def from_settings(cls, current: settings_module.Settings) -> Endpoint:
        """The endpoint of STITCHFLEET_INGEST_URL; ValueError when the URL is not https://host[:port]/path."""
        parts = urlsplit(current.ingest_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"STITCHFLEET_INGEST_URL={current.ingest_url!r}: expected https://host[:port]/path")
        return cls(
            host=parts.hostname,
            port=parts.port or 443,
            base_path=parts.path.rstrip("/"),
            server_name=current.ingest_server_name or parts.hostname,
            ca_pem=current.ingest_ca,
            token_file=current.ingest_token_file,
            timeout=current.ingest_timeout_seconds,
            ca_file=Path(current.ingest_ca_file) if current.ingest_ca_file else None,
        )


class IngestClient:
    """One endpoint; every call opens its own TLS connection (the operator closes after each answer)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._trusted = endpoint.ca_pem
        self._context = _context(endpoint.ca_pem)
        self.reload_trust()

    @property
    def trusted_ca(self) -> str:
        """The PEM this client verifies the endpoint with ("" for the system CAs)."""
        return self._trusted

    def reload_trust(self) -> bool:
        """Reads the CA again (the file while it holds a certificate, else the variable); True when it changed.

        An unparsable file keeps the CA in use: a broken mount never cuts a working client off.
        """
        pem = self._current_ca()
        if pem == self._trusted:
            return False
        try:
            context = _context(pem)
        except (ssl.SSLError, ValueError) as err:
            where = self.endpoint.ca_file
            log.warning("stitchfleet: the ingestion CA in %s is not usable, keeping the current one: %s", where, err)
            return False
        self._trusted, self._context = pem, context
        return True

    def _current_ca(self) -> str:
        if self.endpoint.ca_file is not None:
            try:
                text = self.endpoint.ca_file.read_text()
            except (OSError, UnicodeDecodeError):
                text = ""  # not mounted yet (its ConfigMap not synced yet): the variable the webhook injected
            if "BEGIN CERTIFICATE" in text:
                return text
        return self.endpoint.ca_pem

    def post_rows(self, rows: Sequence[Row], timeout: float | None = None) -> int:
        """Delivers `rows` in one request; the number the operator stored (all of them, or it raised)."""
        body = json.dumps({"rows": [to_json(row) for row in rows]}, separators=(",", ":")).encode()
        answer = self._request("POST", ROWS_PATH, body, timeout)
        stored = answer.get("stored")
        if stored != len(rows):
            raise DeliveryError(f"the operator stored {stored!r} of {len(rows)} rows")
        return int(stored)

    def quarantined(self, timeout: float | None = None) -> set[str]:
        """The cluster fingerprints the fleet has reverted, as the operator's database holds them."""
        return set(self.recall(timeout).reverted)

    def recall(self, timeout: float | None = None) -> Remembered:
        """The fleet's memory: reverted fingerprints and live speed verdicts (see the module docstring)."""
        return memory_of(self._request("GET", QUARANTINE_PATH, None, timeout))

    def _token(self) -> str:
        try:
            return self.endpoint.token_file.read_text().strip()
        except OSError as err:
            raise DeliveryError(f"no ServiceAccount token at {self.endpoint.token_file}: {err}") from None

    def _request(self, method: str, path: str, body: bytes | None, timeout: float | None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        seconds = self.endpoint.timeout if timeout is None else timeout
        try:
            connection = self._connect_trusting(seconds)
        except (OSError, ssl.SSLError) as err:
            raise DeliveryError(f"cannot reach {self._where()}: {err}") from None
        try:
            connection.request(method, self.endpoint.base_path + path, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as err:
            raise DeliveryError(f"{method} {self._where()}{path} failed: {err!r}") from None
        finally:
            connection.close()
        return self._decode(response.status, payload, path)

    def _connect_trusting(self, seconds: float) -> http.client.HTTPConnection:
        """A connection; on a certificate that fails to verify, the CA is read again and, when it changed
        (the operator rotated it and the kubelet updated the file), tried once more."""
        try:
            return self._connect(seconds)
        except ssl.SSLCertVerificationError:
            if not self.reload_trust():
                raise
            log.info("stitchfleet: the ingestion endpoint's CA changed; retrying with the new one")
            return self._connect(seconds)

    def _connect(self, seconds: float) -> http.client.HTTPConnection:
        """A connection whose TLS checks the certificate against server_name, wherever host points."""
        raw = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=seconds)
        try:
            wrapped = self._context.wrap_socket(raw, server_hostname=self.endpoint.server_name)
        except BaseException:
            raw.close()
            raise
        connection = http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=seconds)
        connection.sock = wrapped
        return connection

    def _decode(self, status: int, payload: bytes, path: str) -> dict[str, Any]:
        text = payload.decode("utf-8", errors="replace")
        if status != 200:
            raise DeliveryError(f"{self._where()}{path} answered {status}: {text.strip()[:300]}", status)
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            raise DeliveryError(f"{self._where()}{path} answered no JSON: {text[:200]!r}", status) from None
        if not isinstance(answer, dict):
            raise DeliveryError(f"{self._where()}{path} answered {type(answer).__name__}, expected an object", status)
        return answer

    def _where(self) -> str:
        return f"https://{self.endpoint.server_name}:{self.endpoint.port}{self.endpoint.base_path}"


def _context(ca_pem: str) -> ssl.SSLContext:
    """A TLS client context trusting `ca_pem` (empty: the system CAs), TLS 1.2 at least."""
    context = ssl.create_default_context(cadata=ca_pem or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def memory_of(answer: Mapping[str, object]) -> Remembered:
    """The reverted fingerprints and speed verdicts of a quarantine answer; DeliveryError when its
    "reverted" list is malformed (an operator that answers no "slower" or "faster" list has none of those)."""
    found = answer.get("reverted")
    if not isinstance(found, list) or not all(isinstance(item, str) for item in found):
        raise DeliveryError(f"malformed quarantine answer: {str(answer)[:200]}")
    slower = verdict_list(answer.get("slower"), ProbeOutcome.SLOWER)
    return Remembered(frozenset(found), slower, verdict_list(answer.get("faster"), ProbeOutcome.FASTER))


def verdict_list(items: object, outcome: ProbeOutcome) -> tuple[SlowerVerdict, ...]:
    """The `outcome` verdicts of an answer's (or a cache file's) list: none when absent, malformed entries
    and entries of the other outcome skipped (a "faster" list never turns a cluster off, nor the reverse)."""
    verdicts = []
    for item in items if isinstance(items, list) else []:
        try:
            if not isinstance(item, dict):
                raise ValueError(f"{type(item).__name__}, expected an object")
            verdict = SlowerVerdict.from_json(item)
            if verdict.outcome != outcome:
                raise ValueError(f"a {verdict.outcome} verdict in the list of {outcome} ones")
            verdicts.append(verdict)
        except ValueError as err:
            log.warning("stitchfleet: a %s verdict of the fleet memory skipped: %s", outcome, err)
    return tuple(verdicts)
