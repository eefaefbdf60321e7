"""Python's cyclic garbage collector, held off while the hook sets a job up.

Input: the block to run (the hook's `begin`). Output: the block's result, run with the collector
disabled, and the collector as it was afterwards (left disabled when the job had disabled it).

Why: `begin` allocates hundreds of thousands of Python objects (TF ops, protobufs, IR nodes), so
the collector runs dozens of times, and each full pass walks everything the process holds, TF's
Python heap included: 0.12-0.21 s of the demo model's ~0.6 s warm `begin` (61 collections,
measured with gc.callbacks on the 2-core machine). Nothing of `begin` depends on a cycle being
freed early; the cycles it leaves are collected by the first pass after it.
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
