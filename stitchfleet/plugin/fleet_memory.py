"""The fleet's memory as a pod reads it: cluster fingerprints quarantined anywhere in the fleet.

Input: an `IngestClient` and a cache file in the pod's state directory. Output: `read()`, a
`Recollection`: the reverted fingerprints and where they came from ("operator", "cache" when the
operator did not answer within the short timeout but an earlier answer is on disk, or "none"),
with the reason the operator was not heard. A fresh answer is kept in memory for `ttl` seconds
(a process that begins several sessions asks once) and written to the cache file for the pod's
next process. Nothing here raises: without the memory the job proceeds, and says so.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.plugin.ingest_client import DeliveryError, IngestClient

log = logging.getLogger("stitchfleet.plugin")
CACHE_FILE = "fleet-memory.json"


@dataclass(frozen=True)
class Recollection:
    """What the job knows of the fleet: `source` is operator, cache or none; `problem` why not operator."""

    reverted: frozenset[str]
    source: str
    problem: str = ""


class FleetMemory:
    """Reads the quarantine from the operator, falling back to the pod's cached copy."""

    def __init__(self, client: IngestClient, state_dir: Path, *, timeout: float = 3.0, ttl: float = 300.0) -> None:
        self.client = client
        self.cache_path = state_dir / CACHE_FILE
        self.timeout, self.ttl = timeout, ttl
        self._fresh: tuple[float, frozenset[str]] | None = None

    def read(self) -> Recollection:
        """The quarantine now: the operator's answer, else the cache, else nothing (never raises)."""
        if self._fresh is not None and time.monotonic() - self._fresh[0] < self.ttl:
            return Recollection(self._fresh[1], "operator")
        try:
            found = frozenset(self.client.quarantined(timeout=self.timeout))
        except DeliveryError as err:
            return self._fallback(str(err))
        except Exception as err:  # never fail the job over its memory
            return self._fallback(f"{type(err).__name__}: {err}")
        self._fresh = (time.monotonic(), found)
        self._store(found)
        return Recollection(found, "operator")

    def _fallback(self, problem: str) -> Recollection:
        cached = self._load()
        if cached is None:
            log.warning("stitchfleet: fleet memory unavailable, proceeding without it: %s", problem)
            return Recollection(frozenset(), "none", problem)
        log.warning("stitchfleet: fleet memory from the pod's cache (%s): %s", self.cache_path, problem)
        return Recollection(cached, "cache", problem)

    def _store(self, found: frozenset[str]) -> None:
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.cache_path.with_suffix(".tmp")
            temporary.write_text(json.dumps({"reverted": sorted(found), "saved_at": time.time()}))
            temporary.replace(self.cache_path)
        except OSError as err:
            log.info("stitchfleet: fleet memory not cached: %s", err)

    def _load(self) -> frozenset[str] | None:
        try:
            data = json.loads(self.cache_path.read_text())
        except (OSError, ValueError):
            return None
        found = data.get("reverted") if isinstance(data, dict) else None
        if not isinstance(found, list):
            return None
        return frozenset(str(item) for item in found)
