"""StitchHook and the fleet's slower verdicts (small BERT encoder, TF CPU, cpu backend, SQLite).

A first job learns its clusters' keys (fingerprint, device profile, shape signature). Other jobs'
findings are then stored as pods' rows are: one job's slower finding changes nothing for the next
job; with a second job's, the next job starts that cluster off, unprobed (not installed: no probe
window, no compile), and records why; a verdict for other shapes of another cluster leaves that
one to be probed as usual.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.telemetry import rows as r
from tests.plugin.hook_harness import events, hooked, train
from tests.telemetry.workload import write

pytestmark = pytest.mark.tf
PROBING = {"STITCHFLEET_PROBE_STEPS": "2", "STITCHFLEET_PROBE_ROUNDS": "1"}


def _findings(url: str, keys: list[tuple[str, str, str]], *uids: str) -> None:
    now = dt.datetime.now(dt.UTC)
    rows = [
        r.ProbeVerdict(r.JobKey("local", "default", "other", uid), *key, "slower", "+1.0 ms/step", now)
        for uid in uids
        for key in keys
    ]
    write(url, rows)


def _fingerprints(hook: StitchHook) -> set[str]:
    assert hook.controller is not None
    return {c.fingerprint for c in hook.controller.clusters}


def test_two_jobs_slower_findings_start_the_cluster_off_unprobed_and_one_jobs_do_not(tmp_path: Path) -> None:
    first, url = hooked(tmp_path, "first")
    train(6, first)
    assert first.controller is not None and len(first.controller.clusters) >= 2
    slow, other = first.controller.clusters[:2]
    assert slow.profile.startswith("cpu:") and slow.shapes.startswith("f32[")
    key = (slow.fingerprint, slow.profile, slow.shapes)

    _findings(url, [key], "noisy-1")
    second, _ = hooked(tmp_path, "second", **PROBING)
    train(6, second)
    assert slow.fingerprint in _fingerprints(second)  # one job's finding: probed as usual

    # a second job agrees; and two jobs found the other cluster slower, but at other shapes
    _findings(url, [key], "noisy-2")
    _findings(url, [(other.fingerprint, other.profile, "f32[999]")], "noisy-1", "noisy-2")
    third, _ = hooked(tmp_path, "third", **PROBING)
    train(6, third)
    assert third.controller is not None
    assert slow.fingerprint not in _fingerprints(third) and other.fingerprint in _fingerprints(third)
    assert third.off[slow.index].startswith(f"fleet: slower on {slow.profile} for these shapes per 2 jobs, until ")
    assert third.controller.timing.clusters == len(first.controller.clusters) - 1  # no probe pair for it
    saved = [e for e in events(url, "probe") if e.cluster_fingerprint == slow.fingerprint]
    assert [(e.reason, e.detail) for e in saved] == [("fleet", third.off[slow.index])]
