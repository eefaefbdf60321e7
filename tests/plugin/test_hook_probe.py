"""StitchHook with probing on (small BERT encoder, TF CPU, cpu backend): every cluster gets a recorded decision.

Which clusters are kept depends on this machine's speed, so the tests assert that each
decision is taken, consistent with the switches and recorded in SQLite, never which one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from stitchfleet.plugin.faults import Fault
from stitchfleet.telemetry import models as tables
from tests.plugin.hook_harness import events, hooked, train

pytestmark = pytest.mark.tf

PROBE_STEPS = 2
FIRST_PROBE = 5  # warmup 2 + baseline 3


def _verdicts(url: str) -> dict[str, tuple[str, str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            table = tables.Cluster
            rows = connection.execute(sa.select(table.fingerprint, table.verdict, table.reason))
            return {fp: (verdict, reason) for fp, verdict, reason in rows}
    finally:
        engine.dispose()


def test_every_cluster_is_probed_and_its_decision_recorded(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "probe", STITCHFLEET_PROBE_STEPS=str(PROBE_STEPS), STITCHFLEET_PROBE_ROUNDS="1")
    plain = train(52, None)
    run = train(52, hook)
    np.testing.assert_allclose(run.losses, plain.losses, rtol=2e-5)  # probing never changes the training
    assert hook.controller is not None and hook.controller.job_reverted is None
    clusters = hook.controller.clusters
    assert hook.controller.timing.stitched_start == FIRST_PROBE + 2 * PROBE_STEPS * len(clusters) <= 52
    assert all(c.kept is not None for c in clusters) and all(c.probe for c in clusters)
    assert all(calls >= PROBE_STEPS for calls in hook.backend_calls.values())  # each ran its only-k window
    recorded = {e.cluster_fingerprint: e for e in events(url, "cluster_enabled") + events(url, "probe")}
    verdicts = _verdicts(url)
    for c in clusters:
        event = recorded[c.fingerprint]
        assert (event.kind, verdicts[c.fingerprint][0]) == (
            ("cluster_enabled", "enabled") if c.kept else ("probe", "disabled")
        )
        assert event.detail == c.reason == verdicts[c.fingerprint][1] and "ms/step" in c.reason
    kept = [c.index for c in clusters if c.kept]
    assert sorted(k for k, calls in hook.backend_calls.items() if calls > PROBE_STEPS) == kept
    if not kept:
        assert hook.controller.stitching_off is not None
        assert [e.reason for e in events(url, "probe") if e.cluster_fingerprint is None] == ["no cluster kept"]
    assert events(url, "revert") == []  # leaving a cluster to TF is not a revert


def test_a_corrupted_kernel_is_caught_by_its_probe_check(tmp_path: Path) -> None:
    hook, url = hooked(
        tmp_path,
        "probe-fault",
        Fault("constant", cluster=5),
        STITCHFLEET_PROBE_STEPS=str(PROBE_STEPS),
        STITCHFLEET_PROBE_ROUNDS="1",
    )
    run = train(30, hook)
    assert all(np.isfinite(run.losses)) and hook.controller is not None
    position, cluster = next((p, c) for p, c in enumerate(hook.controller.clusters) if c.index == 5)
    check_step = FIRST_PROBE + 2 * PROBE_STEPS * position + PROBE_STEPS
    assert hook.controller.timing.checks(check_step) and hook.controller.timing.probed(check_step) == position
    assert cluster.reverted_at == check_step + 1 and cluster.kept is None
    reverts = [e for e in events(url, "revert") if e.cluster_fingerprint == cluster.fingerprint]
    assert [(e.reason, e.step) for e in reverts] == [("mismatch", check_step + 1)]
    assert [e.cluster_fingerprint for e in events(url, "guard_check")] == [cluster.fingerprint]
