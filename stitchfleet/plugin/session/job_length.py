"""How many training steps a job has: what bounds its probes and decides whether its setup can pay.

Input: the settings (`job_steps`, when the operator or the user states it) and the hook itself: the list of
hooks a `MonitoredSession` (or an Estimator's `train`) holds it in, where a `StopAtStepHook` says the job's
`num_steps` or `last_step`. Output: whether the job skips its setup (too short, measured not to pay, or held out:
one run in every STITCHFLEET_HOLDOUT_EVERY runs as written and timed), and its steps. The rules in full:
docs/plugin/session.md and docs/plugin/setup.md.
"""

from __future__ import annotations

import gc
import logging
import sys
from types import FrameType

import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.setup import payback, setup_record
from stitchfleet.telemetry.kinds import HOLDOUT_REASON, EventKind
from stitchfleet.telemetry.slow_verdicts import SlowerVerdict

log = logging.getLogger("stitchfleet.plugin")


# The sessions of one run (an Estimator's `train` per epoch, under one STITCHFLEET_JOB_UID) are one task in the report:
# its first session's holdout decision (the sentence, or None) holds for its later ones, which the record does not
# count again. A holdout task with stitched windows of its other sessions would give the held-out check no plain step.
RUN_HOLDOUTS: dict[tuple[str, str, str], str | None] = {}  # (job uid, kernel cache, record key): its sentence


class JobLength:
    """A hook's view of its job's length: found at `begin` (`short`), counted from the hook's step 0 once the
    session exists (`created`: `steps`, None when unknown)."""

    def __init__(self, current: settings_module.Settings) -> None:
        self.current = current
        self.stop: tf.compat.v1.train.StopAtStepHook | None = None
        self.steps: int | None = None
        self.skipped: str | None = None  # why setup was skipped at `begin`, if it was
        self.held_out = False  # skipped as a holdout: the run is timed as written from its first step (`holdout`)

    def short(self, hook: object, ledger: Ledger, backend: str, ranks: int = 1) -> bool:
        """At `begin`: whether the job is too short for its setup (`too_short`), or its setup cannot pay back on
        `backend` (`payback.estimate`; "measured not to pay" when its last run here said so: `setup_record.tally`
        counts it), or the run is a holdout of a job of `ranks` ranks (`holdout`); the job's telemetry says which (a
        `setup` event with the figures; when skipped, it finished)."""
        self.stop = stop_hook(hook)
        timing = Timing.from_settings(self.current, clusters=2)
        why, label = too_short(timing, self.current.job_steps, self.stop), "job too short"
        if why is None:
            step_seconds = self.current.step_ms / 1e3 if self.current.step_ms > 0 else None
            graph = tf.compat.v1.get_default_graph()  # begin's: the user's (a Horovod job's with its agreement ops)

            def cache() -> setup_record.CacheState:
                return setup_record.state(graph, backend, self.current)

            steps = planned(self.current.job_steps, self.stop)
            estimate = payback.estimate(steps, step_seconds, backend, timing, cache, ops=len(graph.get_operations()))
            log.info("stitchfleet: %s", estimate.why)
            state, uid = estimate.state, self.current.job_uid
            run = (uid, str(self.current.cache_dir), state.key) if uid and state is not None else None
            first = run is None or run not in RUN_HOLDOUTS  # a run's later session follows its first (RUN_HOLDOUTS)
            held = holdout(estimate, self.current.holdout_every, ranks) if first or run is None else RUN_HOLDOUTS[run]
            if run is not None and first:
                RUN_HOLDOUTS[run] = held
            if first and state is not None and state.measured is not None:  # a skip counts, a setup restarts it
                skipped = not estimate.affordable
                setup_record.tally(self.current.cache_dir, state.key, backend, skipped, held_out=held is not None)
            if held is not None:
                self.held_out = True
                self._skip(ledger, HOLDOUT_REASON, held)
                return True
            if estimate.affordable:
                ledger.event(EventKind.SETUP.value, None, None, "setup affordable", detail=estimate.why)
                return False
            why = estimate.why
            if estimate.weighed is not None:  # what its last run here measured said no: not the job's length
                label = "measured not to pay"
        self._skip(ledger, f"setup skipped: {label}", why)
        return True

    def known_loss(self, verdict: SlowerVerdict | None, ledger: Ledger) -> bool:
        """After `short`: whether the fleet's memory holds a slower verdict on this job's graph
        (`setup.job_verdict`); then setup is skipped as for a short job, the verdict named in the event."""
        if verdict is None:
            return False
        why = f"the fleet found stitching slower than TF on this job's graph: {verdict.reason}"
        self._skip(ledger, "setup skipped: known to lose", why)
        return True

    def _skip(self, ledger: Ledger, label: str, why: str) -> None:
        self.skipped = why
        log.info("stitchfleet: %s: %s", label, why)
        ledger.setup_skipped(label, why)
        # No database client for two rows: they go to the spool (`Ledger.spool_meanwhile`). Opened at close, the
        # client held the job's end 2.3-3.1 s (0.5 s CPU) on the demo model (3 runs, 2-core machine under load),
        # plain TF's 0.004 s; opened beside the steps, it took 0.3-0.4 s of the CPU they run on.
        ledger.spool_meanwhile()

    def created(self, session: tf.compat.v1.Session, step: int) -> int | None:
        """After the session was created at the hook's `step`: the job's steps from the hook's step 0."""
        if self.stop is None and not self.current.job_steps:
            return self.steps
        try:
            self.steps = step + remaining_in(session, self.current.job_steps, self.stop)
        except Exception:
            log.exception("stitchfleet: could not read the job's length; its probes take it as unknown")
            self.steps = None
        return self.steps


# How many callers up `stop_hook` looks for the session's list of hooks: `begin` runs from the MonitoredSession's
# constructor, a few frames above it (an Estimator's `train` adds its own frames further up, not between).
STACK_DEPTH = 16


def stop_hook(hook: object) -> tf.compat.v1.train.StopAtStepHook | None:
    """The StopAtStepHook in a list of hooks that also holds `hook` (the session's hooks), if any.

    The list is looked for first in the callers' frames (the session's own `_hooks`, or a local list): asking the
    garbage collector for every object that refers to `hook` walks all of the process's objects, 23-60 ms once
    TensorFlow is imported, in every job's `begin`. Only where no caller holds such a list does it ask."""
    holders = _callers_lists(hook) or [h for h in gc.get_referrers(hook) if isinstance(h, list)]
    for holder in holders:
        if any(item is hook for item in holder):
            for other in holder:
                if isinstance(other, tf.compat.v1.train.StopAtStepHook):
                    return other
    return None


def _callers_lists(hook: object) -> list[list[object]]:
    """Lists holding `hook` among the callers' local variables and their objects' `_hooks` (innermost first). An
    object's attributes are read from its own `__dict__`: a caller's local may be any object, and a `__getattr__` of
    its class must not run."""
    found: list[list[object]] = []
    frame: FrameType | None = sys._getframe(2)  # `stop_hook`'s caller, then its callers
    for _ in range(STACK_DEPTH):
        if frame is None:
            break
        for value in list(frame.f_locals.values()):
            candidate = value
            if not isinstance(candidate, list):
                try:
                    candidate = object.__getattribute__(value, "__dict__").get("_hooks")
                except (AttributeError, TypeError):
                    continue
            if isinstance(candidate, list) and any(item is hook for item in candidate):
                found.append(candidate)
        frame = frame.f_back
    return found


def holdout(estimate: payback.Payback, every: int, ranks: int) -> str | None:
    """Why this run is a holdout, or None: a single-rank job whose node record holds a figure under which it would set
    up (`estimate.weighed`, affordable), once `every - 1` runs set up on the record since the last holdout. Its steps
    run as written and timed, so that the report can set the job's stitched runs against plain TF in processes of
    their own (the in-job baseline stood 5-16% above a plain process: docs/plugin/setup.md). Never with `every` 0, nor
    in a Horovod job (its ranks' nodes hold different records, and every rank must take the same decision), nor
    without a figure weighed (a job that explores again after RETRY_AFTER skips: its exploring is what it is for)."""
    weighed = estimate.weighed
    if every <= 0 or ranks != 1 or not estimate.affordable or weighed is None or weighed.setups + 1 < every:
        return None
    return (
        f"run {every} of every {every} that would set up on this node's record runs as written and timed: plain TF's"
        f" step for the report's held-out check (STITCHFLEET_HOLDOUT_EVERY={every})"
    )


def planned(stated: int, stop: tf.compat.v1.train.StopAtStepHook | None) -> int | None:
    """At most how many steps the job runs from here: `stated` (settings, > 0), a StopAtStepHook's `num_steps`,
    or its `last_step` (the global step is at least 0); None when unknown."""
    if stated > 0:
        return stated
    if stop is None:
        return None
    num_steps, last_step = getattr(stop, "_num_steps", None), getattr(stop, "_last_step", None)
    if num_steps is not None:
        return int(num_steps)
    return int(last_step) if last_step is not None else None


def remaining(stated: int, stop: tf.compat.v1.train.StopAtStepHook | None, global_step: int | None) -> int | None:
    """The steps left once the session's `global_step` is known: a `last_step` counts from it."""
    if stated > 0 or stop is None:
        return planned(stated, stop)
    if getattr(stop, "_num_steps", None) is not None:
        return int(stop._num_steps)
    last_step = getattr(stop, "_last_step", None)
    if last_step is None:
        return None
    return max(int(last_step) - (global_step or 0), 0)


def remaining_in(session: tf.compat.v1.Session, stated: int, stop: tf.compat.v1.train.StopAtStepHook | None) -> int:
    """`remaining` with the global step read from the created `session`; raises when nothing says."""
    graph_step = tf.compat.v1.train.get_global_step(session.graph) if stop is not None else None
    value = int(session.run(graph_step)) if graph_step is not None else None
    left = remaining(stated, stop, value)
    if left is None:
        raise ValueError("no setting or StopAtStepHook says the job's length")
    return left


def too_short(timing: Timing, stated: int, stop: tf.compat.v1.train.StopAtStepHook | None) -> str | None:
    """Why a job is too short for its setup (its warmup and group probe on the twin take more than PROBE_SHARE of
    its planned steps: a gain it might find could not repay them), or None. The same on every rank: the planned
    steps come from the script or the settings. Unknown length: not too short (the probes bound themselves)."""
    planned_steps = planned(stated, stop)
    if planned_steps is None or timing.affordable(timing.exploring_steps, planned_steps):
        return None
    return (
        f"the job plans {planned_steps} steps; its warmup and group probe would run {timing.exploring_steps} of them"
        f" on the twin, over PROBE_SHARE {timing.probe_share:.0%}: no compile, no probe, the job runs as written"
    )
