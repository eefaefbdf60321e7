"""Which thread's `session.run` is the hook's training step, when threads share one session.

Input: a hook's `before_run` / `after_run` calls, from whatever threads run the session, with the session's
`TrainingSteps` and the twin's `Diverter`. Output: The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

    from stitchfleet.plugin.graph.training_steps import TrainingSteps
    from stitchfleet.plugin.graph.twin import Diverter

log = logging.getLogger("stitchfleet.plugin")


class StepThreads:
    """The thread whose training step is in flight, and each thread's flags for its current run."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None

    @property
    def in_step(self) -> bool:
        """This thread's current run is the hook's training step."""
        return bool(getattr(self._local, "in_step", False))

    @property
    def in_agreement(self) -> bool:
        """This thread's current run is Horovod's agreement run (the first training run)."""
        return bool(getattr(self._local, "in_agreement", False))

    def reset(self) -> None:
        """A new run of this thread: nothing of its last run holds (a run that raised never reached after_run)."""
        self._local.in_step = self._local.in_agreement = False
        self.release()

    def claim(self, agreement: bool = False) -> bool:
        """This thread's run becomes the one in flight; False while another live thread's is."""
        me = threading.current_thread()
        with self._lock:
            if self._owner is not None and self._owner is not me and self._owner.is_alive():
                return False
            self._owner = me
        if agreement:
            self._local.in_agreement = True
        else:
            self._local.in_step = True
        return True

    def release(self) -> None:
        """After this thread's run: another thread's next training run may be the step."""
        self._local.in_step = self._local.in_agreement = False
        me = threading.current_thread()
        if self._owner is not me:  # only this thread sets the owner to itself: no lock to see it is not
            return
        with self._lock:
            if self._owner is me:
                self._owner = None

    def take(
        self,
        run_context: tf.compat.v1.train.SessionRunContext,
        training: TrainingSteps | None,
        diverter: Diverter | None,
    ) -> bool:
        """Whether this run is the hook's training step (claimed): a training run (training_steps: its rule)
        that the twin can take (not another session, no feed into what the twin computes), while no other
        thread's step is in flight. Any other run is left as written (once stitching is over, the hook times its
        steps without claiming them: `StitchHook._quiet_start`)."""
        try:
            args = run_context.original_args
            if training is None or not training.is_training(args.fetches):
                return False
            fetched = training.fetched
            if diverter is None or not diverter.diverts(run_context.session, args.feed_dict, fetched):
                return False
        except Exception:
            log.exception("stitchfleet: could not tell whether a run is a training step; left untouched")
            return False
        return self.claim()
