"""Routine steps (control/routine.py): a leased stretch of stitched steps books exactly what step-by-step booking does.

Two controllers hear the same job (the same seconds and losses per step): one planned and booked step by step, the
other as the hook runs it with leases (`span` after each booked step, the leased steps' rows booked in one call at
the lease's end). Their telemetry rows, events, decisions and figures must agree, and every leased step must be one
that step-by-step planning would have planned alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from stitchfleet import settings
from stitchfleet.plugin.control import routine
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.decision_figures import DecisionFigures
from stitchfleet.plugin.control.schedule import BASELINE, STITCHED, Timing
from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan
from stitchfleet.plugin.fleet.ledger import Ledger

# probes (the group, then each cluster), then the stitched phase with a baseline block every 100 steps, checks every
# 50, windows of 20 steps
TIMING = Timing(
    warmup_steps=4,
    baseline_steps=5,
    rebaseline_every=100,
    window_steps=20,
    check_every=50,
    check_first=2,
    probe_steps=4,
    probe_rounds=2,
    probe_min_steps=2,
    paired_steps=5,
    slowdown_margin=0.2,
)
STEPS = 900
STITCHED_START = replace(TIMING, clusters=3).stitched_start  # the controller's schedule, with its three clusters


@dataclass
class Heard:
    """What a controller's ledger was told, in order."""

    windows: list[dict[str, object]] = field(default_factory=list)
    events: list[tuple[object, ...]] = field(default_factory=list)


def _controller(tmp_path: Path, name: str) -> tuple[Controller, Heard]:
    current = settings.load({"STITCHFLEET_STATE_DIR": str(tmp_path / name), "STITCHFLEET_JOB_UID": name})
    ledger = Ledger(current, 0, 1, f"sqlite:///{tmp_path / (name + '.db')}")
    heard = Heard()
    ledger.window = lambda **fields: heard.windows.append(fields)  # type: ignore[method-assign]
    ledger.event = lambda *args, **fields: heard.events.append((*args, sorted(fields.items())))  # type: ignore[method-assign]
    found = [Cluster(i, f"{i:032x}", SimpleNamespace(bad=None), 3) for i in range(3)]
    controller = Controller(found, TIMING, ledger, 1, setup_seconds=1.0, clock=lambda: 0.0, job_steps=STEPS)
    return controller, heard


def _seconds(slower: float, seed: int = 7) -> tuple[list[float], list[float]]:
    """Per step: the user's graph 10 ms, the twin 9 ms (x `slower`), with noise."""
    draw = random.Random(seed)
    plain = [0.010 * (1 + 0.02 * draw.random()) for _ in range(STEPS)]
    return plain, [0.009 * slower * (1 + 0.02 * draw.random()) for _ in range(STEPS)]


def _step_seconds(plan: StepPlan, times: tuple[list[float], list[float]]) -> float:
    plain, twin = times
    return twin[plan.step] if plan.on_twin and plan.switches.any() else plain[plan.step]


def _by_steps(controller: Controller, times: tuple[list[float], list[float]]) -> dict[int, StepPlan]:
    plans = {}
    for step in range(STEPS):
        plan = plans[step] = controller.step_plan(step)
        controller.step_done(plan, StepFigures(_step_seconds(plan, times), 1.0, summed=plan.local))
    controller.finish()
    return plans


def _leased(controller: Controller, times: tuple[list[float], list[float]]) -> tuple[dict[int, StepPlan], set[int]]:
    """As the hook's `StepPath` runs the job: after each booked step a lease of `span` steps, booked at its end."""
    plans, leased, step = {}, set(), 0
    while step < STEPS:
        plan = plans[step] = controller.step_plan(step)
        controller.step_done(plan, StepFigures(_step_seconds(plan, times), 1.0, summed=plan.local))
        count = min(routine.span(controller, plan), STEPS - step - 1)
        rows = []
        for offset in range(1, count + 1):
            plans[step + offset] = replace(plan, step=step + offset)
            rows.append((_step_seconds(plans[step + offset], times), ("", (), ""), 0.0))
            leased.add(step + offset)
        routine.book(controller, step + 1, rows)
        step += count + 1
    controller.finish()
    return plans, leased


def _same_plan(ours: StepPlan, theirs: StepPlan) -> bool:
    return (ours.step, ours.quiet, ours.on_twin, ours.judged, ours.checks, ours.switches.tolist()) == (
        theirs.step,
        theirs.quiet,
        theirs.on_twin,
        theirs.judged,
        theirs.checks,
        theirs.switches.tolist(),
    )


def test_leased_steps_book_what_step_by_step_booking_books(tmp_path: Path) -> None:
    times = _seconds(1.0)
    reference, heard = _controller(tmp_path, "steps")
    leasing, leased_heard = _controller(tmp_path, "leased")
    plans = _by_steps(reference, times)
    leased_plans, leased = _leased(leasing, times)
    # most of the stitched phase and its baseline blocks are leased: checks, probes, decisions are planned one by one
    stitched = {s for s in range(STEPS) if reference.mode(s) == STITCHED}
    baseline = {s for s in range(STEPS) if reference.mode(s) == BASELINE}
    blocks = {s for s in baseline if s >= STITCHED_START}
    assert len(leased & stitched) > 0.8 * len(stitched), (len(leased), len(stitched))
    assert len(leased & blocks) > 0.5 * len(blocks) and leased <= stitched | baseline
    for step in range(STEPS):
        assert _same_plan(leased_plans[step], plans[step]), step
    for step in leased:  # step by step it had nothing to say either: at most a slowdown bracket's figures
        figures = DecisionFigures.unpack(plans[step].local, 3) if plans[step].local.any() else None
        assert figures is None or (not any(figures.flags) and figures.guard.fault == 0 and figures.guard.loss == 0)
    assert leased_heard.windows == heard.windows and len(heard.windows) > 30
    assert leased_heard.events == heard.events
    assert leasing.job_seconds == reference.job_seconds
    assert [c.kept for c in leasing.clusters] == [c.kept for c in reference.clusters] == [True, True, True]
    assert leasing.check_counts == reference.check_counts
    assert leasing.windows.steady_saved == reference.windows.steady_saved > 0
    assert leasing.job_reverted is None and reference.job_reverted is None


def test_a_slowdown_reverts_a_leased_job_at_most_a_lease_later(tmp_path: Path) -> None:
    times = _seconds(1.0)
    slower = _seconds(1.6)  # the twin turns 1.6x slower once probing is over: the slowdown guard's case
    cut = STITCHED_START + 30
    mixed = (times[0], times[1][:cut] + slower[1][cut:])
    reference, heard = _controller(tmp_path, "steps")
    leasing, leased_heard = _controller(tmp_path, "leased")
    _by_steps(reference, mixed)
    _leased(leasing, mixed)
    reverted = [e for e in heard.events if e[0] == "revert" and e[3] == "slowdown"]
    leased_reverted = [e for e in leased_heard.events if e[0] == "revert" and e[3] == "slowdown"]
    assert reference.job_reverted is not None and leasing.job_reverted is not None
    assert len(reverted) == len(leased_reverted) == 1
    step, leased_step = int(str(reverted[0][1])), int(str(leased_reverted[0][1]))
    assert step <= leased_step <= step + routine.ROUTINE_STEPS


def test_no_lease_while_anything_is_to_say(tmp_path: Path) -> None:
    controller, _ = _controller(tmp_path, "quiet")
    times = _seconds(1.0)
    plans = _by_steps_until(controller, times, STITCHED_START + 10)
    plan = plans[max(plans)]
    assert controller.mode(plan.step) == STITCHED and routine.span(controller, plan) > 0
    controller.clusters[1].kernel.bad = "non-finite stitched output"  # polled after the step: the next plan flags it
    assert routine.span(controller, plan) == 0
    controller.clusters[1].kernel.bad = None
    controller.fault = "a plugin error"
    assert routine.span(controller, plan) == 0
    controller.fault = None
    controller.size = 2  # Horovod: every step sums the ranks' figures
    assert routine.span(controller, plan) == 0
    controller.size = 1
    checked = StepPlan(plan.step, False, plan.switches, True, (0,), True, plan.local)
    assert routine.span(controller, checked) == 0
    flagged = StepPlan(plan.step, False, plan.switches, True, (), False, np.ones_like(plan.local))
    assert routine.span(controller, flagged) == 0
    count = routine.span(controller, plan)
    ends = plan.step + count + 1  # the step after the lease: not routine, or the lease's limit
    assert count == routine.ROUTINE_STEPS or controller.mode(ends) != STITCHED or TIMING.checks(ends)


def _by_steps_until(controller: Controller, times: tuple[list[float], list[float]], last: int) -> dict[int, StepPlan]:
    plans = {}
    for step in range(last + 1):
        plan = plans[step] = controller.step_plan(step)
        controller.step_done(plan, StepFigures(_step_seconds(plan, times), 1.0, summed=plan.local))
    return plans
