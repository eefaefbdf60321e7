"""The ingestion CA as a ConfigMap in every namespace with opted-in pods, kept equal to the webhook's ca.crt.

Input: the CA file of the TLS dir (a self-signed rotation or a cert-manager renewal rewrites it), the
namespaces of opted-in pods (admissions, kopf's pod events) and a `ConfigMapWriter`. Output: ConfigMap
`name` (key ca.crt only) in each, written when it differs and every 10 minutes; the webhook mounts it
(injection.py): a volume must live in its pod's namespace. Why this design: helm/stitchfleet/README.md.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

CA_KEY = "ca.crt"
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409
LABELS = {"app.kubernetes.io/managed-by": "stitchfleet", "stitchfleet.io/role": "ingest-ca"}

log = logging.getLogger("stitchfleet.operator")


class ConfigMapWriter(Protocol):
    """Makes ConfigMap `name` of `namespace` hold exactly `data` (creating it when absent)."""

    def __call__(self, namespace: str, name: str, data: dict[str, str]) -> None: ...


def api_configmap_writer(api_client: Any, timeout: float) -> ConfigMapWriter:
    """The writer through the kubernetes client: patch (named, so RBAC can pin the name), create when absent."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def write(namespace: str, name: str, data: dict[str, str]) -> None:
        body = {"metadata": {"labels": LABELS}, "data": data}
        try:
            core.patch_namespaced_config_map(name, namespace, body, _request_timeout=timeout)
            return
        except client.ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise
        created = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=LABELS), data=data)
        try:
            core.create_namespaced_config_map(namespace, created, _request_timeout=timeout)
        except client.ApiException as err:
            if err.status != HTTP_CONFLICT:
                raise
            # Created in between (an admission and a pod event at once): the patch now finds it.
            core.patch_namespaced_config_map(name, namespace, body, _request_timeout=timeout)

    return write


class CaPublisher:
    """Keeps the CA ConfigMap current in every namespace it was told about (`want`), on its own thread."""

    def __init__(
        self,
        write: ConfigMapWriter,
        name: str,
        ca_file: Path,
        *,
        interval: float = 10.0,
        resync_seconds: float = 600.0,
    ) -> None:
        if not name:
            raise ValueError("the CA ConfigMap needs a name")
        self._write, self.name, self.ca_file, self._interval = write, name, ca_file, interval
        # Every copy is written again this often: one deleted or edited in its namespace is repaired.
        self._resync_seconds, self._last_resync = resync_seconds, time.monotonic()
        self._published: dict[str, str] = {}  # namespace -> the PEM it holds, as far as we wrote it
        self._wanted: set[str] = set()
        self._lock = threading.Lock()
        self._wake, self._stopping = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    def want(self, namespace: str) -> None:
        """`namespace` has opted-in pods: its copy is made (or checked) on the next pass, at once."""
        if not namespace:
            return
        with self._lock:
            if namespace in self._wanted:
                return
            self._wanted.add(namespace)
        self._wake.set()

    def current_ca(self) -> str:
        """The CA file's PEM now ("" while there is none: nothing is published then)."""
        try:
            text = self.ca_file.read_text()
        except (OSError, UnicodeDecodeError):
            return ""
        return text if "BEGIN CERTIFICATE" in text else ""

    def sync_once(self) -> list[str]:
        """Writes the current CA where a copy differs; the namespaces written. A failed write is retried next pass."""
        pem = self.current_ca()
        if not pem:
            return []
        with self._lock:
            if time.monotonic() - self._last_resync >= self._resync_seconds:
                self._published.clear()
                self._last_resync = time.monotonic()
            stale = sorted(ns for ns in self._wanted if self._published.get(ns) != pem)
        written = []
        for namespace in stale:
            try:
                self._write(namespace, self.name, {CA_KEY: pem})
            except Exception as err:  # the API server down or refusing: the next pass tries again
                self.failures += 1
                log.warning("ingestion CA not written to ConfigMap %s/%s (retrying): %s", namespace, self.name, err)
                continue
            with self._lock:
                self._published[namespace] = pem
            written.append(namespace)
        if written:
            log.info("ingestion CA written to ConfigMap %s in %s", self.name, ", ".join(written))
        return written

    def start(self) -> None:
        """Syncs every `interval` seconds (and at once when a namespace is wanted) on a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("the CA publisher is already started")
        self._thread = threading.Thread(target=self._run, name="stitchfleet-ca-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread (a write in flight finishes within the API timeout)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.sync_once()
            except Exception:
                log.exception("ingestion CA publishing failed; retrying")
