"""The slowdown guard end to end, at its default margin (the hook tests no longer switch it off):
a cluster whose kernel is really slower reverts the job; a job whose stitched steps are not slower
keeps stitching to the end through several baseline windows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet import settings
from stitchfleet.plugin.native.faults import Fault
from tests.plugin.hook_harness import events, hooked, train

pytestmark = pytest.mark.tf

STEPS = 60
REBASELINE = "12"  # a baseline window every 12 steps: several brackets in a short run


def test_the_default_margin_is_in_force() -> None:
    hook, _ = hooked(Path("/nonexistent"), "margin")
    assert hook.settings.slowdown_margin == settings.load({}).slowdown_margin == 0.05


def test_a_really_slower_cluster_reverts_the_job(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "slower", Fault("slow", cluster=5), STITCHFLEET_REBASELINE_EVERY=REBASELINE)
    run = train(STEPS, hook)
    assert len(run.losses) == STEPS and hook.controller is not None
    reverted = hook.controller.job_reverted
    assert reverted is not None and reverted.startswith("slowdown"), reverted
    assert [e.reason for e in events(url, "revert")] == ["slowdown"]
    # after the decision every step ran TF's own ops: the slow kernel ran in few of the steps
    assert hook.backend_calls[5] < STEPS // 3


def test_a_job_that_is_not_slower_keeps_stitching(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "kept", STITCHFLEET_REBASELINE_EVERY=REBASELINE)
    train(STEPS, hook)
    assert hook.controller is not None and hook.controller.job_reverted is None
    assert not events(url, "revert")
    assert all(c.enabled and c.kept for c in hook.controller.clusters)
    assert min(hook.backend_calls.values()) > STEPS // 2  # stitched steps ran the kernels to the end
