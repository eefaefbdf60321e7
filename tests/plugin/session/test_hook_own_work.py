"""What a leased stitched step books as the plugin's own work: all of the hook's work on it, outside its run.

The report subtracts each stitched step's own work from its saving (`step_windows.Window.saved_seconds`); what the
hook does that is booked nowhere is claimed as saved. The hook's methods are slowed here where a leased step's
booking did not reach: the start of `after_run` (before its row is booked) and its end (after it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.session.step_lease import Lease
from stitchfleet.plugin.session.step_threads import StepThreads
from tests.plugin.hook_harness import hooked, stitched_steps

pytestmark = pytest.mark.tf
PAUSE = 0.004  # seconds added at each end of the hook's work on a step: far beyond a quiet hook's ~0.05 ms


def test_a_leased_steps_own_work_holds_the_hooks_work_before_and_after_its_booking(tmp_path: Path) -> None:
    """Session 48: a leased step booked the hook's work from its `before_run` to the row's booking, not the start of
    `after_run` nor its end (0.026 ms of its 0.045 ms on the demo model), and the report claimed it as saved. Now the
    row holds the start, and the end goes with the next leased row (as `OwnWork` carries a full step's)."""
    hook, _ = hooked(tmp_path, "own-work", STITCHFLEET_CHECK_EVERY="1000000", STITCHFLEET_REBASELINE_EVERY="1000000")
    rows: list[float] = []
    ran, in_step, left = Lease.ran, StepThreads.in_step, Controller.step_left

    def booked(
        lease: Lease, seconds: float, measured: tuple[str | None, tuple[int, ...], str | None], own: float
    ) -> None:
        rows.append(own)
        ran(lease, seconds, measured, own)

    def slow_in_step(threads: StepThreads) -> bool:  # read by `after_run` before the step's booking
        time.sleep(PAUSE)
        return bool(in_step.fget(threads))  # type: ignore[attr-defined]

    def slow_left(controller: Controller) -> None:  # the hook's last call on a step, after its booking
        time.sleep(PAUSE)
        left(controller)

    with stitched_steps(hook) as step, pytest.MonkeyPatch.context() as patch:
        patch.setattr(Lease, "ran", booked)
        patch.setattr(StepThreads, "in_step", property(slow_in_step))
        patch.setattr(Controller, "step_left", slow_left)
        for _ in range(8):
            step()
    assert len(rows) >= 4, rows  # steady stitched steps run on a lease
    assert all(own >= PAUSE for own in rows), rows  # the start of after_run
    assert all(own >= 2 * PAUSE for own in rows[1:]), rows  # and the previous leased step's end
