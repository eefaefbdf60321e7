"""`StitchHook`: the session hook that stitches a TF1 training graph, guards it and proves savings.

Input: the default graph at `begin`, settings, optionally the loss tensor and a test-only `Fault`. Output: the
rewired graph, the feeds and fetches each step adds (the controller's two calls per step: `step_plan`,
`step_done`), telemetry. Every entry point is guarded: the user's job never fails because of it (docs/plugin/hook.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import EXTRA, Controller
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan
from stitchfleet.plugin.fleet import ledger
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.graph.mapping import Site, StepOps
from stitchfleet.plugin.graph.rewrite import Installed, Rewired, rewire
from stitchfleet.plugin.graph.training_steps import TrainingSteps, find_loss
from stitchfleet.plugin.graph.twin import Diverter
from stitchfleet.plugin.graph.twin import build as build_twin
from stitchfleet.plugin.graph.twin import built_in as twin_built_in
from stitchfleet.plugin.guard.translation import check_sites
from stitchfleet.plugin.horovod.decision_sums import Consensus
from stitchfleet.plugin.horovod.setup_agreement import SLOTS, Agreement
from stitchfleet.plugin.native.dispatch_op import BridgeOp
from stitchfleet.plugin.native.dispatch_op import choose as choose_bridge
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.native.kernels import resolve_backend
from stitchfleet.plugin.session import gc_pause, hooked_graph, job_length
from stitchfleet.plugin.session.exported_graph import setup_additions
from stitchfleet.plugin.session.step_args import StepArgs
from stitchfleet.plugin.session.step_results import StepResults
from stitchfleet.plugin.session.step_threads import StepThreads
from stitchfleet.plugin.setup import job_graph, job_verdict, selection
from stitchfleet.plugin.shapes.signature_kernels import Job, SignatureKernels
from stitchfleet.plugin.shapes.signatures import Specialisation
from stitchfleet.telemetry.kinds import EventKind

log = logging.getLogger("stitchfleet.plugin")


class StitchHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    def __init__(
        self,
        settings: settings_module.Settings | None = None,
        *,
        backend: str | None = None,
        loss: tf.Tensor | None = None,
        fault: Fault | None = None,
        db_url: str | None = None,
        record: Ledger | None = None,
    ) -> None:
        """`record`: the job's telemetry when it is already open (a plain session's job that trained as written
        before its setup, `plain_session.Waiting`): the job keeps one record."""
        self.settings = settings or settings_module.current()
        self.backend = backend or self.settings.backend
        self.loss, self.fault, self.db_url = loss, fault, db_url
        self.active, self.step = False, 0
        self.quiet = False  # stitching is over for the job (`Controller.done`, latched at a step's start)
        self.off: dict[int, str] = {}
        self.installed: list[tuple[Cluster, Installed]] = []
        self.controller: Controller | None = None
        self.ledger: Ledger | None = record
        self.job_key: tuple[str, str, str] | None = None  # the job's graph in the fleet's memory (`job_verdict`)
        self.consensus: Consensus | None = None
        self._started = 0.0
        self._plan: StepPlan | None = None  # the controller's plan of the current step
        self._failure: str | None = None  # a plugin error the controller hears of with the next plan
        self._setup_seconds, self._faults_seen = 0.0, 0
        self._bridge: BridgeOp | None = None
        self.training: TrainingSteps | None = None
        self.runs = StepThreads()  # per thread: its current run is the training step / the agreement run
        self.agreement: Agreement | None = None  # Horovod: the ranks' agreement on installed clusters
        self._agreeing: np.ndarray[Any, np.dtype[np.float64]] | None = None  # this rank's part, until agreed
        self._switch_count = 0  # length of the graph's switch vector (clusters installed at begin)
        self.step_args: StepArgs | None = None  # a planned step's feeds and fetches (from `_start`)
        self.step_results: StepResults | None = None  # and its figures, from what it fetched
        self.diverter: Diverter | None = None  # runs a step on the stitched twin (see twin.py)
        self._originals: dict[int, Site] = {}  # each installed cluster's site in the user's graph
        self.loss_tensor, self.twin_loss = None, None  # the loss in the user's graph, and its value on the twin
        self.shapes: Specialisation | None = None  # the shape signature begin specialised to, if any
        self.signatures: SignatureKernels | None = None  # kernels per signature fed (a graph with None dims)
        self.length = job_length.JobLength(self.settings)  # the job's steps, when known: they bound its probes

    # --- SessionRunHook -------------------------------------------------------------------

    def begin(self) -> None:
        hooked_graph.mark(tf.compat.v1.get_default_graph())  # a plain session of this graph adds no second hook
        try:
            # What begin adds goes at the graph's top level and stays out of its exports (exported_graph.py).
            with gc_pause.paused(), setup_additions(tf.compat.v1.get_default_graph()):  # gc_pause.py: why paused
                self._begin()
        except Exception as err:  # never fail the job: stitching stays off
            log.exception("stitchfleet: stitching is off for this job")
            self.active = False
            if self.ledger is None:  # it failed before its ledger: recorded all the same, under this rank
                ranks = (self.consensus.rank, self.consensus.size) if self.consensus is not None else (0, 1)
                self.ledger = ledger.opened(self.settings, *ranks, self.db_url)
            self._event("compile_failure", None, f"plugin setup failed: {type(err).__name__}", str(err))

    def not_attached(self, reason: str) -> None:
        """Telemetry of a job whose training steps run without this hook (a session it cannot join), and why."""
        record = self.ledger or ledger.opened(self.settings, 0, 1, self.db_url)  # a waiting session's, if it had one
        try:
            if record is not None:
                record.event(EventKind.NOT_ATTACHED.value, None, None, "not attached", detail=reason)
                record.close()
        except Exception as err:  # the job runs on whatever happens here
            log.warning("stitchfleet: could not record that the hook is not attached: %s", err)

    def after_create_session(self, session: tf.compat.v1.Session, coord: tf.train.Coordinator) -> None:
        # Accounting needs what this rank really uses (its GPUs or CPU cores), which only the
        # created session knows; the job runs on whatever happens here.
        if self.diverter is not None:
            try:
                self.diverter.attach(session)  # a recovered session is attached anew
            except Exception as err:
                self._fault(err)
        if self.ledger is not None:
            self.ledger.measure_devices(session, self._local_ranks())
        steps = self.length.created(session, self.step)
        if self.controller is not None:
            self.controller.job_steps = steps

    def _local_ranks(self) -> int:
        """The job's ranks on this host (Horovod's local size; 1 without Horovod)."""
        hvd = self.consensus.hvd if self.consensus is not None else None
        try:
            return int(hvd.local_size()) if hvd is not None else 1
        except Exception:  # a rank whose Horovod cannot say counts alone
            return 1

    def before_run(self, run_context: tf.compat.v1.train.SessionRunContext) -> tf.compat.v1.train.SessionRunArgs | None:
        self.runs.reset()
        if self.shapes is not None and self.shapes.learning and self.training is not None:  # for the next processes
            self.shapes.learn(run_context.original_args, self.training.updates_variables)
        if not self.quiet and self.active and self.controller is not None and self.controller.done:
            self.quiet = True  # stitching is over: from now on no fetch, feed or decision per step (issue 29)
        if self.quiet:  # the step runs as written, only timed and counted (its cost: docs/plugin/session.md)
            if self.runs.take(run_context, self.training, None, over=True):
                self._started = time.perf_counter()
            return None
        if self._agreeing is not None:
            return self._agreement_step(run_context.original_args.fetches)
        if not self.active or not self.runs.take(run_context, self.training, self.diverter):
            return None
        self._plan = None
        try:
            self._observe(run_context.original_args.feed_dict)
            return self._before_run()
        except Exception as err:
            log.exception("stitchfleet: plugin error preparing step %d; stitching reverts", self.step)
            if self.diverter is not None:
                self.diverter.armed = False
            return self._consensus_only(err)

    def _observe(self, feed_dict: Any) -> None:
        """The step's shape signature: kernels are compiled for it when due (`signature_kernels`), in the
        background; their seconds count as setup. None once no cluster can run stitched again in this job."""
        if self.signatures is None or (self.controller is not None and self.controller.done):
            return
        booked = self.signatures.before(feed_dict, self.step)
        if booked and self.controller is not None:
            self._setup_seconds += booked
            self.controller.setup_spent(booked)

    def after_run(
        self, run_context: tf.compat.v1.train.SessionRunContext, run_values: tf.compat.v1.train.SessionRunValues
    ) -> None:
        if self.runs.in_agreement:
            self.runs.release()
            self._agreed((run_values.results or {}).get("agreement"))
            if self.controller is not None:
                # The agreement run was the job's first training step, as written (plain TF): booked as step 0
                # of the job's windows, so iterations equal steps on every rank (it was left out: 499 for 500).
                seconds = time.perf_counter() - self._started
                self.controller.step_done(StepPlan(self.step, quiet=True), StepFigures(seconds))
                self.step += 1
            return
        if not self.active or not self.runs.in_step:
            return
        seconds = time.perf_counter() - self._started
        if self.quiet and self.controller is not None:
            try:
                self.controller.quiet_step(self.step, seconds)
            except Exception as err:
                self._fault(err)
            self.step += 1
            self.runs.release()
            return
        try:
            self._after_run(run_values.results or {}, seconds)
        except Exception as err:
            self._fault(err)
        self.step += 1
        self.runs.release()

    def end(self, session: tf.compat.v1.Session) -> None:
        try:
            if self.controller is not None:
                self.controller.finish()
                if self.job_key is not None and self.ledger is not None:
                    job_verdict.record(self.ledger, self.job_key, self.controller.course, self.controller.group_proven)
            if self.shapes is not None and self.ledger is not None:
                self.shapes.finished(self.ledger, self.step, [c.kernel for c, _ in self.installed], self.signatures)
        except Exception:
            log.exception("stitchfleet: could not close the job's telemetry")
        if self.ledger is not None:
            self.ledger.close()

    # --- begin ----------------------------------------------------------------------------

    def _begin(self) -> None:
        current, graph = self.settings, tf.compat.v1.get_default_graph()
        self.training = TrainingSteps(graph)
        if not self.training.trains:
            # No op writes a trainable variable or the global step (tf.estimator's evaluate, predict): no run is a
            # training step, so its setup (seconds on a large graph, at every evaluation) would buy nothing.
            log.info("stitchfleet: no training op in this session's graph; left as written")
            return
        if twin_built_in(graph):
            # A second setup would cluster the copy itself (its twin build then failed: 'plugin setup failed'
            # at each new session, after seconds of setup). The earlier session's copy is never run here.
            log.warning("stitchfleet: this graph was stitched by an earlier session of the job; left as written")
            return
        self.consensus = Consensus(current)
        if self.consensus.hvd is not None:
            # First, what a rank whose setup fails below still joins: it then says so to the others.
            self.consensus.build(graph, SLOTS, EXTRA)
            self.agreement = Agreement(self.consensus.hvd, graph)
            self._agreeing = Agreement.vector([], ok=False)
        if self.fault is not None and self.fault.fails_setup(self.consensus.rank):
            raise RuntimeError("injected setup failure")
        self.ledger = self.ledger or self._opened(current, self.consensus)
        backend = resolve_backend(self.backend)
        if self.length.short(self, self.ledger, backend):  # too short to repay its setup: no compile, no probe
            return
        started, memory = time.perf_counter(), self.ledger.recall()
        self.job_key, lost = job_verdict.recall(graph, backend, current.gpu_type, self.consensus.size, memory)
        if self.length.known_loss(lost, self.ledger):  # the fleet found stitching lose on this graph: as written
            return
        steps = StepOps(graph)
        self.shapes = Specialisation(graph, steps, current.cache_dir, self.ledger)
        conversion, art = job_graph.compiled(steps, self.shapes, current)
        found = selection.choose(
            graph,
            conversion,
            art,
            backend=backend,
            known_bad=set(memory.reverted),
            current=current,
            fault=self.fault,
            rank=self.consensus.rank,
            agreeing=self.agreement is not None,
            slower=memory.slower,
            signature=self.shapes,
        )
        if current.translation_check and found.sites:
            found.refuse(check_sites(graph, found.sites, current.tolerance_factor, current.cache_dir))
        for kind, left in (("compile_failure", found.left), ("probe", found.slower)):  # slower: a probe saved
            for index, fingerprint, reason in left:
                self._off(index, fingerprint, reason, kind)
        sites, clusters, mapped = found.sites, found.clusters, found.mapped
        bridge = choose_bridge(current.bridge, backend, current.cache_dir)
        twin = build_twin(graph, mapped) if sites else None
        twin_sites = [twin.site(site) for site in sites] if twin is not None else []
        rewired = rewire(graph, twin_sites, [c.kernel for c in clusters], bridge)
        self._bridge, self._faults_seen = bridge, bridge.faults() if bridge is not None else 0
        self._originals = {site.index: site for site in sites}
        self._adopt(rewired, clusters)
        self.switches, self._switch_count = rewired.switches, len(self.installed)
        self._checking = rewired.checking  # fed True on check steps: ref inputs are copied (`check_reads`)
        self.loss_tensor = find_loss(graph, self.loss)
        if twin is not None:
            self.diverter = Diverter(twin, owner=self, shared=("consensus",))
            self.twin_loss = rewired.current(twin.tensor(self.loss_tensor)) if self.loss_tensor is not None else None
        self._setup_seconds = time.perf_counter() - started
        self.ledger.compiled(self._setup_seconds)
        built = found.compiles.describe(current.compile_budget)
        log.info("stitchfleet: %d cluster(s) stitched, %d left off; %s", len(self.installed), len(self.off), built)
        self._event(EventKind.SETUP.value, None, f"setup {self._setup_seconds:.2f} s", built)
        if self.agreement is None:
            self._start(list(range(len(self.installed))))
        else:  # the controller starts once every rank said what it installed (the first training run)
            self._agreeing = Agreement.vector([c.index for c, _ in self.installed], ok=True)

    def _opened(self, current: settings_module.Settings, consensus: Consensus) -> Ledger:
        """The job's telemetry, started (unless the hook was handed it: `record`)."""
        record = Ledger(current, consensus.rank, consensus.size, self.db_url)
        record.started()
        return record

    def _start(self, positions: list[int]) -> None:
        """Runs the controller over the installed clusters at `positions` (all ranks agreed on them)."""
        assert self.consensus is not None and self.ledger is not None and self.training is not None
        self.installed = [self.installed[p] for p in positions]
        clusters, timing = [c for c, _ in self.installed], Timing.from_settings(self.settings)
        self.active = bool(self.installed)
        fault = (self.fault, self.consensus.rank) if self.fault is not None else None
        if self.active and self._bridge is not None and self.shapes is not None and self.shapes.signature is not None:
            job = Job(self._bridge, self.settings, self.ledger, fault)
            self.signatures = SignatureKernels(self.shapes, self.installed, self._originals, job)
        size, spent = self.consensus.size, self._setup_seconds
        self.controller = Controller(
            clusters,
            timing,
            self.ledger,
            size,
            spent,
            kernels=self.signatures.probes if self.signatures else None,
            job_steps=self.length.steps,
        )
        self.consensus.clusters = len(self.installed)
        self.training.require([self._originals[done.site.index].internal for _, done in self.installed])
        self.step_args = StepArgs(
            self.consensus,
            self.training,
            switches=self.switches,
            positions=positions,
            count=self._switch_count,
            checking=self._checking,
            installed=[done for _, done in self.installed],
            loss=self.loss_tensor,
            twin_loss=self.twin_loss,
            signatures=self.signatures,
        )
        bridge, seen = self._bridge, self._faults_seen
        self.step_results = StepResults(
            self.settings, self.consensus, self.installed, self.signatures, bridge=bridge, faults_seen=seen
        )

    def _agreement_step(self, fetches: object) -> tf.compat.v1.train.SessionRunArgs | None:
        """Horovod's first training run: every rank, its setup failed or not, says what it installed."""
        assert self.agreement is not None and self._agreeing is not None and self.training is not None
        try:
            if not self.training.updates_variables(fetches):
                return None
        except Exception:
            log.exception("stitchfleet: could not tell whether a run is a training step; left untouched")
            return None
        if not self.runs.claim(agreement=True):
            return None  # another thread's agreement run is in flight
        feeds, extra = self.agreement.args(self._agreeing)
        self._started = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(extra, feed_dict=feeds)

    def _agreed(self, summed: Any) -> None:
        """Every rank's answer: stitch the clusters all installed, or nothing when a rank's setup failed."""
        assert self.agreement is not None and self._agreeing is not None
        ok, self._agreeing = bool(self._agreeing[SLOTS]), None
        agreed = self.agreement.decide(np.asarray(summed, dtype=np.float64)) if summed is not None else None
        if not ok:
            return  # this rank's own setup failed: recorded in begin, it stays off like the others
        if agreed is None:
            log.warning("stitchfleet: stitching is off for this job: the setup of another rank failed")
            self._event("compile_failure", None, "another rank's setup failed", "every rank leaves the job to TF")
            return
        kept = [p for p, (c, _) in enumerate(self.installed) if c.index in agreed]
        for c, _ in self.installed:
            if c.index not in agreed:
                self._off(c.index, c.fingerprint, "not installed on every rank: left to TF on all of them")
        self._start(kept)

    def _adopt(self, rewired: Rewired, clusters: list[Cluster]) -> None:
        for cluster, done in zip(clusters, rewired.clusters, strict=True):
            if isinstance(done, str):
                self._off(cluster.index, cluster.fingerprint, done)
            else:
                self.installed.append((cluster, done))

    def _off(self, index: int, fingerprint: str, reason: str, kind: str = "compile_failure") -> None:
        self.off[index] = reason
        self._event(kind, fingerprint, reason.split(":", maxsplit=1)[0], reason)

    def _event(self, kind: str, fingerprint: str | None, reason: str, detail: str) -> None:
        if self.ledger is not None:
            self.ledger.event(kind, None, fingerprint, reason, detail=detail)

    # --- steps ----------------------------------------------------------------------------

    def _before_run(self) -> tf.compat.v1.train.SessionRunArgs | None:
        """Maps the controller's plan of the step onto its feeds and fetches (and the twin's diverter)."""
        assert self.controller is not None and self.consensus is not None and self.diverter is not None
        fresh = self.signatures.fresh() if self.signatures is not None else []  # kernels the guard has not judged
        plan = self._plan = self.controller.step_plan(self.step, self._failure, fresh=fresh)
        self._failure = None
        if plan.quiet:
            # Stitching is over for this job: the step runs as written (no fetch, feed or collective added:
            # plain TF), only timed and counted for the job's telemetry.
            self._started = time.perf_counter()
            return None
        assert self.step_args is not None
        self.diverter.armed = plan.on_twin  # the twin runs, or the user's own graph (`StepArgs.planned`)
        args = self.step_args.planned(plan)
        self._started = time.perf_counter()
        return args

    def _consensus_only(self, err: Exception) -> tf.compat.v1.train.SessionRunArgs | None:
        """A step whose preparation failed still takes part in the consensus (no rank may wait)."""
        if self.consensus is None or self.controller is None:
            return None
        failure, self._failure = self._failure or f"{type(err).__name__}: {err}", None
        self._plan, self._started = self.controller.step_plan(self.step, failure, prepared=False), time.perf_counter()
        if self._plan.quiet:  # stitching is over: no rank joins a consensus any more
            return None
        return self.step_args.consensus_only(self._plan) if self.step_args is not None else None

    def _after_run(self, results: dict[str, Any], seconds: float) -> None:
        """Reads what the planned step fetched and hands the controller its figures."""
        assert self.controller is not None and self.consensus is not None and self._plan is not None
        plan, fault = self._plan, None
        if plan.quiet:
            self.controller.step_done(plan, StepFigures(seconds))
            return
        if self.diverter is not None and self.diverter.armed:
            self.diverter.armed = False
            raise RuntimeError("the step did not run through the session the twin is attached to")
        if self.diverter is not None and self.diverter.failure is not None:
            failure, self.diverter.failure = self.diverter.failure, None
            log.error("stitchfleet: step %d failed on the twin and ran as written: %s", self.step, failure)
            fault = f"{type(failure).__name__}: {failure}"  # stitching reverts for the job
        assert self.step_results is not None
        self.controller.step_done(plan, self.step_results.figures(plan, results, seconds, self.step, fault))
        self.step_results.poll()

    def _fault(self, err: Exception) -> None:
        """A plugin error outside a step's figures: the controller hears of it with the next plan."""
        log.exception("stitchfleet: plugin error at step %d; stitching reverts", self.step)
        if self.controller is not None:
            self._failure = self._failure or f"{type(err).__name__}: {err}"

    # --- figures for tests and scripts ----------------------------------------------------

    @property
    def prebuild_seconds(self) -> float | None:
        """The twin's executor builds in warmup beyond usual steps, once measured (booked as setup)."""
        return self.controller.warmup.seconds if self.controller is not None else None

    @property
    def backend_calls(self) -> dict[int, int]:
        """Backend runs per cluster index (the stitched path really executing)."""
        return {c.index: c.kernel.calls for c, _ in self.installed}
