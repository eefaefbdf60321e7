"""`StitchHook`: the session hook that stitches a TF1 training graph, guards it and proves savings.

Input: the default graph at `begin`, settings, optionally the loss tensor and a test-only `Fault`. Output: the
rewired graph, the feeds and fetches each step adds (the controller's two calls per step: `step_plan`,
`step_done`), telemetry. Every entry point is guarded: the user's job never fails because of it (docs/plugin/hook.md).
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.fleet.ledger import Ledger
from stitchfleet.plugin.graph.training_steps import TrainingSteps, named_alike
from stitchfleet.plugin.graph.twin_mark import built_in as twin_built_in
from stitchfleet.plugin.horovod.decision_sums import Consensus
from stitchfleet.plugin.horovod.rank_logs import tell_on_rank_zero
from stitchfleet.plugin.horovod.setup_agreement import SLOTS, Agreement
from stitchfleet.plugin.native.backend_choice import resolve_backend
from stitchfleet.plugin.session import gc_pause, hooked_graph, job_length, job_record
from stitchfleet.plugin.session.exported_graph import setup_additions
from stitchfleet.plugin.session.holdout_windows import HoldoutWindows
from stitchfleet.plugin.session.step_threads import StepThreads
from stitchfleet.plugin.setup import job_verdict

if TYPE_CHECKING:  # what setup brings: imported when it runs (job_setup.py), never by a job that skips it
    from stitchfleet.plugin.control.cluster import Cluster
    from stitchfleet.plugin.control.controller import Controller
    from stitchfleet.plugin.graph.mapping import Site
    from stitchfleet.plugin.graph.rewrite import Installed
    from stitchfleet.plugin.graph.twin import Diverter
    from stitchfleet.plugin.native.dispatch_op import BridgeOp
    from stitchfleet.plugin.native.faults import Fault
    from stitchfleet.plugin.session.job_setup import Setup
    from stitchfleet.plugin.session.step_path import StepPath
    from stitchfleet.plugin.shapes.signature_kernels import SignatureKernels
    from stitchfleet.plugin.shapes.signatures import Specialisation

log = logging.getLogger("stitchfleet.plugin")
# The longest a setup waits for its database client (begin books it); one stuck past it opens beside the job.
CLIENT_WAIT = 30.0
QUIET_BATCH = 32  # quiet steps booked in one controller call: one per step cost ~20 us of each, cold-cached (s43)


class StitchHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """The session-facing entry points; the setup (`job_setup`), each step (`step_path`) and the telemetry
    (`job_record`) are their own modules, composed here."""

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
        self._started = self._entered = 0.0
        self._setup_seconds = 0.0
        self.setup: Setup | None = None  # what begin installed (`job_setup`), None when it skipped its setup
        self.path: StepPath | None = None  # each step's plan and figures, once the controller started
        self._bridge: BridgeOp | None = None
        self.training: TrainingSteps | None = None
        self.runs = StepThreads()  # per thread: its current run is the training step / the agreement run
        self._quiet = threading.local()  # per thread, once quiet: its training run's start (None: not a step)
        self._quiet_fetches: tuple[object, ...] = ()  # the last quiet training run's fetched objects
        self._quiet_steps: deque[tuple[int, float]] = deque()  # quiet steps timed, not yet booked: (step, seconds)
        self._booking = threading.Lock()  # one thread books the queued quiet steps at a time
        self.holdout: HoldoutWindows | None = None  # a holdout run's windows (`JobLength.held_out`): quiet throughout
        self.agreement: Agreement | None = None  # Horovod: the ranks' agreement on installed clusters
        self._agreeing: np.ndarray[Any, np.dtype[np.float64]] | None = None  # this rank's part, until agreed
        self.switches: tf.Tensor | None = None  # the graph's switch vector (clusters installed at begin)
        self.diverter: Diverter | None = None  # runs a step on the stitched twin (see twin.py)
        self._originals: dict[int, Site] = {}  # each installed cluster's site in the user's graph
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
            ranks = (self.consensus.rank, self.consensus.size) if self.consensus is not None else (0, 1)
            self.ledger = job_record.setup_failed(self.ledger, self.settings, ranks, self.db_url, err)

    def not_attached(self, reason: str) -> None:
        """Telemetry of a job whose training steps run without this hook (a session it cannot join), and why."""
        job_record.not_attached(self.ledger, self.settings, self.db_url, reason)

    def after_create_session(self, session: tf.compat.v1.Session, coord: tf.train.Coordinator) -> None:
        # Accounting needs what this rank really uses (its GPUs or CPU cores), which only the
        # created session knows; the job runs on whatever happens here.
        if self.diverter is not None and not self.quiet:
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
        entered = time.perf_counter()  # a leased step's own work starts here (`StepPath.after`)
        if not self.quiet and self.active and self.controller is not None and self.controller.done:
            self.quiet = True  # stitching is over: from now on no fetch, feed or decision per step (issue 29)
            if self.diverter is not None:
                self.diverter.detach()
        if self.quiet:  # the step runs as written, only timed and counted (its cost: docs/plugin/session.md)
            self._quiet.started = self._quiet_start(run_context)
            return None
        self._entered = entered
        if self.controller is not None:
            self.controller.step_entered()  # what the hook does from here is the plugin's own work on the step
        self.runs.reset()
        if self.shapes is not None and self.shapes.learning and self.training is not None:  # for the next processes
            self.shapes.learn(run_context.original_args, self.training.updates_variables)
        if self._agreeing is not None:
            return self._agreement_step(run_context.original_args.fetches)
        if not self.active or not self.runs.take(run_context, self.training, self.diverter):
            return None
        path = self.path
        if path is None:
            return None
        path.plan = None
        try:
            self._setup_seconds += path.observe(run_context.original_args.feed_dict, self.step)
            args = path.before(self.step)
        except Exception as err:
            log.exception("stitchfleet: plugin error preparing step %d; stitching reverts", self.step)
            if self.diverter is not None:
                self.diverter.armed = False
            args = path.consensus_only(self.step, err)
        self._started = time.perf_counter()
        return args

    def _quiet_start(self, run_context: tf.compat.v1.train.SessionRunContext) -> float | None:
        """A quiet step's start: the clock when the run updates a variable (a training step), else None. No
        thread claims it: with nothing diverted there is no step in flight to protect, and a second thread's
        training run is a training step too (both are counted)."""
        try:
            args = run_context.original_args
            items = args.fetches if type(args.fetches) in (list, tuple) else (args.fetches,)
            known = self._quiet_fetches  # a training run's own objects: the same ones are a training step again
            if known and len(items) == len(known) and all(map(operator.is_, items, known)):  # 9 us a step less (s45)
                return time.perf_counter()
            if self.shapes is not None and self.shapes.learning and self.training is not None:
                self.shapes.learn(args, self.training.updates_variables)  # for the job's next processes
            if self.training is not None and self.training.updates_variables(args.fetches):
                # never a list or a dict (their contents change), nor a run still to learn shapes from
                if all(map(named_alike, items)) and (self.shapes is None or not self.shapes.learning):
                    self._quiet_fetches = tuple(items)
                return time.perf_counter()
        except Exception:
            log.exception("stitchfleet: could not tell whether a run is a training step; left untouched")
        return None

    def after_run(
        self, run_context: tf.compat.v1.train.SessionRunContext, run_values: tf.compat.v1.train.SessionRunValues
    ) -> None:
        arrived = time.perf_counter()  # the step's run ended: from here the hook's work is the plugin's own again
        # getattr: a thread whose before_run ran before another thread turned the job quiet never set it
        started = getattr(self._quiet, "started", None) if self.quiet else None
        if started is not None:  # a quiet training step: queued, booked with the next batch (`_book_quiet`)
            self._quiet.started = None
            self._quiet_steps.append((self.step, arrived - started))  # the step's run: a stitched window's span
            self.step += 1
            if len(self._quiet_steps) >= QUIET_BATCH:
                self._book_quiet()
            return
        if self.quiet:
            return
        if self.runs.in_agreement:
            self.runs.release()
            self._agreed((run_values.results or {}).get("agreement"))
            if self.path is not None:
                self.path.agreed_step(self.step, time.perf_counter() - self._started)
                self.step += 1
            return
        if not self.active or not self.runs.in_step:
            return
        seconds = arrived - self._started
        try:
            if self.path is not None:
                self.path.after(run_values.results or {}, seconds, self.step, self._started - self._entered, arrived)
        except Exception as err:
            self._fault(err)
        self.step += 1
        self.runs.release()
        if self.path is not None:
            self.path.left()  # the hook's work after the step's booking: charged with the next step

    def _book_quiet(self, wait: bool = False) -> None:
        """Books the queued quiet steps in one controller call (a holdout's: its windows'); one thread at a time (the
        next batch takes the rest, or, at `end`, which `wait`s for the lock, the final call: a step queued meanwhile is
        still booked)."""
        if not self._booking.acquire(blocking=wait):
            return
        try:
            queued = self._quiet_steps
            steps = [queued.popleft() for _ in range(len(queued))]  # only this thread pops: never empty midway
            booker = self.controller if self.controller is not None else self.holdout
            if steps and booker is not None:
                booker.quiet_steps(steps)
        except Exception as err:
            self._fault(err)
        finally:
            self._booking.release()

    def end(self, session: tf.compat.v1.Session) -> None:
        try:
            self._book_quiet(wait=True)  # the quiet steps still queued are the job's too, even while a batch books
            if self.holdout is not None:
                self.holdout.finish()  # its last window, before the ledger closes
            if self.path is not None:
                self.path.settle()  # the leased steps that ran are the job's too
            kernels = [c.kernel for c, _ in self.installed]
            job_record.closed(
                self.ledger, self.controller, self.job_key, self.shapes, (self.step, kernels, self.signatures)
            )
            if self.setup is not None and self.controller is not None and self.consensus is not None:
                done = self.setup
                job_record.remembered(
                    self.settings,
                    self.controller,
                    self.consensus.size,
                    (done.recorded, done.backend, done.warm, done.cold_seconds),
                )
        finally:
            gc_pause.thawed()  # the heap begin froze goes back to the collector (gc_pause.py)

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
        tell_on_rank_zero(log, self.consensus.rank)  # every rank takes the same decisions: rank 0 tells them
        if self.consensus.hvd is not None:
            # The controller's slots, only for a Horovod job: it imports the compiler's IR (a skipped job must not).
            from stitchfleet.plugin.control.controller import EXTRA

            # First, what a rank whose setup fails below still joins: it then says so to the others.
            self.consensus.build(graph, SLOTS, EXTRA)
            self.agreement = Agreement(self.consensus.hvd, graph)
            self._agreeing = Agreement.vector([], ok=False)
        if self.fault is not None and self.fault.fails_setup(self.consensus.rank):
            raise RuntimeError("injected setup failure")
        self.ledger = self.ledger or job_record.opened(current, self.consensus.rank, self.consensus.size, self.db_url)
        backend = resolve_backend(self.backend)
        if self.length.short(self, self.ledger, backend, self.consensus.size):  # no compile, no probe
            if self.length.held_out:  # as written, timed from its first step as a quiet step is (docs/plugin/setup.md)
                self.holdout, self.quiet = HoldoutWindows(self.ledger, current.window_steps), True
            return
        recalling = time.perf_counter()  # the setup's seconds count from here (the fleet's memory included)
        memory = self.ledger.recall()
        self.job_key, lost = job_verdict.recall(graph, backend, current.gpu_type, self.consensus.size, memory)
        if self.length.known_loss(lost, self.ledger):  # the fleet found stitching lose on this graph: as written
            return
        # The database client opens beside the setup, whose seconds then hold it (its imports, a fresh database's
        # schema: 0.9 s on BERT's cold run). Opened beside TF's session creation instead, its Python held the GIL
        # against TF's many short C calls there (Scaffold.finalize 0.88 s against 0.32 s) and cost the session's
        # creation 0.6 s more than it did itself, unbooked (session 41).
        self.ledger.open_later()
        # Only now the compiler and the graph rewrite: a job that skipped its setup above never imports them.
        from stitchfleet.plugin.session.job_setup import JobSetup

        setup = JobSetup(graph, current, backend, self.ledger, (memory, recalling))
        self.shapes = setup.specialise()
        rank, agreeing = self.consensus.rank, self.agreement is not None
        done = setup.run(
            self.shapes, self._off, loss=self.loss, fault=self.fault, rank=rank, agreeing=agreeing, owner=self
        )
        self.setup, self._bridge, self._originals = done, done.bridge, done.originals
        self.installed, self.switches, self.diverter = list(done.installed), done.switches, done.diverter
        self.ledger.opened(CLIENT_WAIT)  # booked in the setup's seconds, not left to the session's creation
        self._setup_seconds = setup.seconds()
        job_record.set_up(self.ledger, self._setup_seconds, len(self.installed), len(self.off), done.built)
        if self.agreement is None:
            self._start(list(range(len(self.installed))))
        else:  # the controller starts once every rank said what it installed (the first training run)
            self._agreeing = Agreement.vector([c.index for c, _ in self.installed], ok=True)

    def _start(self, positions: list[int]) -> None:
        """Runs the controller over the installed clusters at `positions` (all ranks agreed on them)."""
        assert self.consensus is not None and self.ledger is not None and self.training is not None
        assert self.setup is not None
        self.installed = [self.installed[p] for p in positions]
        self.active = bool(self.installed)
        fault = (self.fault, self.consensus.rank) if self.fault is not None else None
        self.path = self.setup.started(
            self.installed,
            positions,
            current=self.settings,
            consensus=self.consensus,
            ledger=self.ledger,
            training=self.training,
            spent=self._setup_seconds,
            job_steps=self.length.steps,
            fault=fault,
        )
        self.controller, self.signatures = self.path.controller, self.path.signatures

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
        """Every rank's answer: the clusters all installed, or none where a rank failed or skipped its setup."""
        assert self.agreement is not None and self._agreeing is not None
        ok, self._agreeing = bool(self._agreeing[SLOTS]), None
        agreed = self.agreement.decide(np.asarray(summed, dtype=np.float64)) if summed is not None else None
        if not ok:
            return  # this rank's own setup failed or was skipped (recorded in begin): off like the others
        if agreed is None:
            log.warning("stitchfleet: stitching is off for this job: another rank did not set up (failed or skipped)")
            why = "another rank did not set up"
            job_record.event(self.ledger, "compile_failure", None, why, "every rank leaves the job to TF")
            return
        kept = [p for p, (c, _) in enumerate(self.installed) if c.index in agreed]
        for c, _ in self.installed:
            if c.index not in agreed:
                log.info("stitchfleet: cluster %d left to TF: another rank did not install it", c.index)
                self._off(c.index, c.fingerprint, "not installed on every rank: left to TF on all of them")
        self._start(kept)

    def _off(self, index: int, fingerprint: str, reason: str, kind: str = "compile_failure") -> None:
        self.off[index] = reason
        job_record.event(self.ledger, kind, fingerprint, reason.split(":", maxsplit=1)[0], reason)

    def _fault(self, err: Exception) -> None:
        """A plugin error outside a step's figures: the controller hears of it with the next plan."""
        log.exception("stitchfleet: plugin error at step %d; stitching reverts", self.step)
        if self.path is not None:
            self.path.fault(err)

    # --- figures for tests and scripts ----------------------------------------------------

    @property
    def prebuild_seconds(self) -> float | None:
        """The twin's executor builds in warmup beyond usual steps, once measured (booked as setup)."""
        return self.controller.warmup.seconds if self.controller is not None else None

    @property
    def backend_calls(self) -> dict[int, int]:
        """Backend runs per cluster index (the stitched path really executing)."""
        return {c.index: c.kernel.calls for c, _ in self.installed}
