"""Python's cyclic garbage collector, held off while the hook sets a job up, and kept off the heap it leaves.

Input: the block to run (the hook's `begin`); the hook's `end`. Output: the block's result, run with the collector
disabled; afterwards its own garbage collected and the heap as it stands frozen (`gc.freeze`) until `thawed`, the
collector as it was (left disabled when the job had disabled it). The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The generations a collection right after the block walks: the block's objects sit in the youngest (the collector
# was off), so this frees its cycles without walking the whole process's heap (0.15-0.19 s with TF loaded).
YOUNG = 1


class _Frozen:
    """Whether this module froze the heap (it thaws only what it froze, never a freeze of the job's own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ours = False


_frozen = _Frozen()


@contextmanager
def paused() -> Iterator[None]:
    """Runs the block with the collector disabled, then settles the heap it left (see the module docstring)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            _settle()
            gc.enable()


def _settle() -> None:
    gc.collect(YOUNG)
    with _frozen.lock:
        if gc.get_freeze_count() and not _frozen.ours:
            return  # the job froze its heap itself (a pre-fork server's idiom): left as the job set it
        gc.freeze()
        _frozen.ours = True


def thawed() -> None:
    """Returns the heap this module froze to the collector (the hook's end: the job's later graphs and sessions, an
    estimator's next evaluation, free what the setup left behind)."""
    with _frozen.lock:
        if _frozen.ours:
            gc.unfreeze()
            _frozen.ours = False
