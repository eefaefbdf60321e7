"""The guard's numpy work with BLAS on one thread: a context its float64 reference and error sums run in.

Why: after each multi-threaded call (numpy's dot, matmul, norm) OpenBLAS leaves its workers spinning for
about 100 ms before they sleep. A check step's reference on the training thread thus took a core from the
job's next 15-20 steps on a 2-core machine (demo steps 6-8 ms against 5), and the probe halves that hold
the checks lost to the user's graph they are compared with (benchmarks/README.md, "Session 27").
Input: nothing; output: `one_blas_thread()`, restoring each BLAS library's own thread count on exit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from threadpoolctl import ThreadpoolController


@functools.cache
def _controller() -> ThreadpoolController:
    """The BLAS libraries loaded in this process, found once (a scan of the loaded libraries costs ~3 ms; each
    limit afterwards ~15 us)."""
    return ThreadpoolController()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Runs the block with every loaded BLAS library on one thread; their thread counts as before after it."""
    with _controller().limit(limits=1, user_api="blas"):
        yield
