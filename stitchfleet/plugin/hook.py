"""`StitchHook`: the session hook that stitches a TF1 training graph, guards it and proves savings.

Input: the default graph when the session is created (`begin`, before it is finalized),
settings (backend, timing, guard, job identity, database) and, optionally, the loss
tensor and a test-only `Fault`. Output: the rewired graph (see `rewrite`), the switch
vector, consensus vector and check fetches added to each step, telemetry rows and metrics.
Per training step the hook makes two controller calls (step_contract): `step_plan` before
it, whose plan it maps onto the step's feeds, fetches and the twin's diverter, and
`step_done` after it, with the step's time, loss, the guard's findings and the summed
consensus; it keeps TF plumbing only and writes no controller state. Every entry point is
guarded: an error in `begin` leaves the graph's stitching off (nothing of a failed cluster
is rerouted) and records why; an error in a step reverts stitching for the job at the next
decision. The user's job never fails because of this hook.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin import candidates, collector, job_graph
from stitchfleet.plugin.agreement import SLOTS, Agreement
from stitchfleet.plugin.bridge_op import choose as choose_bridge
from stitchfleet.plugin.consensus import Consensus
from stitchfleet.plugin.controller import EXTRA, Cluster, Controller
from stitchfleet.plugin.exported_graph import setup_additions
from stitchfleet.plugin.faults import Fault
from stitchfleet.plugin.guard import Finding, judge
from stitchfleet.plugin.kernels import poll_faults, resolve_backend
from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.rewrite import Installed, Rewired, rewire
from stitchfleet.plugin.schedule import Timing
from stitchfleet.plugin.signature_kernels import Job, SignatureKernels
from stitchfleet.plugin.signatures import Specialisation
from stitchfleet.plugin.sites import Site, StepOps
from stitchfleet.plugin.step_contract import StepFigures, StepPlan
from stitchfleet.plugin.step_threads import StepThreads
from stitchfleet.plugin.training_steps import TrainingSteps, find_loss
from stitchfleet.plugin.translation import check_sites
from stitchfleet.plugin.twin import Diverter
from stitchfleet.plugin.twin import build as build_twin
from stitchfleet.plugin.twin import built_in as twin_built_in
from stitchfleet.telemetry.kinds import EventKind

log = logging.getLogger("stitchfleet.plugin")


class StitchHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    def __init__(
        self,
        settings: settings_module.Settings | None = None,
        *,
        backend: str | None = None,
        loss: Any = None,
        fault: Fault | None = None,
        db_url: str | None = None,
    ) -> None:
        self.settings = settings or settings_module.current()
        self.backend = backend or self.settings.backend
        self.loss, self.fault, self.db_url = loss, fault, db_url
        self.active, self.step = False, 0
        self.off: dict[int, str] = {}
        self.installed: list[tuple[Cluster, Installed]] = []
        self.controller: Controller | None = None
        self.ledger: Ledger | None = None
        self.consensus: Consensus | None = None
        self._started = 0.0
        self._plan: StepPlan | None = None  # the controller's plan of the current step
        self._failure: str | None = None  # a plugin error the controller hears of with the next plan
        self._check_fetches: list[Any] = []
        self._setup_seconds, self._faults_seen = 0.0, 0
        self._bridge: Any = None
        self.training: TrainingSteps | None = None
        self.runs = StepThreads()  # per thread: its current run is the training step / the agreement run
        self.agreement: Agreement | None = None  # Horovod: the ranks' agreement on installed clusters
        self._agreeing: np.ndarray[Any, np.dtype[np.float64]] | None = None  # this rank's part, until agreed
        self._switch_count = 0  # length of the graph's switch vector (clusters installed at begin)
        self._positions: list[int] = []  # each controller cluster's place in that vector
        self.diverter: Diverter | None = None  # runs a step on the stitched twin (see twin.py)
        self._originals: dict[int, Site] = {}  # each installed cluster's site in the user's graph
        self.loss_tensor, self.twin_loss = None, None  # the loss in the user's graph, and its value on the twin
        self.shapes: Specialisation | None = None  # the shape signature begin specialised to, if any
        self.signatures: SignatureKernels | None = None  # kernels per signature fed (a graph with None dims)

    # --- SessionRunHook -------------------------------------------------------------------

    def begin(self) -> None:
        try:
            # What begin adds goes at the graph's top level and stays out of its exports (exported_graph.py).
            with collector.paused(), setup_additions(tf.compat.v1.get_default_graph()):  # collector.py: why paused
                self._begin()
        except Exception as err:  # never fail the job: stitching stays off
            log.exception("stitchfleet: stitching is off for this job")
            self.active = False
            self._event("compile_failure", None, f"plugin setup failed: {type(err).__name__}", str(err))

    def after_create_session(self, session: Any, coord: Any) -> None:
        # Accounting needs what this rank really uses (its GPUs or CPU cores), which only the
        # created session knows; the job runs on whatever happens here.
        if self.diverter is not None:
            try:
                self.diverter.attach(session)  # a recovered session is attached anew
            except Exception as err:
                self._fault(err)
        if self.ledger is not None:
            self.ledger.measure_devices(session)

    def before_run(self, run_context: Any) -> Any:
        self.runs.reset()
        if self.shapes is not None and self.training is not None:  # the book, for the job's next processes
            self.shapes.learn(run_context.original_args, self.training.updates_variables)
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

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self.runs.in_agreement:
            self.runs.release()
            self._agreed((run_values.results or {}).get("agreement"))
            return
        if not self.active or not self.runs.in_step:
            return
        seconds = time.perf_counter() - self._started
        try:
            self._after_run(run_values.results or {}, seconds)
        except Exception as err:
            self._fault(err)
        self.step += 1
        self.runs.release()

    def end(self, session: Any) -> None:
        try:
            if self.controller is not None:
                self.controller.finish()
            if self.shapes is not None and self.ledger is not None:
                self.shapes.finished(self.ledger, self.step, [c.kernel for c, _ in self.installed], self.signatures)
        except Exception:
            log.exception("stitchfleet: could not close the job's telemetry")
        if self.ledger is not None:
            self.ledger.close()

    # --- begin ----------------------------------------------------------------------------

    def _begin(self) -> None:
        current = self.settings
        graph = tf.compat.v1.get_default_graph()
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
        self.ledger = Ledger(current, self.consensus.rank, self.consensus.size, self.db_url)
        self.ledger.started()
        started = time.perf_counter()
        steps = StepOps(graph)
        self.shapes = Specialisation(graph, steps, current.cache_dir, self.ledger)
        conversion, art = job_graph.compiled(steps, self.shapes, current)
        backend = resolve_backend(self.backend)
        memory = self.ledger.recall()
        found = candidates.choose(
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

    def _start(self, positions: list[int]) -> None:
        """Runs the controller over the installed clusters at `positions` (all ranks agreed on them)."""
        assert self.consensus is not None and self.ledger is not None and self.training is not None
        self._positions = positions
        self.installed = [self.installed[p] for p in positions]
        clusters, timing = [c for c, _ in self.installed], Timing.from_settings(self.settings)
        self.active = bool(self.installed)
        fault = (self.fault, self.consensus.rank) if self.fault is not None else None
        if self.active and self._bridge is not None and self.shapes is not None and self.shapes.signature is not None:
            job = Job(self._bridge, self.settings, self.ledger, fault)
            self.signatures = SignatureKernels(self.shapes, self.installed, self._originals, job)
        size, spent = self.consensus.size, self._setup_seconds
        self.controller = Controller(clusters, timing, self.ledger, size, spent, kernels=self.signatures)
        self.consensus.clusters = len(self.installed)
        self.training.require([self._originals[done.site.index].internal for _, done in self.installed])
        self._check_fetches = [(done.inputs, done.original, done.switched) for _, done in self.installed]

    def _agreement_step(self, fetches: Any) -> Any:
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

    def _before_run(self) -> Any:
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
        feeds, fetches = self.consensus.args(plan.local)
        # Every switch off: the user's own graph runs, exactly plain TF. Otherwise the twin runs (the plan
        # says which, the same on every rank, so Horovod ranks name the same collectives at every step).
        self.diverter.armed = plan.on_twin
        if plan.on_twin:
            switches = np.zeros(self._switch_count, dtype=bool)
            switches[self._positions] = plan.switches
            feeds[self.switches] = switches
        loss = self.twin_loss if plan.on_twin else self.loss_tensor
        reached = self.training.reached if self.training is not None else frozenset()
        if loss is not None and self.loss_tensor.op.name in reached:
            fetches["loss"] = loss  # only a loss the step computes anyway (no feed it lacks)
        if self.signatures is not None and self.signatures.reading:
            fetches["shapes"] = self.signatures.shapes.fetches  # the shapes the step's iterator reads have
        if plan.checks:
            # Every cluster's tensors, although only those switched on are judged: one fetch signature
            # for all check steps. A signature per probed cluster cost a new TF executor each (graph
            # pruning and grappler, ~300 ms on the demo model) the first time it ran.
            fetches["checks"] = self._check_fetches
        self._started = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds)

    def _consensus_only(self, err: Exception) -> Any:
        """A step whose preparation failed still takes part in the consensus (no rank may wait)."""
        if self.consensus is None or self.controller is None:
            return None
        failure, self._failure = self._failure or f"{type(err).__name__}: {err}", None
        self._plan, self._started = self.controller.step_plan(self.step, failure, prepared=False), time.perf_counter()
        if self._plan.quiet:  # stitching is over: no rank joins a consensus any more
            return None
        feeds, fetches = self.consensus.args(self._plan.local)
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds) if fetches else None

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
        if self.signatures is not None:  # with an iterator among the sources, the step's signature is known now
            self.signatures.after(results.get("shapes"), self.step)
        loss, checks = results.get("loss"), results.get("checks", ())
        findings = tuple((k, self._judge(k, *checks[k])) for k in plan.judged) if checks else ()
        if self.signatures is not None:  # a bound signature's faulty kernel is unbound alone when it is safe
            findings = self.signatures.screen(findings, self.step)
        summed = self.consensus.result(plan.local, results)
        measured = self.signatures.measured(plan.switches) if self.signatures is not None else ("", (), "")  # probes'
        figures = StepFigures(seconds, None if loss is None else float(loss), findings, summed, fault, *measured)
        self.controller.step_done(plan, figures)
        # The native op counts faults while a step runs: read them now, for the next step's figures.
        self._faults_seen = poll_faults(self._bridge, self._faults_seen, [c.kernel for c, _ in self.installed])

    def _judge(self, k: int, inputs: Any, original: Any, stitched: Any) -> Finding:
        """The guard's finding on the kernel that ran for this step's signature (`signature_kernels.graph`)."""
        cluster, done = self.installed[k]
        graph = self.signatures.graph(cluster.index) if self.signatures is not None else None
        return judge(graph or done.site.graph, inputs, original, stitched, self.settings.tolerance_factor)

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
