"""StitchHook with probing on (small BERT encoder, TF CPU, cpu backend): every cluster gets a recorded decision.

Which clusters are kept depends on this machine's speed, so the tests assert that each
decision is taken, consistent with the switches and recorded in SQLite, never which one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from stitchfleet.plugin.control.schedule import GROUP
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.telemetry import models as tables
from tests.plugin.hook_harness import events, hooked, make_settings, train

pytestmark = pytest.mark.tf

PROBE_STEPS = 2
FIRST_PROBE = 5  # warmup 2 + baseline 3
GROUP_STEPS = 2 * PROBE_STEPS  # the group pair (one round): baseline, then every cluster on


def _verdicts(url: str) -> dict[str, tuple[str, str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            table = tables.Cluster
            rows = connection.execute(sa.select(table.fingerprint, table.verdict, table.reason))
            return {fp: (verdict, reason) for fp, verdict, reason in rows}
    finally:
        engine.dispose()


class _Recording(StitchHook):
    """Records, per training step, the switches the controller set and the backend calls after it ran."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[list[bool], dict[int, int]]] = []
        self._on: list[bool] = []

    def before_run(self, run_context: Any) -> Any:
        self._on = self.controller.switches(self.step).tolist() if self.controller is not None else []
        return super().before_run(run_context)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        super().after_run(run_context, run_values)
        self.trace.append((self._on, dict(self.backend_calls)))


def test_every_cluster_is_probed_and_its_decision_recorded(tmp_path: Path) -> None:
    # no reruns: a group faster within its noise would run its pair again (`ProbeDecisions.extend`), on this
    # machine's timings, and shift the schedule this test checks step by step (tests/plugin/control has its own)
    extra = {
        "STITCHFLEET_PROBE_STEPS": str(PROBE_STEPS),
        "STITCHFLEET_PROBE_ROUNDS": "1",
        "STITCHFLEET_PROBE_RERUNS": "0",
    }
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    hook = _Recording(make_settings(tmp_path, "probe", **extra), backend="cpu", db_url=url)
    plain = train(60, None)
    run = train(60, hook)
    np.testing.assert_allclose(run.losses, plain.losses, rtol=2e-5)  # probing never changes the training
    assert hook.controller is not None and hook.controller.job_reverted is None
    clusters = hook.controller.clusters
    timing = hook.controller.timing
    assert timing.stitched_start == FIRST_PROBE + GROUP_STEPS + 2 * PROBE_STEPS * len(clusters) <= 60
    group = next(e for e in events(url, "probe") if e.cluster_fingerprint is None)
    assert hook.controller.group_proven is not None and group.step == FIRST_PROBE + GROUP_STEPS
    assert group.reason == ("group proven" if hook.controller.group_proven else "group not faster")
    assert group.detail == f"{group.reason}: {hook.controller.group_probe}" and "ms/step" in group.detail
    assert all(c.kept is not None for c in clusters) and all(c.probe for c in clusters)
    # each ran in the group window and in its own pair's probe half; a kept one also in the stitched phase
    assert all(calls >= 2 * PROBE_STEPS for calls in hook.backend_calls.values())
    # every cluster ran exactly on the steps its switch was on (probe halves run every enabled cluster,
    # reference halves all but the probed one), and the stitched phase runs the kept ones
    before = dict.fromkeys(hook.backend_calls, 0)
    for step, (on, calls) in enumerate(hook.trace):
        ran = {k: calls[k] - before[k] for k in calls}
        assert ran == {c.index: int(on[p]) for p, c in enumerate(clusters)}, f"step {step}"
        before = calls
    assert hook.trace[-1][0] == [bool(c.kept) for c in clusters]
    recorded = {e.cluster_fingerprint: e for e in events(url, "cluster_enabled") + events(url, "probe")}
    verdicts = _verdicts(url)
    for c in clusters:
        event = recorded[c.fingerprint]
        assert (event.kind, verdicts[c.fingerprint][0]) == (
            ("cluster_enabled", "enabled") if c.kept else ("probe", "disabled")
        )
        assert event.detail == c.reason == verdicts[c.fingerprint][1] and "ms/step" in c.reason
    kept = [c.index for c in clusters if c.kept]
    if not kept:
        assert hook.controller.stitching_off is not None
        job_events = [e.reason for e in events(url, "probe") if e.cluster_fingerprint is None]
        assert job_events == [group.reason, "no cluster kept"]
    assert events(url, "revert") == []  # leaving a cluster to TF is not a revert


@pytest.mark.parametrize("group", [False, True], ids=["alone", "group"])
def test_a_corrupted_kernel_is_caught_by_its_probe_check(tmp_path: Path, group: bool) -> None:
    """Caught on the first probe window's check step, where every cluster runs and is compared (only the
    corrupted one mismatches): the group's, or without the group probe, the first cluster's pair."""
    hook, url = hooked(
        tmp_path,
        "probe-fault",
        Fault("constant", cluster=5),
        STITCHFLEET_PROBE_STEPS=str(PROBE_STEPS),
        STITCHFLEET_PROBE_ROUNDS="1",
        STITCHFLEET_PROBE_GROUP=str(int(group)),
    )
    run = train(30, hook)
    assert all(np.isfinite(run.losses)) and hook.controller is not None
    position, cluster = next((p, c) for p, c in enumerate(hook.controller.clusters) if c.index == 5)
    timing = hook.controller.timing
    check_step = FIRST_PROBE + PROBE_STEPS
    assert timing.checks(check_step) and timing.subject(check_step) == (GROUP if group else 0)
    assert position > 0  # not the cluster whose pair it is: without the group, it is caught before its own pair
    assert cluster.reverted_at == check_step + 1 and cluster.kept is None
    reverts = [e for e in events(url, "revert") if e.cluster_fingerprint == cluster.fingerprint]
    assert [(e.reason, e.step) for e in reverts] == [("mismatch", check_step + 1)]
    assert [e.cluster_fingerprint for e in events(url, "guard_check")] == [cluster.fingerprint]
