"""`StitchHook`: the session hook that stitches a TF1 training graph, guards it and proves savings.

Input: the default graph when the session is created (`begin`, before it is finalized),
settings (backend, timing, guard, job identity, database) and, optionally, the loss
tensor and a test-only `Fault`. Output: the rewired graph (see `rewrite`), the switch
vector and check fetches added to each step, telemetry rows and metrics. Every entry
point is guarded: an error in `begin` leaves the graph's stitching off (nothing of a
failed cluster is rerouted) and records why; an error in a step reverts stitching for
the job at the next decision. The user's job never fails because of this hook.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.plugin import candidates, rank_devices
from stitchfleet.plugin.agreement import SLOTS, Agreement
from stitchfleet.plugin.bridge_op import choose as choose_bridge
from stitchfleet.plugin.consensus import Consensus
from stitchfleet.plugin.controller import EXTRA, Cluster, Controller
from stitchfleet.plugin.faults import Fault
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.guard import judge
from stitchfleet.plugin.kernels import resolve_backend
from stitchfleet.plugin.ledger import Ledger
from stitchfleet.plugin.rewrite import Installed, Rewired, rewire
from stitchfleet.plugin.schedule import PROBE, REFERENCE, STITCHED, Timing
from stitchfleet.plugin.sites import Site, StepOps
from stitchfleet.plugin.training_steps import TrainingSteps, find_loss
from stitchfleet.plugin.translation import check_sites
from stitchfleet.plugin.twin import Diverter
from stitchfleet.plugin.twin import build as build_twin
from stitchfleet.plugin.warmup import ExecutorWarmup

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
        self.active = False
        self.step = 0
        self.off: dict[int, str] = {}
        self.installed: list[tuple[Cluster, Installed]] = []
        self.controller: Controller | None = None
        self.ledger: Ledger | None = None
        self.consensus: Consensus | None = None
        self._started = 0.0
        self._checking = False
        self._judged: list[int] = []
        self._check_fetches: list[Any] = []
        self._setup_seconds = 0.0
        self.prebuild_seconds: float | None = None  # the twin's executor builds in warmup, once measured
        self.warmup = ExecutorWarmup(0)
        self._local = np.zeros(0)
        self._bridge: Any = None
        self._faults_seen = 0
        self.training: TrainingSteps | None = None
        self._in_step = False  # the current run is a training step (before_run said so)
        self.agreement: Agreement | None = None  # Horovod: the ranks' agreement on installed clusters
        self._agreeing: np.ndarray[Any, np.dtype[np.float64]] | None = None  # this rank's part, until agreed
        self._in_agreement = False
        self._quiet = False  # this step runs untouched: stitching is over for the job (Controller.done)
        self._switch_count = 0  # length of the graph's switch vector (clusters installed at begin)
        self._positions: list[int] = []  # each controller cluster's place in that vector
        self.diverter: Diverter | None = None  # runs a step on the stitched twin (see twin.py)
        self._originals: dict[int, Site] = {}  # each installed cluster's site in the user's graph
        self.loss_tensor: Any = None  # the loss in the user's graph, and its value on the twin
        self.twin_loss: Any = None

    # --- SessionRunHook -------------------------------------------------------------------

    def begin(self) -> None:
        try:
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
        if self.ledger is None:
            return
        try:
            found = rank_devices.measure(session)
            self.ledger.measured(found.kind, found.count)
        except Exception as err:
            log.warning("stitchfleet: could not measure this rank's devices: %s", err)

    def before_run(self, run_context: Any) -> Any:
        self._in_step = self._in_agreement = self._quiet = False
        if self._agreeing is not None:
            return self._agreement_step(run_context.original_args.fetches)
        if not self.active or not self._is_step(run_context):
            return None
        self._in_step = True
        if self.controller is not None and self.controller.done:
            # Stitching is over for this job: the step runs as written (no fetch, feed or collective added:
            # plain TF), only timed and counted for the job's telemetry.
            self._quiet, self._started = True, time.perf_counter()
            return None
        try:
            return self._before_run(run_context.session)
        except Exception as err:
            self._fault(err)
            if self.diverter is not None:
                self.diverter.armed = False
            return self._consensus_only()

    def _is_step(self, run_context: Any) -> bool:
        """Only training steps are touched (training_steps: its rule); any other run is left as written, and
        so is one the twin cannot take (another session, a feed into what the twin computes)."""
        try:
            args = run_context.original_args
            if self.training is None or not self.training.is_training(args.fetches):
                return False
            return self.diverter is not None and self.diverter.diverts(run_context.session, args.feed_dict)
        except Exception:
            log.exception("stitchfleet: could not tell whether a run is a training step; left untouched")
            return False

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._in_agreement:
            self._agreed((run_values.results or {}).get("agreement"))
            return
        if not self.active or not self._in_step:
            return
        if self._quiet:
            self._quiet = False
            self._quiet_step(time.perf_counter() - self._started)
            return
        try:
            if self.diverter is not None and self.diverter.armed:
                self.diverter.armed = False
                raise RuntimeError("the step did not run through the session the twin is attached to")
            if self.diverter is not None and self.diverter.failure is not None:
                failure, self.diverter.failure = self.diverter.failure, None
                self._fault(failure)  # the step ran again as written; stitching reverts for the job
            self._after_run(run_values.results or {})
        except Exception as err:
            self._fault(err)
        self.step += 1

    def end(self, session: Any) -> None:
        try:
            if self.controller is not None:
                self.controller.finish()
        except Exception:
            log.exception("stitchfleet: could not close the job's telemetry")
        if self.ledger is not None:
            self.ledger.close()

    # --- begin ----------------------------------------------------------------------------

    def _begin(self) -> None:
        current = self.settings
        graph = tf.compat.v1.get_default_graph()
        self.consensus = Consensus(current)
        self.training = TrainingSteps(graph)
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
        conversion = convert(StepOps(graph), name=current.job_name or "graph")
        dump = Path(current.dump_dir) if current.dump_dir else None
        options = Options(remote_budget=current.remote_stitch_budget, dump_dir=dump, baselines=("per_op",))
        art = compile_graph(conversion.graph, options)
        assert art.report is not None
        backend = resolve_backend(self.backend)
        known_bad = self.ledger.reverted()
        rank, agreeing = self.consensus.rank, self.agreement is not None
        found = candidates.choose(
            graph,
            conversion,
            art,
            backend=backend,
            known_bad=known_bad,
            current=current,
            fault=self.fault,
            rank=rank,
            agreeing=agreeing,
        )
        for index, fingerprint, reason in found.left:
            self._off(index, fingerprint, reason)
        sites, clusters, mapped = found.sites, found.clusters, found.mapped
        if current.translation_check and sites:
            refused = check_sites(graph, sites, current.tolerance_factor, current.cache_dir)
            for site, cluster in zip(sites, clusters, strict=True):
                if site.index in refused:
                    self._off(cluster.index, cluster.fingerprint, refused[site.index])
            kept = [k for k, site in enumerate(sites) if site.index not in refused]
            sites, clusters = [sites[k] for k in kept], [clusters[k] for k in kept]
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
        log.info("stitchfleet: %d cluster(s) stitched, %d left off", len(self.installed), len(self.off))
        if self.agreement is None:
            self._start(list(range(len(self.installed))))
        else:  # the controller starts once every rank said what it installed (the first training run)
            self._agreeing = Agreement.vector([c.index for c, _ in self.installed], ok=True)

    def _start(self, positions: list[int]) -> None:
        """Runs the controller over the installed clusters at `positions` (all ranks agreed on them)."""
        assert self.consensus is not None and self.ledger is not None and self.training is not None
        self._positions = positions
        self.installed = [self.installed[p] for p in positions]
        self.controller = Controller(
            [c for c, _ in self.installed], Timing.from_settings(self.settings), self.ledger, self.consensus.size
        )
        self.warmup = ExecutorWarmup(self.controller.timing.warmup_steps)
        self.controller.pending.update(
            {k: "reverted by an earlier job" for k, (c, _) in enumerate(self.installed) if not c.enabled}
        )
        self.consensus.clusters = len(self.installed)
        self.training.require([self._originals[done.site.index].internal for _, done in self.installed])
        self._check_fetches = [(done.inputs, done.original, done.switched) for _, done in self.installed]
        self.active = bool(self.installed)

    def _agreement_step(self, fetches: Any) -> Any:
        """Horovod's first training run: every rank, its setup failed or not, says what it installed."""
        assert self.agreement is not None and self._agreeing is not None and self.training is not None
        try:
            if not self.training.updates_variables(fetches):
                return None
        except Exception:
            log.exception("stitchfleet: could not tell whether a run is a training step; left untouched")
            return None
        self._in_agreement = True
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

    def _off(self, index: int, fingerprint: str, reason: str) -> None:
        self.off[index] = reason
        self._event("compile_failure", fingerprint, reason.split(":", maxsplit=1)[0], reason)

    def _event(self, kind: str, fingerprint: str | None, reason: str, detail: str) -> None:
        if self.ledger is not None:
            self.ledger.event(kind, None, fingerprint, reason, detail=detail)

    # --- steps ----------------------------------------------------------------------------

    def _before_run(self, session: Any) -> Any:
        assert self.controller is not None and self.consensus is not None and self.diverter is not None
        controller = self.controller
        self._poll_faults()
        self._local = controller.local(self.step)
        feeds, fetches = self.consensus.args(self._local)
        switches = np.zeros(self._switch_count, dtype=bool)
        switches[self._positions] = controller.switches(self.step)
        # Every switch off: the user's own graph runs, exactly plain TF. Otherwise the twin runs; the
        # choice depends on the consensus-driven switches and the step number only, so Horovod ranks
        # take the same path (and name the same collectives) at every step.
        on_twin = bool(switches.any()) or self.step in self.warmup.builds
        self.diverter.armed = on_twin
        if on_twin:
            feeds[self.switches] = switches
        loss = self.twin_loss if on_twin else self.loss_tensor
        reached = self.training.reached if self.training is not None else frozenset()
        if loss is not None and self.loss_tensor.op.name in reached:
            fetches["loss"] = loss  # only a loss the step computes anyway (no feed it lacks)
        # Only clusters switched on are judged, so a check step is always a twin step.
        self._judged = controller.judged(self.step)
        controller.count_checks(self._judged, self.step)
        self._checking = bool(self._judged)
        if self._checking or self.step == self.warmup.checks:  # the latter judged by nobody: see ExecutorWarmup
            # Every cluster's tensors, although only those switched on are judged: one fetch signature
            # for all check steps. A signature per probed cluster cost a new TF executor each (graph
            # pruning and grappler, ~300 ms on the demo model) the first time it ran.
            fetches["checks"] = self._check_fetches
        self._started = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds)

    def _poll_faults(self) -> None:
        """Flags the clusters whose native op found NaN/Inf where TF's ops were finite (one read per step;
        the per-cluster counts only when the process-wide count moved)."""
        if self._bridge is None or self._bridge.faults() == self._faults_seen:
            return
        self._faults_seen = self._bridge.faults()
        for cluster, _ in self.installed:
            faulted = getattr(cluster.kernel, "faulted", None)
            if faulted is not None and faulted() > 0:
                cluster.kernel.flag("non-finite stitched output (native bridge: TF's own ops were finite)")

    def _consensus_only(self) -> Any:
        """A step whose preparation failed still takes part in the consensus (no rank may wait)."""
        if self.consensus is None or self.controller is None or self.consensus.summed is None:
            return None
        self._local = np.zeros(self.controller.length)
        self._local[len(self.controller.clusters)] = 1.0
        feeds, fetches = self.consensus.args(self._local)
        self._checking = False
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feeds)

    def _after_run(self, results: dict[str, Any]) -> None:
        assert self.controller is not None and self.consensus is not None
        seconds = time.perf_counter() - self._started
        controller = self.controller
        controller.timed(self.step, seconds, self._checking)
        if self.warmup.timed(self.step, seconds) and self.ledger is not None:
            self.prebuild_seconds = self.warmup.seconds
            self.ledger.compiled(self._setup_seconds + (self.prebuild_seconds or 0.0))
        loss = results.get("loss")
        stitched = controller.mode(self.step) in (STITCHED, PROBE, REFERENCE)
        if loss is not None and not math.isfinite(float(loss)) and stitched:
            controller.loss_bad = True
        checks = results.get("checks", ())
        for k in self._judged if checks else ():
            inputs, original, stitched = checks[k]
            _, done = self.installed[k]
            finding = judge(done.site.graph, inputs, original, stitched, self.settings.tolerance_factor)
            controller.checked(self.step, k, finding)
        controller.decide(self.step, self.consensus.result(self._local, results))

    def _quiet_step(self, seconds: float) -> None:
        try:
            assert self.controller is not None
            self.controller.timed(self.step, seconds, False)
        except Exception:
            log.exception("stitchfleet: could not book step %d", self.step)
        self.step += 1

    def _fault(self, err: Exception) -> None:
        log.exception("stitchfleet: plugin error at step %d; stitching reverts", self.step)
        if self.controller is not None:
            self.controller.fault = self.controller.fault or f"{type(err).__name__}: {err}"

    # --- figures for tests and scripts ----------------------------------------------------

    @property
    def backend_calls(self) -> dict[int, int]:
        """Backend runs per cluster index (the stitched path really executing)."""
        return {c.index: c.kernel.calls for c, _ in self.installed}
