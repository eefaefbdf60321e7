"""Plain `tf.compat.v1.Session` jobs under auto-attach: their training steps get a StitchHook too.

Input: The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

    from stitchfleet.plugin.session.hook import StitchHook

log = logging.getLogger("stitchfleet.plugin")
TARGET = "tensorflow.python.client.session"
PATCHED = "_stitchfleet_patched"
STATE = "_stitchfleet_plain"  # on a Session: its PlainRunner, or the reason it runs as written
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
        if extra is None:
            return self.inner(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
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


def _trains(graph: Any, fetches: Any) -> bool:
    """Whether a run of `fetches` updates a variable other than by initializing or restoring it."""
    from stitchfleet.plugin.graph.training_steps import TrainingSteps

    steps = TrainingSteps(graph)
    return steps.trains and steps.trains_in(fetches)


def _declined(reason: str) -> None:
    """The job's telemetry says this session's steps run without stitching, and why."""
    from stitchfleet.plugin.session.hook import StitchHook

    log.warning("stitchfleet: not attached: %s", reason)
    StitchHook().not_attached(reason)


def _attach(session: Any, original: Run) -> PlainRunner | str:
    """A hook begun on the session's graph and the runner of its runs, or why there is none."""
    from stitchfleet.plugin.session.hook import StitchHook

    graph = session.graph
    if graph.finalized:
        return "a plain tf.compat.v1.Session trains on a finalized graph: the hook cannot add its ops"
    hook = StitchHook()
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
        if isinstance(state, PlainRunner):
            try:
                state.end()
            except Exception as err:  # never fail the job's close
                log.warning("stitchfleet: could not end the hook of a plain session: %s", err)
        original_close(self)

    setattr(run, PATCHED, True)
    cls.run, cls.close = run, close


def _runner(session: Any, fetches: Any, original: Run, lock: threading.Lock) -> PlainRunner | None:
    """The session's runner once its first training run came (attaching then), else None (run as written)."""
    state = getattr(session, STATE, None)
    if state is not None:
        return state if isinstance(state, PlainRunner) else None
    from stitchfleet.plugin.session.hook import HOOKED  # the hook imports TF: only once a session runs

    graph = session.graph
    if getattr(graph, HOOKED, False):  # a MonitoredSession's raw session: its hook is already there
        return None
    try:
        if not _trains(graph, fetches):
            return None
        with lock:
            if getattr(session, STATE, None) is None:
                found = _attach(session, original)
                setattr(session, STATE, found)
                if isinstance(found, str):
                    _declined(found)
    except Exception as err:  # never fail the job: this session runs as written
        setattr(session, STATE, f"{type(err).__name__}: {err}")
        log.warning("stitchfleet: a plain session's training steps run without the hook: %s", err)
        return None
    state = getattr(session, STATE, None)
    return state if isinstance(state, PlainRunner) else None
