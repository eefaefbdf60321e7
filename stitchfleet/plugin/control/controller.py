"""What the hook decides, step by step: switches, checks, windows, probes, reverts. TF-free.

Input: the compiled clusters, the timing schedule, a `Ledger`, the job's setup seconds and length; per step what
it gave (`StepFigures`). Output: per step its `StepPlan` (step_contract), and every decision taken from the figures
summed over ranks (`decision_figures`), so Horovod ranks decide alike. The rules: docs/plugin/controller.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from stitchfleet.plugin.control.check_plan import CheckPlan
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.decision_figures import DecisionFigures, GuardFigures
from stitchfleet.plugin.control.job_course import JobCourse, finding_figures
from stitchfleet.plugin.control.own_work import OwnWork
from stitchfleet.plugin.control.plugin_cost import PluginCost
from stitchfleet.plugin.control.probe_course import ProbeCourse
from stitchfleet.plugin.control.probe_decisions import ProbeDecisions
from stitchfleet.plugin.control.schedule import GROUP, PROBE, REFERENCE, REVERTED, STITCHED, Probes, Timing
from stitchfleet.plugin.control.signature_decisions import SignatureLookup
from stitchfleet.plugin.control.slowdown import Bracket
from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan, frozen
from stitchfleet.plugin.control.step_windows import Window, Windows
from stitchfleet.plugin.control.warmup import ExecutorWarmup
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.guard.numeric import Finding

log = logging.getLogger("stitchfleet.plugin")
EXTRA = DecisionFigures.EXTRA  # the figures after the cluster flags (`decision_figures`)
SWITCH_ARRAYS = 64  # distinct switch vectors whose plan array is kept for later plans (`step_plan`)


class Controller:
    def __init__(
        self,
        clusters: list[Cluster],
        timing: Timing,
        ledger: Ledger,
        size: int = 1,
        setup_seconds: float = 0.0,
        *,
        kernels: SignatureLookup | None = None,
        job_steps: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clusters, self.ledger, self.size = clusters, ledger, size
        # the probe schedule, samples and decisions; the kernels per shape signature: a finding's shapes, a
        # signature's withdrawal
        length = timing.job_steps if job_steps is None else job_steps  # bounds the settle block (`Timing.settle`)
        self.decisions = ProbeDecisions(
            clusters, ledger, size, replace(timing, clusters=len(clusters), job_steps=length), kernels
        )
        self.windows = Windows(timing.window_steps)
        self.warmup = ExecutorWarmup(timing.warmup_steps)
        self.setup_seconds = setup_seconds  # the job's compile seconds so far; the warmup's builds join them
        self._nothing = frozen(np.zeros(len(clusters) + EXTRA), np.float64)  # `local` when nothing is to say
        self._switch_arrays: dict[tuple[bool, ...], NDArray[np.bool_]] = {}  # the plans' (read-only) switches
        self.course = JobCourse(clusters, ledger)  # whether stitching goes on: the reverts, stitching off
        # the fleet's known decisions; the probes cut to what the job's remaining steps can repay
        self.probing = ProbeCourse(clusters, ledger, size, self.decisions, self.course, job_steps=job_steps)
        # a cluster off from the start is flagged in the consensus, so that every rank reverts it
        self.pending: dict[int, Finding | str] = {
            k: "reverted by an earlier job" for k, c in enumerate(clusters) if not c.enabled
        }
        self.fault: str | None = None
        self.loss_bad = False
        # brackets of `baseline_steps` timed steps, adjacent within as many steps (checks leave holes)
        self.bracket = Bracket(
            max(timing.baseline_steps - 1, 1), max(timing.baseline_steps, 2), need=timing.baseline_steps
        )
        self.announced = self.timing.probing  # probed clusters are announced by their decision
        self.check_plan = CheckPlan([0] * len(clusters))  # which steps judge which clusters, at what cost
        self.job_seconds = 0.0  # every step's time
        self.ran: set[int] = set()  # clusters (positions) whose kernels ran in a step so far (`_first_run`)
        self.first_seconds = 0.0  # what their first runs took beyond a usual step: setup
        self.own_work = OwnWork(clock)  # the plugin's work on a step outside its timed run (`step_done`)
        self.own_charged = 0.0  # of it, what the stitched (and probe) windows' savings pay so far
        for c in clusters:
            c.kept = None if self.timing.probing else True

    @property
    def timing(self) -> Timing:
        """The probe schedule as it stands (a pair run again shifts what follows it: `ProbeDecisions.rerun`)."""
        return self.decisions.timing

    @property
    def probes(self) -> Probes:
        return self.decisions.probes

    @property
    def kernels(self) -> SignatureLookup | None:
        return self.decisions.kernels

    @kernels.setter
    def kernels(self, kernels: SignatureLookup | None) -> None:
        self.decisions.kernels = kernels

    @property
    def group_proven(self) -> bool | None:
        return self.decisions.group_proven

    @property
    def group_probe(self) -> str:
        return self.decisions.group_probe

    def measured(self, c: Cluster) -> str:
        """The shapes `c`'s probe timed (`ProbeDecisions.measured`)."""
        return self.decisions.measured(c)

    @property
    def job_steps(self) -> int | None:
        """The job's training steps from this controller's step 0, when known (the hook learns it late)."""
        return self.probing.job_steps

    @job_steps.setter
    def job_steps(self, steps: int | None) -> None:
        """The job's length (learnt at session creation) bounds the probes and the settle block; the latter moves the
        schedule, so only before the first step (a session recovered later keeps its schedule, on every rank)."""
        self.probing.job_steps = steps
        if self.job_seconds == 0.0 and self.timing.job_steps != steps:
            self.decisions.retime(replace(self.timing, job_steps=steps))

    @property
    def recalled(self) -> bool:
        return self.probing.recalled

    @property
    def job_reverted(self) -> str | None:
        return self.course.job_reverted

    @property
    def stitching_off(self) -> str | None:
        return self.course.stitching_off

    @stitching_off.setter
    def stitching_off(self, why: str | None) -> None:
        self.course.stitching_off = why

    @property
    def done(self) -> bool:
        """No cluster can run stitched again in this job (`JobCourse.done`)."""
        return self.course.done

    @property
    def length(self) -> int:
        return len(self.clusters) + EXTRA

    # --- the hook's two calls per step (step_contract) ----------------------------------------

    def step_plan(
        self, step: int, fault: str | None = None, *, prepared: bool = True, fresh: Sequence[int] = ()
    ) -> StepPlan:
        """What `step` runs; books the checks it makes. `fault`: a plugin error the hook met since its last
        call, in this step's figures. `prepared=False`: the hook could not prepare the step, which then only
        joins the consensus, saying so (no rank may wait for it). `fresh`: clusters (positions) whose kernel
        for this step's shapes the guard has not judged yet (`signature_kernels`): judged too when switched
        on, outside the checks' budget and rotation (a rank-local extra: it adds fetches, no collective)."""
        if not self.done:
            self.own_work.planned()
        if not self.recalled:
            self._recall(step)
        if self.done:  # nothing is left to decide: the step runs as written
            return StepPlan(step, quiet=True)
        self.fault = self.fault or fault
        if not prepared:
            local = DecisionFigures.fault_only(len(self.clusters)).pack()
            return StepPlan(step, local=frozen(local, np.float64))
        local, flags = self.local(step), self._switches(step)
        judged = self.judged(step)  # only clusters switched on are judged, so a check step is a twin step
        self.count_checks(judged, step)
        judged += [k for k in fresh if flags[k] and k not in judged]
        # The twin runs with a switch on, and in the warmup steps that build its executors; both follow
        # from the summed decisions and the step number only, so Horovod ranks take the same path.
        on_twin = any(flags) or step in self.warmup.builds
        checks = bool(judged) or step == self.warmup.checks  # the latter judged by nobody: see ExecutorWarmup
        # A plan's arrays are read-only, so plans share them: one switch array per distinct vector (a job has a
        # few), and the all-zero figures as they are; not two numpy copies per step.
        key = tuple(flags)
        switches = self._switch_arrays.get(key)
        if switches is None:
            switches = frozen(flags, np.bool_)
            if len(self._switch_arrays) < SWITCH_ARRAYS:
                self._switch_arrays[key] = switches
        local = local if local is self._nothing else frozen(local, np.float64)
        return StepPlan(step, False, switches, on_twin, tuple(judged), checks, local)

    def setup_spent(self, seconds: float) -> None:
        """Setup after the controller started (clusters rebuilt for the shapes the job feeds): booked with the
        rest of the job's compile seconds."""
        self.setup_seconds += seconds
        self.ledger.compiled(self.setup_total)

    def step_done(self, plan: StepPlan, figures: StepFigures) -> None:
        """Books what `plan`'s step took and found, then applies the summed figures (`decide`).

        The plugin's own work on the step (`OwnWork`) is booked beside its seconds: plain TF pays none of it, so a
        stitched window's saving pays it and a baseline never holds it (docs/plugin/control.md)."""
        started, own = self.own_work.booking(figures.seconds)
        try:
            self._step_done(plan, figures, own)
        finally:
            self.own_work.booked(started)

    def step_entered(self) -> None:
        """The hook's first line of a training step: its work from here to `step_plan` (the run's bookkeeping, the
        shape signature's observation) is the plugin's own too, booked with the step (`step_done`)."""
        if not self.done:
            self.own_work.entered()

    def step_left(self) -> None:
        """The hook's last line of a step: its work after `step_done` (polling the guard's results, releasing the
        run) is booked with the next step, as `step_done`'s own is."""
        self.own_work.left()

    def _step_done(self, plan: StepPlan, figures: StepFigures, own: float) -> None:
        self.fault = self.fault or figures.fault
        self.timed(
            plan.step,
            figures.seconds,
            bool(plan.judged),
            figures.measured,
            figures.plain,
            signature=figures.signature,
            own=own,
        )
        if plan.quiet:
            return
        if self.warmup.timed(plan.step, figures.seconds):
            self.ledger.compiled(self.setup_total)  # setup, charged openly
        loss = figures.loss
        if loss is not None and not math.isfinite(loss) and self.mode(plan.step) in (STITCHED, PROBE, REFERENCE):
            self.loss_bad = True  # (the mode is asked of a non-finite loss only: the usual step has no need)
        for k, finding in figures.findings:
            self.checked(plan.step, k, finding)
        if figures.summed is not None:
            self.decide(plan.step, figures.summed)

    def quiet_steps(self, steps: Sequence[tuple[int, float]]) -> None:
        """Books steps run once `done` (the user's graph as written), each (its number, its seconds): their time and
        the job's telemetry windows only, nothing decided; called once a batch (`StitchHook._book_quiet`)."""
        for step, seconds in steps:
            self.job_seconds += seconds
            for window in self.windows.add(step, self.mode(step), seconds, True, ""):
                self._record(window)

    def mode(self, step: int) -> str:
        phase = self.decisions.timing.phase(step)  # (`timing`, `job_reverted`, `stitching_off` read directly:
        course = self.course  # asked twice every step, the properties' calls were a third of its cost)
        # stitching off: the probe phases that were to follow (skipped) run the user's graph as well, and are
        # booked so, not as stitched windows claiming a difference from the baseline
        off = course.job_reverted is not None or course.stitching_off is not None
        return REVERTED if off and phase in (STITCHED, PROBE, REFERENCE) else phase

    def switches(self, step: int) -> NDArray[np.bool_]:
        return np.array(self._switches(step), dtype=bool)

    def _switches(self, step: int) -> list[bool]:
        """`switches` as a list: `step_plan` asks whether any is on without a numpy reduction (per step)."""
        mode = self.mode(step)
        if mode == PROBE:  # the group, or every cluster still enabled with the probed one
            return [c.enabled for c in self.clusters]
        if mode == REFERENCE:  # every cluster still enabled but the probed one
            probed = self.timing.subject(step)
            return [c.enabled and i != probed for i, c in enumerate(self.clusters)]
        on = mode == STITCHED
        return [on and c.enabled and bool(c.kept) for c in self.clusters]

    def checks(self, step: int) -> bool:
        """A step that judges at least one cluster (see `judged`)."""
        return bool(self.judged(step))

    def judged(self, step: int) -> list[int]:
        """The clusters (positions) `step` judges against the reference (`CheckPlan`)."""
        if not self.timing.checks(step):  # most steps: no numpy call
            return []
        on = [k for k, s in enumerate(self.switches(step)) if s]
        return self.check_plan.judged(self.timing, step, on, self.mode(step) == STITCHED, self.job_seconds)

    def count_checks(self, judged: list[int], step: int | None = None) -> None:
        """Books the clusters a step judged (the hook calls this once per step, before it runs)."""
        if not judged:  # most steps
            return
        periodic = step is not None and self.mode(step) == STITCHED and not self.timing.first_checks(step)
        self.check_plan.count(judged, step, periodic)

    @property
    def check_counts(self) -> list[int]:
        return self.check_plan.counts

    def local(self, step: int) -> NDArray[np.float64]:
        """This rank's figures for `step`, about to run (see the module docstring)."""
        if not self.recalled:
            self._recall(step)
        bracket, decided, grouped = self.bracket.take(), self.timing.decides(step), self.timing.decides_group(step)
        quiet = bracket is None and decided is None and not grouped and self.fault is None and not self.loss_bad
        if quiet and not self.pending:
            for c in self.clusters:  # a loop, not `all` of a generator: asked every step
                if c.kernel.bad is not None:
                    break
            else:
                return self._nothing  # most steps: nothing to say, and no record to build and pack
        flags = tuple(float(i in self.pending or c.kernel.bad is not None) for i, c in enumerate(self.clusters))
        slowdown = (1.0, *bracket) if bracket is not None else (0.0, 0.0, 0.0, 0.0)
        guard = GuardFigures(float(self.fault is not None), float(self.loss_bad), *slowdown)
        return DecisionFigures(
            flags,
            guard,
            self.decisions.figures(decided),
            self.decisions.figures(GROUP if grouped else None),
            self.decisions.signatures.figures(decided),
        ).pack()

    # --- after a step ---------------------------------------------------------------------

    def timed(
        self,
        step: int,
        seconds: float,
        checked: bool,
        measured: str | None = "",
        plain: Sequence[int] = (),
        *,
        signature: str | None = "",
        own: float = 0.0,
    ) -> None:
        """Books the step's time; closed windows become StepWindow rows. `measured`, `plain`, `signature`: the
        signature of the kernels that ran, the clusters that ran TF's ops for it, the step's own (`StepFigures`,
        `Probes`, `step_windows`); `own`: the plugin's work on the step beyond `seconds` (`step_done`)."""
        if self.done:  # nothing is left to decide: only the job's time and its telemetry windows
            self.job_seconds += seconds
            for window in self.windows.add(step, self.mode(step), seconds, not checked, signature, own=own):
                self._record(window)
            return
        mode = self.mode(step)
        if mode in (STITCHED, PROBE, REFERENCE):
            self.own_charged += own
        if mode == STITCHED and not self.announced:
            self._announce(step)
        seconds -= 0.0 if checked else self._first_run(step, seconds)
        if plain and self.timing.grouped(step) and len(plain) == int(self.switches(step).sum()):
            plain = (*plain, GROUP)  # every cluster on ran TF's ops for good: the group's half would time TF
        # the clusters on at a probe step, checked or not: a kernel's first call at a signature is no sample (`Probes`);
        # a stitched step is no probe step (its phase is no pair's), so neither is asked of it
        if mode != STITCHED:
            on = tuple(np.flatnonzero(self.switches(step)).tolist()) if self.timing.subject(step) is not None else ()
            self.probes.add(step, seconds, not checked, measured, plain, on=on)
        self.job_seconds += seconds
        if checked:
            self.check_plan.book(seconds, self.windows.stitched_median or self.windows.baseline_median or 0.0, own)
        else:
            self.bracket.add(step, mode, seconds)
        for window in self.windows.add(step, mode, seconds, not checked, signature, own=own):
            self._record(window)

    def _first_run(self, step: int, seconds: float) -> float:
        """The first step that runs a cluster's kernel in this process loads it (its library, its first call): 1.9 s
        on the small BERT encoder against 1.3 ms steps. That time beyond the usual baseline step is setup, booked
        with the compile seconds like the warmup's executor builds; returned, so that no probe and no window counts
        it (else the report's saving missed it against the wall clock). Check steps are left to the check budget."""
        if len(self.ran) == len(self.clusters):  # every kernel has run: nothing is new (most steps)
            return 0.0
        on = set(np.flatnonzero(self.switches(step)).tolist())  # not a Python loop over numpy booleans
        new, usual = on - self.ran, self.windows.usual
        if not new or usual is None:
            return 0.0
        self.ran |= new
        extra = max(seconds - usual, 0.0)
        self.first_seconds += extra
        self.ledger.compiled(self.setup_total)
        return extra

    @property
    def setup_total(self) -> float:
        """The job's setup so far: compile, the warmup's executor builds, the kernels' first runs."""
        return self.setup_seconds + (self.warmup.seconds or 0.0) + self.first_seconds

    def _announce(self, step: int) -> None:
        self.announced = True
        for c in self.clusters:
            if c.enabled:
                self.ledger.event("cluster_enabled", step, c.fingerprint, "stitched path on")
                self.ledger.verdict(c.fingerprint, "enabled", op_count=c.op_count)

    def _record(self, window: Window) -> None:
        self.ledger.window(
            window_index=window.index,
            first_step=window.first_step,
            last_step=window.last_step,
            iterations=window.iterations,
            mode=window.row_mode,
            step_seconds_sum=window.spent,
            baseline_step_seconds=window.baseline,
            saved_seconds=window.saved_seconds,
        )

    def checked(self, step: int, index: int, finding: Finding) -> None:
        if not finding.ok:
            self.pending.setdefault(index, finding)
            c = self.clusters[index]
            figures = finding_figures(finding)
            self.ledger.event("guard_check", step, c.fingerprint, "mismatch", passed=False, **figures)

    def decide(self, step: int, summed: NDArray[np.float64]) -> None:
        """Applies the summed figures of `step`; the new switches hold from the next step. Once `done`, nothing
        is left to decide (the hook sends no figures then: its steps are quiet)."""
        if self.done:
            return
        timing = self.timing  # as scheduled for this step: a decision may insert a rerun after it
        deciding = timing.decides(step) is not None or timing.decides_group(step)
        # most steps: no rank flagged anything and nothing is decided (no record unpacked); without Horovod the
        # summed figures are this rank's own, `_nothing` on such a step (all zeros: no reduction to ask that)
        if not deciding and (summed is self._nothing or (len(summed) == self.length and not summed.any())):
            return
        n = len(self.clusters)
        figures = DecisionFigures.unpack(summed, n)
        for i, c in enumerate(self.clusters):
            if figures.flags[i] > 0 and c.enabled:
                self.course.revert_cluster(step, c, self.pending.get(i) or c.kernel.bad or "reverted on another rank")
        self._guard_job(step, figures.guard)
        grouped = timing.decides_group(step) and self.job_reverted is None
        if grouped and self.decisions.group(step, figures.group):
            if self.group_proven:
                self._bound_probes(step)
            else:
                self._after_group_loss(step)
        probed = timing.decides(step)
        if probed is not None and self.job_reverted is None:
            decided = self.decisions.cluster(step, self.clusters[probed], figures.cluster, figures.signed)
            if decided and probed == timing.probed_clusters[-1]:
                self.course.settle(step)
            elif decided:
                self._bound_probes(step)

    # --- what the fleet knows, and what the job's remaining steps can repay (`ProbeCourse`) -----

    def _recall(self, step: int) -> None:
        self.probing.recall(step)

    def group_key(self) -> tuple[str, str, str]:
        """The key of this job's group in the fleet's memory (`ProbeCourse.group_key`)."""
        return self.probing.group_key()

    def _bound_probes(self, step: int) -> None:
        self.probing.bound(step)

    def _after_group_loss(self, step: int) -> None:
        self.probing.after_group_loss(step)

    def _revert_job(self, step: int, reason: str, detail: str) -> None:
        self.course.revert_job(step, reason, detail)

    def finish(self) -> None:
        """The job's end: its last windows, its overhead (`PluginCost`), then its outcome (`JobCourse.finish`)."""
        for window in self.windows.close():
            self._record(window)
        self.ledger.overhead(PluginCost.of(self).overhead)
        self.course.finish(self.timing.probing, self.group_proven)

    def _guard_job(self, step: int, figures: GuardFigures) -> None:
        """Job-wide reverts from the summed fault, loss and (rank-summed) bracket figures: a slowdown must
        exceed both the margin and NOISE_FACTOR standard errors in two pooled verdicts in a row (`JobCourse.slowed`)."""
        fault, loss, fresh = figures.fault, figures.loss, figures.fresh
        if fault > 0:
            self._revert_job(step, "plugin error", self.fault or "a plugin error on another rank")
        elif loss > 0:
            self._revert_job(step, "non-finite loss", "the loss was NaN/Inf on a stitched step")
        elif fresh >= self.size and self.course.stitching:
            found = (figures.stitched / self.size, figures.baseline / self.size, figures.noise / self.size)
            self.course.slowed(step, found, self.timing.slowdown_margin)
