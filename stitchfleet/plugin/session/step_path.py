"""A stitching job's per-step path: the controller's plan of each training step, mapped onto its run and back.

Input: what the setup started (`job_setup.Setup.started`: the controller, the step's feeds and fetches, its
figures, the twin's diverter, the shape signatures), then per training step its number, feeds and fetched
results. Output: the `SessionRunArgs` the step adds (None: nothing, plain TF) and the figures the controller hears.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan

if TYPE_CHECKING:
    import tensorflow as tf

    from stitchfleet.plugin.control.controller import Controller
    from stitchfleet.plugin.graph.twin import Diverter, Feeds
    from stitchfleet.plugin.session.step_args import StepArgs
    from stitchfleet.plugin.session.step_results import StepResults
    from stitchfleet.plugin.shapes.signature_kernels import SignatureKernels

log = logging.getLogger("stitchfleet.plugin")


class StepPath:
    """The steps of a job whose controller started: `before` a step (its plan), `after` it (its figures)."""

    def __init__(
        self,
        controller: Controller,
        step_args: StepArgs,
        step_results: StepResults,
        signatures: SignatureKernels | None,
        diverter: Diverter | None,
    ) -> None:
        self.controller, self.step_args, self.step_results = controller, step_args, step_results
        self.signatures, self.diverter = signatures, diverter
        self.plan: StepPlan | None = None  # the controller's plan of the current step
        self.failure: str | None = None  # a plugin error the controller hears of with the next plan

    def observe(self, feed_dict: Feeds | None, step: int) -> float:
        """The step's shape signature: kernels are compiled for it when due (`signature_kernels`), in the
        background; the seconds it booked count as setup (returned). None once no cluster can run stitched."""
        if self.signatures is None or self.controller.done:
            return 0.0
        booked = self.signatures.before(feed_dict, step)
        if booked:
            self.controller.setup_spent(booked)
        return booked

    def before(self, step: int) -> tf.compat.v1.train.SessionRunArgs | None:
        """Maps the controller's plan of the step onto its feeds and fetches (and the twin's diverter)."""
        assert self.diverter is not None
        fresh = self.signatures.fresh() if self.signatures is not None else []  # kernels the guard has not judged
        plan = self.plan = self.controller.step_plan(step, self.failure, fresh=fresh)
        self.failure = None
        if plan.quiet:
            # Stitching is over for this job: the step runs as written (no fetch, feed or collective added:
            # plain TF), only timed and counted for the job's telemetry.
            return None
        self.diverter.arm(plan.on_twin)  # the twin runs, or the user's own graph (`StepArgs.planned`), prepared
        return self.step_args.planned(plan)

    def consensus_only(self, step: int, err: Exception) -> tf.compat.v1.train.SessionRunArgs | None:
        """A step whose preparation failed still takes part in the consensus (no rank may wait)."""
        failure, self.failure = self.failure or f"{type(err).__name__}: {err}", None
        self.plan = self.controller.step_plan(step, failure, prepared=False)
        if self.plan.quiet:  # stitching is over: no rank joins a consensus any more
            return None
        return self.step_args.consensus_only(self.plan)

    def after(self, results: dict[str, object], seconds: float, step: int) -> None:
        """Reads what the planned step fetched and hands the controller its figures."""
        assert self.plan is not None
        plan, fault = self.plan, None
        if plan.quiet:
            self.controller.step_done(plan, StepFigures(seconds))
            return
        if self.diverter is not None and self.diverter.armed:
            self.diverter.armed = False
            raise RuntimeError("the step did not run through the session the twin is attached to")
        if self.diverter is not None and self.diverter.failure is not None:
            failure, self.diverter.failure = self.diverter.failure, None
            log.error("stitchfleet: step %d failed on the twin and ran as written: %s", step, failure)
            fault = f"{type(failure).__name__}: {failure}"  # stitching reverts for the job
        self.controller.step_done(plan, self.step_results.figures(plan, results, seconds, step, fault))
        self.step_results.poll()

    def agreed_step(self, step: int, seconds: float) -> None:
        """Horovod's agreement run was the job's first training step, as written (plain TF): booked as a
        quiet step of the job's windows, so iterations equal steps on every rank (it was left out: 499 for 500)."""
        self.controller.step_done(StepPlan(step, quiet=True), StepFigures(seconds))

    def fault(self, err: Exception) -> None:
        """A plugin error outside a step's figures: the controller hears of it with the next plan."""
        self.failure = self.failure or f"{type(err).__name__}: {err}"
