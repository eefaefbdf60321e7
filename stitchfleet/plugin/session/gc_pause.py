"""Python's cyclic garbage collector, held off while the hook sets a job up.

Input: the block to run (the hook's `begin`). Output: the block's result, run with the collector disabled, and
the collector as it was afterwards (left disabled when the job had disabled it). The rules in full:
docs/plugin/session.md.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Runs the block with the collector disabled, then restores it (see the module docstring)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
