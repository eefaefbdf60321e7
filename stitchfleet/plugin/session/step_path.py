"""A stitching job's per-step path: the controller's plan of each training step, mapped onto its run and back.

Input: what the setup started (`job_setup.Setup.started`: the controller, the step's feeds and fetches, its
figures, the twin's diverter, the shape signatures), then per training step its number, feeds and fetched
results. Output: the `SessionRunArgs` the step adds (None: nothing, plain TF) and the figures the controller hears.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from stitchfleet.plugin.control import routine
from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan
from stitchfleet.plugin.session.step_lease import Lease

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
        self.lease: Lease | None = None  # routine steps ahead, run on one plan and booked at its end (`settle`)
        self._args: tf.compat.v1.train.SessionRunArgs | None = None  # the planned step's, for a lease after it
        self._planned = False  # whether `before` planned the step (its arguments may be None: nothing added)
        self._booked_at: float | None = None  # when the last leased step's row was booked (`left` measures from it)
        self._carried = 0.0  # the hook's work after that booking: the next leased step's own (`left`)

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
        lease = self.lease
        if lease is not None:
            leased = lease.next == step and not fresh and self.failure is None
            # the same plan gives the same arguments for a run whose fetches compute the loss as the lease's did
            if leased and self.step_args.reaches_loss == lease.loss:  # a routine step: as the lease's plan
                self.plan = lease.plan
                self.diverter.armed = lease.plan.on_twin
                return lease.args
            self.settle()  # anything else ends the lease: its steps are booked before this step is planned
        plan = self.plan = self.controller.step_plan(step, self.failure, fresh=fresh)
        self.failure = None
        if plan.quiet:
            # Stitching is over for this job: the step runs as written (no fetch, feed or collective added:
            # plain TF), only timed and counted for the job's telemetry.
            return None
        # the twin runs, prepared; the user's own graph runs through TF's path, as plain TF's does
        self.diverter.armed = plan.on_twin
        self._args = args = self.step_args.planned(plan)
        self._planned = True
        return args

    def consensus_only(self, step: int, err: Exception) -> tf.compat.v1.train.SessionRunArgs | None:
        """A step whose preparation failed still takes part in the consensus (no rank may wait)."""
        failure, self.failure = self.failure or f"{type(err).__name__}: {err}", None
        self.settle()
        self.plan = self.controller.step_plan(step, failure, prepared=False)
        if self.plan.quiet:  # stitching is over: no rank joins a consensus any more
            return None
        return self.step_args.consensus_only(self.plan)

    def after(self, results: dict[str, object], seconds: float, step: int, own: float, arrived: float) -> None:
        """Reads what the planned step fetched and hands the controller its figures (a leased step's go to its
        lease: `own`, the hook's work on the step before its run, is booked with them, and its work since the run
        ended at `arrived`)."""
        assert self.plan is not None
        lease = self.lease
        if lease is not None and lease.next == step and self.plan is lease.plan:
            if self._routine(lease, results, seconds, step, own, arrived=arrived):
                return
            self.settle()  # the steps before it are booked; this one is booked on its own, as planned
            self.plan = replace(lease.plan, step=step)
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
        count = routine.span(self.controller, plan) if self._planned else 0
        if count:
            self.lease = Lease(plan, self._args, step + 1, count, self.step_args.reaches_loss)
        self._args, self._planned = None, False

    def _routine(
        self,
        lease: Lease,
        results: dict[str, object],
        seconds: float,
        step: int,
        own: float,
        *,
        arrived: float,
    ) -> bool:
        """Books a leased step that ran as planned (False: something to hear of, booked on the full path). Its own
        work: the hook's before its run (`own`), after it (from `arrived`) and after the last leased row's booking."""
        diverter, loss = self.diverter, results.get("loss")
        if diverter is not None and (diverter.armed or diverter.failure is not None):
            return False
        if loss is not None and not math.isfinite(float(cast("float", loss))):  # the next plan flags it
            return False
        measured: tuple[str | None, tuple[int, ...], str | None] = ("", (), "")
        signatures = self.signatures
        if signatures is not None:  # as `StepResults.figures` reads it
            signatures.after(cast("Sequence[Iterable[int]] | None", results.get("shapes")), step)
            measured = signatures.probes.measured(signatures.signature, lease.plan.switches)
        seen = self.step_results.faults_seen
        self.step_results.poll()  # each step: a GPU op's noted NaN/Inf is what makes its next call judged
        carried, self._carried = self._carried, 0.0
        lease.ran(seconds, measured, own + carried + time.perf_counter() - arrived)
        if lease.over or self.step_results.faults_seen != seen:  # a native fault: the next plan flags it
            self.settle()
        self._booked_at = time.perf_counter()
        return True

    def left(self) -> None:
        """The hook's last line of a step: its work after the step's booking goes with the next step, a leased one's
        (session 48: 0.026 ms of the hook's 0.045 ms a leased step was booked nowhere) as a full step's does."""
        self.controller.step_left()
        booked, self._booked_at = self._booked_at, None
        if booked is None:
            return
        if self.lease is not None:
            self._carried += time.perf_counter() - booked
        else:  # the lease ended with this step: the next step is booked in full (`OwnWork`)
            self.controller.own_work.carried += time.perf_counter() - booked

    def settle(self) -> None:
        """Ends the lease: its steps that ran are booked, in order, in one call (`routine.book`)."""
        lease, self.lease = self.lease, None
        carried, self._carried = self._carried, 0.0  # the last leased step's work after its booking: the next step's
        self.controller.own_work.carried += carried
        if lease is not None and lease.rows:
            started = time.perf_counter()
            routine.book(self.controller, lease.first, lease.rows)
            self.controller.own_work.carried += time.perf_counter() - started  # booked with the next step

    def agreed_step(self, step: int, seconds: float) -> None:
        """Horovod's agreement run was the job's first training step, as written (plain TF): booked as a
        quiet step of the job's windows, so iterations equal steps on every rank (it was left out: 499 for 500)."""
        self.controller.step_done(StepPlan(step, quiet=True), StepFigures(seconds))

    def fault(self, err: Exception) -> None:
        """A plugin error outside a step's figures: the controller hears of it with the next plan."""
        self.failure = self.failure or f"{type(err).__name__}: {err}"
