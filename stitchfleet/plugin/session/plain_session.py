"""Plain `tf.compat.v1.Session` jobs under auto-attach: their training steps get a StitchHook too.

Input: The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from stitchfleet.plugin.session import hooked_graph
from stitchfleet.telemetry.kinds import EventKind

if TYPE_CHECKING:
    import tensorflow as tf

    from stitchfleet.plugin.fleet.ledger import Ledger
    from stitchfleet.plugin.graph.training_steps import TrainingSteps
    from stitchfleet.plugin.session.hook import StitchHook
    from stitchfleet.plugin.setup.payback import Deferral

log = logging.getLogger("stitchfleet.plugin")
TARGET = "tensorflow.python.client.session"
PATCHED = "_stitchfleet_patched"
STATE = "_stitchfleet_plain"  # on a Session: its PlainRunner, its Waiting, or the reason it runs as written
Run = Callable[..., Any]


class PlainRunner:
    """One plain session's runs through its StitchHook: the hook's fetches and feeds join the caller's run,
    as `MonitoredSession`'s hooked session joins them (same keys, so the hook's twin diverter sees them)."""

    def __init__(self, session: tf.compat.v1.Session, hook: StitchHook, inner: Run) -> None:
        self.session, self.hook, self.inner = session, hook, inner
        self.ended = False

    def run(
        self,
        fetches: object,
        feed_dict: dict[object, object] | None = None,
        options: tf.compat.v1.RunOptions | None = None,
        run_metadata: tf.compat.v1.RunMetadata | None = None,
    ) -> object:
        import tensorflow as tf

        hooks = tf.compat.v1.train
        context = hooks.SessionRunContext(hooks.SessionRunArgs(fetches, feed_dict), self.session)
        extra = self.hook.before_run(context)
        if extra is None:  # the run as written; the hook still hears of it, as MonitoredSession's hooks do
            returned = self.inner(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
            self.hook.after_run(context, hooks.SessionRunValues(None, options, run_metadata))
            return returned
        feeds = dict(feed_dict or {})
        for key, value in (extra.feed_dict or {}).items():
            if key in feeds:
                raise RuntimeError("Same tensor is fed by a SessionRunHook and user.")
            feeds[key] = value
        joined = {"caller": fetches, self.hook: extra.fetches}
        outputs: dict[object, object] = self.inner(joined, feed_dict=feeds, options=options, run_metadata=run_metadata)
        self.hook.after_run(context, hooks.SessionRunValues(outputs[self.hook], options, run_metadata))
        return outputs["caller"]

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.hook.end(self.session)


class Waiting:
    """A session whose job's length is unknown, training as written until its setup is due (`payback.Deferral`).
    Light on purpose: the hook and the compiler are imported only once it is due (0.24 s of CPU on a job that may
    end before), and its telemetry (`record`) goes to the spool meanwhile (no database client: 0.3-0.4 s); the
    record passes to the hook, whose setup opens the client."""

    def __init__(self, deferral: Deferral, steps: TrainingSteps, record: Ledger | None) -> None:
        self.deferral, self.steps, self.record = deferral, steps, record
        self.since = time.perf_counter()  # the job's first training run
        self.trained = 1  # training runs so far, that first one included
        self.ended = False
        why = deferral.waiting()
        log.info("stitchfleet: setup deferred: %s", why)
        if record is not None:
            record.event(EventKind.SETUP.value, None, None, "setup deferred", detail=why)
            record.spool_meanwhile()  # the database client opens only if the setup comes (`Ledger.compiled`)

    def due(self, fetches: object) -> bool:
        """Counts a training run; True when this one is the first past the deferral (it begins the hook)."""
        if not self.steps.trains_in(fetches):
            return False
        self.trained += 1
        return time.perf_counter() - self.since >= self.deferral.seconds

    def end(self) -> None:
        """The job's session closed before its setup was due: recorded as a short job's skipped setup."""
        if self.ended:
            return
        self.ended = True
        why = self.deferral.ended(time.perf_counter() - self.since, self.trained)
        log.info("stitchfleet: setup skipped: job too short: %s", why)
        if self.record is not None:
            self.record.setup_skipped("setup skipped: job too short", why)
            self.record.close()


def _training(graph: Any, fetches: Any) -> TrainingSteps | None:
    """The graph's training-step rule when a run of `fetches` updates a variable other than by initializing or
    restoring it (it trains), else None."""
    from stitchfleet.plugin.graph.training_steps import TrainingSteps

    steps = TrainingSteps(graph)
    return steps if steps.trains and steps.trains_in(fetches) else None


def _declined(reason: str, record: Ledger | None = None) -> None:
    """The job's telemetry (`record`, when a `Waiting` opened it) says this session's steps run without
    stitching, and why."""
    from stitchfleet.plugin.session.hook import StitchHook

    log.warning("stitchfleet: not attached: %s", reason)
    StitchHook(record=record).not_attached(reason)


def _first(session: Any, original: Run, steps: TrainingSteps) -> PlainRunner | Waiting | str:
    """At the session's first training run: its job waits before its setup when its length is unknown and it has
    one rank (`Waiting`; a Horovod job's ranks must begin at the same step, which no clock gives them), else the
    hook begins now (`_attach`)."""
    from stitchfleet import settings
    from stitchfleet.plugin.fleet import ledger
    from stitchfleet.plugin.horovod.decision_sums import Consensus
    from stitchfleet.plugin.setup import payback

    current = settings.current()
    if session.graph.finalized or current.job_steps > 0 or Consensus(current).size > 1:
        return _attach(session, original)
    deferral = payback.deferral(current.backend, current.setup_share)
    if deferral is None:
        return _attach(session, original)
    record = ledger.opened(current, 0, 1)
    if record is not None:  # what it computes on, measured as the hook would: its row claims no device unmeasured
        record.measure_devices(session)
    return Waiting(deferral, steps, record)


def _attach(session: Any, original: Run, record: Ledger | None = None) -> PlainRunner | str:
    """A hook begun on the session's graph (on the job's telemetry `record` when a `Waiting` opened it) and the
    runner of its runs, or why there is none."""
    from stitchfleet.plugin.session.hook import StitchHook

    graph = session.graph
    if graph.finalized:
        return "a plain tf.compat.v1.Session trains on a finalized graph: the hook cannot add its ops"
    hook = StitchHook(record=record)
    with graph.as_default():
        hook.begin()
    if hook.ledger is None:
        return "the hook did not set up on this session's graph (stitched by an earlier session, or no training op)"
    session.run = functools.partial(original, session)  # what the hook's twin diverter wraps
    hook.after_create_session(session, None)
    runner = PlainRunner(session, hook, session.run)
    session.run = runner.run  # the session's later runs: through the hook
    return runner


def patch(module: ModuleType) -> None:
    """Wraps `Session.run` and `Session.close` of `module` (idempotent)."""
    cls = getattr(module, "Session", None)
    if cls is None or getattr(cls.run, PATCHED, False):
        return
    original_run, original_close = cls.run, cls.close
    lock = threading.Lock()

    @functools.wraps(original_run)
    def run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        runner = _runner(self, fetches, original_run, lock)
        if runner is None:
            return original_run(self, fetches, feed_dict, options, run_metadata)
        return runner.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    @functools.wraps(original_close)
    def close(self: Any) -> None:
        state = getattr(self, STATE, None)
        if isinstance(state, (PlainRunner, Waiting)):
            try:
                state.end()
            except Exception as err:  # never fail the job's close
                log.warning("stitchfleet: could not end the hook of a plain session: %s", err)
        original_close(self)

    setattr(run, PATCHED, True)
    cls.run, cls.close = run, close


def _runner(session: Any, fetches: Any, original: Run, lock: threading.Lock) -> PlainRunner | None:
    """The session's runner once its hook began (at its first training run, or once a job of unknown length has
    trained long enough: `Waiting`), else None (this run as written)."""
    state = getattr(session, STATE, None)
    if isinstance(state, PlainRunner):
        return state
    waiting: Waiting | None = state if isinstance(state, Waiting) else None
    if state is not None and waiting is None:  # why it runs as written
        return None
    try:
        if waiting is None:
            graph = session.graph
            if hooked_graph.hooked(graph):  # a MonitoredSession's raw session: its hook is already there
                return None
            steps = _training(graph, fetches)
            if steps is None:
                return None
            with lock:
                if getattr(session, STATE, None) is None:
                    found = _first(session, original, steps)
                    setattr(session, STATE, found)
                    if isinstance(found, str):
                        _declined(found)
        elif waiting.due(fetches):
            record = waiting.record
            with lock:
                if getattr(session, STATE, None) is waiting:
                    found = _attach(session, original, record)
                    setattr(session, STATE, found)
                    if isinstance(found, str):
                        _declined(found, record)
    except Exception as err:  # never fail the job: this session runs as written
        setattr(session, STATE, f"{type(err).__name__}: {err}")
        log.warning("stitchfleet: a plain session's training steps run without the hook: %s", err)
        return None
    state = getattr(session, STATE, None)
    return state if isinstance(state, PlainRunner) else None
