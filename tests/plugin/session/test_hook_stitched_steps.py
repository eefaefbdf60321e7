"""The hook's per-step work on a steady stitched step (issue 29 item 6), counted, never timed.

A stitched step that checks nothing and decides nothing runs its twin through the run prepared for its structure
(`twin_runs`): neither the hook's diverter nor TF builds a fetch mapper or handler for it (before: both, every step,
150-250 us on the demo model), and the hook's own bookkeeping stays within a budget of Python calls.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.control import routine
from stitchfleet.plugin.control.schedule import STITCHED
from stitchfleet.plugin.session.step_args import StepArgs
from stitchfleet.plugin.session.step_path import StepPath
from tests.plugin.hook_harness import _feeds, hooked, stitched_steps

pytestmark = pytest.mark.tf
FETCH_HANDLING = {"for_fetch", "_uniquify_fetches", "build_results", "_assert_fetchable"}  # TF's session.py
BUDGET = (
    120  # Python calls inside the plugin per steady stitched step, window closes included (after: ~105; before: ~165)
)


def _counting(plugin: Counter[tuple[str, str]], session_py: Counter[str]) -> Callable[[FrameType, str, object], None]:
    """A `sys.setprofile` function counting calls into the plugin (module, function) and into TF's session.py."""

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.endswith("client/session.py"):
            session_py[frame.f_code.co_name] += 1
        elif "stitchfleet" in path and "/tests/" not in path:
            plugin[(Path(path).stem, frame.f_code.co_name)] += 1

    return profile


def test_a_steady_stitched_step_builds_no_fetch_handler_and_keeps_to_its_budget(tmp_path: Path) -> None:
    hook, _ = hooked(
        tmp_path, "stitched-steps", STITCHFLEET_CHECK_EVERY="1000000", STITCHFLEET_REBASELINE_EVERY="1000000"
    )
    plugin: Counter[tuple[str, str]] = Counter()
    session_py: Counter[str] = Counter()

    profile = _counting(plugin, session_py)
    with stitched_steps(hook) as step:
        controller = hook.controller
        assert controller is not None
        steps, first = 10, hook.step
        values = []
        sys.setprofile(profile)
        try:
            for _ in range(steps):
                values.append(step())
        finally:
            sys.setprofile(None)
        assert all(controller.mode(s) == STITCHED for s in range(first, hook.step))
        assert not controller.job_reverted and hook.step == first + steps
    assert all(isinstance(value, list) and value[1] is None and value[0].shape == () for value in values)
    assert hook.backend_calls and all(calls > 0 for calls in hook.backend_calls.values())  # stitched, really
    assert session_py.keys() & FETCH_HANDLING == set(), session_py
    assert session_py["__init__"] == 0, session_py  # no `_FetchHandler`, no `_FetchMapper`
    per_step = sum(plugin.values()) / steps
    assert per_step <= BUDGET, sorted(plugin.items(), key=lambda item: -item[1])[:30]


LEASED_BUDGET = 85  # Python calls in the plugin per leased stitched step, booking included (~81; step by step ~105)


def test_routine_steps_run_on_a_lease_without_a_plan_or_a_booking_each(tmp_path: Path) -> None:
    hook, _ = hooked(
        tmp_path, "leased-steps", STITCHFLEET_CHECK_EVERY="1000000", STITCHFLEET_REBASELINE_EVERY="1000000"
    )
    graph = models.build("bert_encoder", "small", seed=1)
    plugin: Counter[tuple[str, str]] = Counter()

    profile = _counting(plugin, Counter())
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(12):
                session.run([loss, train_op], feeds)
            controller, path = hook.controller, hook.path
            assert controller is not None and path is not None and controller.mode(hook.step) == STITCHED
            steps, first = 2 * routine.ROUTINE_STEPS, hook.step
            path.settle()  # the steps before are booked now: only those profiled are booked while profiled
            booked = controller.job_seconds
            sys.setprofile(profile)
            try:
                for _ in range(steps):
                    session.run([loss, train_op], feeds)
                path.settle()  # the open lease's steps, as the hook's `end` books them
            finally:
                sys.setprofile(None)
            assert all(controller.mode(step) == STITCHED for step in range(first, hook.step))
            assert not controller.job_reverted and hook.step == first + steps
            assert controller.job_seconds > booked
    # at most a plan per lease (plus the step that began leasing); each step still measured and booked in its window
    assert plugin[("controller", "step_plan")] <= 4, plugin[("controller", "step_plan")]
    assert plugin[("controller", "timed")] == steps
    per_step = sum(plugin.values()) / steps
    assert per_step <= LEASED_BUDGET, sorted(plugin.items(), key=lambda item: -item[1])[:30]


def test_a_run_that_does_not_compute_the_loss_ends_the_lease_and_fetches_no_loss(tmp_path: Path) -> None:
    """The lease's arguments fetch the loss because its first step's run computed it; a later training run whose
    fetches do not reach the loss (`StepArgs.reaches_loss`) must not be made to compute it (the user's random
    streams would draw otherwise): its step ends the lease and is planned on its own."""
    hook, _ = hooked(tmp_path, "lease-loss", STITCHFLEET_CHECK_EVERY="1000000", STITCHFLEET_REBASELINE_EVERY="1000000")
    graph = models.build("bert_encoder", "small", seed=1)
    odd = 0
    returned: dict[int, object] = {}
    before, reaches = StepPath.before, StepArgs.reaches_loss

    def recorded(path: StepPath, step: int) -> object:
        returned[step] = args = before(path, step)
        return args

    with graph.as_default(), pytest.MonkeyPatch.context() as patch:
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        patch.setattr(StepPath, "before", recorded)
        patch.setattr(StepArgs, "reaches_loss", property(lambda args: reaches.fget(args) and hook.step != odd))
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(14):
                session.run([loss, train_op], feeds)
            assert hook.path is not None and hook.path.lease is not None and hook.path.lease.loss
            odd = hook.step + 1  # a leased step, but its run does not compute the loss
            for _ in range(4):
                session.run([loss, train_op], feeds)
    fetched = {step: set(getattr(args, "fetches", {}) or {}) for step, args in returned.items()}
    assert "loss" in fetched[odd - 1] and "loss" not in fetched[odd] and "loss" in fetched[odd + 1]
