"""The fleet's memory as a pod reads it: clusters quarantined anywhere in the fleet, slower and faster verdicts.

Input: an `IngestClient` and a cache file in the pod's state directory. Output: The rules in full:
docs/plugin/fleet.md.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.plugin.fleet.ingest_client import DeliveryError, IngestClient, verdict_list
from stitchfleet.telemetry.kinds import ProbeOutcome
from stitchfleet.telemetry.slow_verdicts import Remembered, SlowerVerdict, live

log = logging.getLogger("stitchfleet.plugin")
CACHE_FILE = "fleet-memory.json"


@dataclass(frozen=True)
class Recollection:
    """What the job knows of the fleet: `source` is operator, cache or none; `problem` why not operator;
    `faster`: keys the fleet found faster (same form as `slower`)."""

    reverted: frozenset[str]
    source: str
    problem: str = ""
    slower: tuple[SlowerVerdict, ...] = ()
    faster: tuple[SlowerVerdict, ...] = ()


class FleetMemory:
    """Reads the quarantine from the operator, falling back to the pod's cached copy."""

    def __init__(self, client: IngestClient, state_dir: Path, *, timeout: float = 3.0, ttl: float = 300.0) -> None:
        self.client = client
        self.cache_path = state_dir / CACHE_FILE
        self.timeout, self.ttl = timeout, ttl
        self._fresh: tuple[float, Remembered] | None = None

    def read(self) -> Recollection:
        """The quarantine now: the operator's answer, else the cache, else nothing (never raises)."""
        if self._fresh is not None and time.monotonic() - self._fresh[0] < self.ttl:
            return _recollection(self._fresh[1], "operator")
        try:
            found = self.client.recall(timeout=self.timeout)
        except DeliveryError as err:
            return self._fallback(str(err))
        except Exception as err:  # never fail the job over its memory
            return self._fallback(f"{type(err).__name__}: {err}")
        self._fresh = (time.monotonic(), found)
        self._store(found)
        return _recollection(found, "operator")

    def _fallback(self, problem: str) -> Recollection:
        cached = self._load()
        if cached is None:
            log.warning("stitchfleet: fleet memory unavailable, proceeding without it: %s", problem)
            return Recollection(frozenset(), "none", problem)
        log.warning("stitchfleet: fleet memory from the pod's cache (%s): %s", self.cache_path, problem)
        return _recollection(cached, "cache", problem)

    def _store(self, found: Remembered) -> None:
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.cache_path.with_suffix(".tmp")
            document = {
                "reverted": sorted(found.reverted),
                "slower": [verdict.to_json() for verdict in found.slower],
                "faster": [verdict.to_json() for verdict in found.faster],
                "saved_at": time.time(),
            }
            temporary.write_text(json.dumps(document))
            temporary.replace(self.cache_path)
        except OSError as err:
            log.info("stitchfleet: fleet memory not cached: %s", err)

    def _load(self) -> Remembered | None:
        try:
            data = json.loads(self.cache_path.read_text())
        except (OSError, ValueError):
            return None
        found = data.get("reverted") if isinstance(data, dict) else None
        if not isinstance(found, list):
            return None
        assert isinstance(data, dict)
        slower = verdict_list(data.get("slower"), ProbeOutcome.SLOWER)
        return Remembered(
            frozenset(str(item) for item in found), slower, verdict_list(data.get("faster"), ProbeOutcome.FASTER)
        )


def _recollection(found: Remembered, source: str, problem: str = "") -> Recollection:
    """`found` as the job's recollection, with the verdicts expired by now dropped (a cached copy ages)."""
    now = dt.datetime.now(dt.UTC)
    return Recollection(found.reverted, source, problem, live(found.slower, now), live(found.faster, now))
