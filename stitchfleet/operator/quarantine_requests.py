"""StitchQuarantine custom resources: the fleet quarantine's `confirm` / `clear` from GitOps.

Input: StitchQuarantine objects (fingerprint, action, reason, requestedBy) from kopf, the telemetry
database's URL and a status writer. Output: `stitchfleet fleet quarantine`'s write and audit Event,
once per generation of an object of the operator's namespace (others are ignored), and its status:
Applied, Invalid, or Failed (the database refused: queued for `retry`). Rules: docs/fleet-quarantine.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stitchfleet.telemetry import database, fleet_quarantine

GROUP = "stitchfleet.io"
VERSION = "v1alpha1"
PLURAL = "stitchquarantines"
KIND = "StitchQuarantine"
ACTIONS = ("confirm", "clear")
# The database's column sizes (telemetry/row_fields.py) and a name an audit line can carry.
FINGERPRINT = re.compile(r"^[-_.:a-zA-Z0-9]{1,64}$")
REQUESTER = re.compile(r"^[-_.@a-zA-Z0-9]{1,100}$")
MAX_REASON = 300
# Phases after which a generation is never applied again (Failed is retried).
DONE = {"Applied", "Invalid"}

log = logging.getLogger("stitchfleet.operator")
StatusWriter = Callable[[str, str, dict[str, Any]], None]


class RequestError(ValueError):
    """The object's spec is not a request the operator can apply (the message names the field)."""


@dataclass(frozen=True)
class Request:
    """One StitchQuarantine, as far as applying it goes."""

    namespace: str
    name: str
    generation: int
    fingerprint: str
    action: str
    reason: str
    requested_by: str

    @property
    def actor(self) -> str:
        """Who, in the audit trail: the declared requester and the object that carried the request."""
        return f"{self.requested_by} via {KIND} {self.namespace}/{self.name}"


def parse(body: Mapping[str, Any]) -> Request:
    """The request of an object; RequestError names the first field that is wrong."""
    metadata = body.get("metadata") or {}
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("spec is missing")
    fingerprint, action = spec.get("fingerprint"), spec.get("action")
    reason, requested_by = spec.get("reason"), spec.get("requestedBy", "unnamed")
    if not isinstance(fingerprint, str) or not FINGERPRINT.match(fingerprint):
        raise RequestError(f"spec.fingerprint {fingerprint!r}: 1-64 letters, digits, '-', '_', '.', ':'")
    if action not in ACTIONS:
        raise RequestError(f"spec.action {action!r}: one of {', '.join(ACTIONS)}")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise RequestError(f"spec.reason: a non-empty text of at most {MAX_REASON} characters")
    if not isinstance(requested_by, str) or not REQUESTER.match(requested_by):
        raise RequestError(f"spec.requestedBy {requested_by!r}: 1-100 letters, digits, '-', '_', '.', '@'")
    generation = metadata.get("generation")
    return Request(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        generation=generation if isinstance(generation, int) else 0,
        fingerprint=fingerprint,
        action=action,
        reason=" ".join(reason.split()),
        requested_by=requested_by,
    )


class QuarantineRequests:
    """Applies the StitchQuarantine objects of `namespace` to the quarantine in `engine` (see the module)."""

    def __init__(self, database_url: str, cluster: str, namespace: str, write_status: StatusWriter) -> None:
        self.engine = database.connect(database_url)
        self.cluster, self.namespace = cluster, namespace
        self._write_status = write_status
        # (namespace, name) -> (generation, object) of requests the database refused: `retry` applies them.
        self._pending: dict[tuple[str, str], tuple[Any, Mapping[str, Any]]] = {}
        # (namespace, name) -> the generation applied (or found invalid) by this process.
        self._done: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def handle(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Applies the object unless this generation is done or queued; the status written (None: none)."""
        # One at a time: kopf's event for an object and the retry pass must not both apply one generation.
        with self._lock:
            return self._handle(body, retrying=False)

    def retry(self) -> int:
        """Applies the queued requests again; how many are still queued after."""
        with self._lock:
            for _generation, body in list(self._pending.values()):
                try:
                    self._handle(body, retrying=True)
                except Exception as err:  # the status write failed: the request was applied, or is still queued
                    log.warning("%s status not written: %s", KIND, err)
            return len(self._pending)

    def forget(self, namespace: str, name: str) -> None:
        """The object is deleted: a request still queued is dropped (what was applied stays applied)."""
        with self._lock:
            self._pending.pop((namespace, name), None)
            self._done.pop((namespace, name), None)

    def close(self) -> None:
        """Releases the database connections."""
        self.engine.dispose()

    def _handle(self, body: Mapping[str, Any], *, retrying: bool) -> dict[str, Any] | None:
        metadata = body.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        if namespace != self.namespace:
            log.warning("%s %s/%s ignored: only those in %s count", KIND, namespace, name, self.namespace)
            return None
        generation, key = metadata.get("generation"), (namespace, name)
        if self._seen(key, generation, body.get("status") or {}, retrying=retrying):
            return None
        try:
            request = parse(body)
        except RequestError as err:
            self._done[key] = generation
            return self._status(namespace, name, generation, "Invalid", str(err))
        act = fleet_quarantine.confirm if request.action == "confirm" else fleet_quarantine.clear
        try:
            act(self.engine, request.fingerprint, actor=request.actor, why=request.reason, cluster=self.cluster)
        except Exception as err:  # the database down: said in the status, applied by a later retry pass
            log.warning("%s %s/%s not applied yet (retrying): %s", KIND, namespace, name, err)
            self._pending[key] = (generation, body)
            return self._status(namespace, name, generation, "Failed", f"not applied yet: {type(err).__name__}")
        self._pending.pop(key, None)
        self._done[key] = generation
        done = "reverted fleet-wide" if request.action == "confirm" else "cleared fleet-wide"
        log.info("%s %s/%s: %s %s by %s", KIND, namespace, name, request.fingerprint, done, request.actor)
        return self._status(namespace, name, generation, "Applied", f"{request.fingerprint} {done}")

    def _seen(self, key: tuple[str, str], generation: Any, status: Mapping[str, Any], *, retrying: bool) -> bool:
        """This generation needs nothing now: done (as the status says, after a restart, or as this process
        knows, for an event that left before our status write) or queued for the retry pass."""
        if status.get("observedGeneration") == generation and status.get("phase") in DONE:
            return True
        queued = not retrying and self._pending.get(key, (None,))[0] == generation
        return bool(self._done.get(key) == generation or queued)

    def _status(self, namespace: str, name: str, generation: Any, phase: str, message: str) -> dict[str, Any]:
        at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"phase": phase, "message": message[:MAX_REASON], "observedGeneration": generation, "updatedAt": at}
        self._write_status(namespace, name, status)
        return status


def api_status_writer(api_client: Any, timeout: float) -> StatusWriter:
    """Writes a StitchQuarantine's status subresource through the kubernetes client."""
    from kubernetes import client

    objects = client.CustomObjectsApi(api_client)

    def write(namespace: str, name: str, status: dict[str, Any]) -> None:
        body = {"status": status}
        objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, _request_timeout=timeout
        )

    return write
