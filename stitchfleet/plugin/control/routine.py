"""Routine steps: the stitched (or baseline) steps just ahead planned as the one just booked, leased to the hook.

Input: the controller right after it booked a step, and that step's plan. Output: how many of the next steps are
routine (`span`: no check, no decision, no probe, no window of the warmup, nothing flagged; the hook runs them on the
booked step's feeds and fetches without asking for a plan), and their booking in one call once they ran (`book`),
each step as `Controller.timed` books a stitched step. TF-free; the rules: docs/plugin/controller.md ("Routine steps").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stitchfleet.plugin.control.schedule import BASELINE, STITCHED
from stitchfleet.plugin.control.step_contract import StepPlan

if TYPE_CHECKING:
    from stitchfleet.plugin.control.controller import Controller

# Steps at most per lease. The steps are booked when the lease ends, so a slowdown bracket that closes inside one
# is read (and the slowdown guard decides) up to this many steps later than step by step; a lease also ends at
# anything that is not routine (a check, a decision, a baseline block, a fault, a new shape signature).
ROUTINE_STEPS = 64

# a leased step's seconds, its (measured, plain, signature) as `StepFigures` holds them, the plugin's own work on it
Row = tuple[float, tuple["str | None", tuple[int, ...], "str | None"], float]


def span(controller: Controller, plan: StepPlan, limit: int = ROUTINE_STEPS) -> int:
    """How many steps after `plan.step` (just booked) would be planned exactly as `plan` and booked as plain timed
    stitched steps: 0 unless the controller has nothing to say or to wait for. A single rank only: with Horovod
    every step sums the ranks' figures (another rank may flag a cluster at any step)."""
    c = controller
    if c.done or c.size != 1 or plan.quiet or plan.checks or plan.judged or plan.local.any():
        return 0
    if c.fault is not None or c.loss_bad or c.pending or c.bracket.ready is not None or not c.announced:
        return 0
    if any(cluster.kernel.bad is not None for cluster in c.clusters):
        return 0  # a native fault polled after the step: the next plan flags it
    # a kernel's first run is setup (`Controller._first_run`): only kernels that ran already
    mode = c.mode(plan.step)  # a baseline block's steps too: the user's graph, through TF's own path
    if not {k for k, on in enumerate(plan.switches) if on} <= c.ran or mode not in (STITCHED, BASELINE):
        return 0
    timing, builds, check_step = c.timing, c.warmup.builds, c.warmup.checks
    if mode == BASELINE and (plan.on_twin or plan.step <= c.warmup.last or timing.subject(plan.step) is not None):
        return 0  # (a group probe's baseline half is a probe sample: its pair decides)
    steps, step = 0, plan.step + 1
    while steps < limit and c.mode(step) == mode and not timing.checks(step):
        if timing.decides(step) is not None or timing.decides_group(step) or step in builds or step == check_step:
            break
        if mode == BASELINE and timing.subject(step) is not None:
            break
        steps, step = steps + 1, step + 1
    return steps


def book(controller: Controller, first: int, rows: Sequence[Row]) -> None:
    """Books the leased steps from `first` on, in order, as `Controller.step_done` books such a step: its time, the
    plugin's own work on it (beside its seconds: `OwnWork.total`, and a stitched window pays it)."""
    for offset, (seconds, (measured, plain, signature), own) in enumerate(rows):
        controller.own_work.total += own
        controller.timed(first + offset, seconds, False, measured, plain, signature=signature, own=own)
