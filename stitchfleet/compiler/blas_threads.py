"""The numpy reference's work with OpenBLAS on one thread: `one_blas_thread`, a decorator (counts restored after).
Why: OpenBLAS's workers spin ~100 ms after each multi-threaded call (the fp64 reference's dot products, matmuls):
after a guard's check step they took a core from the job's next 15-20 steps on 2 cores (benchmarks/README.md,
"Session 27"). Input: the OpenBLAS libraries loaded in this process (numpy's own); none found, nothing is limited.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
# numpy's wheels carry an ILP64 OpenBLAS whose symbols end in "64_"; a system OpenBLAS has the plain names
_SUFFIXES = ("", "64_", "_64")


@functools.cache
def _libraries() -> tuple[tuple[Callable[[], int], Callable[[int], None]], ...]:
    """(get, set) of each OpenBLAS library mapped into this process, found once (numpy loaded it on import)."""
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.is_file() else []
    paths = sorted({line.split()[-1] for line in lines if "openblas" in line.rsplit("/", 1)[-1].lower()})
    found = []
    for path in paths:
        library = ctypes.CDLL(path)  # already loaded: the same handle, nothing runs
        for suffix in _SUFFIXES:
            get = getattr(library, f"openblas_get_num_threads{suffix}", None)
            put = getattr(library, f"openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                found.append((get, put))
                break
    return tuple(found)


def one_blas_thread(function: Callable[P, R]) -> Callable[P, R]:
    """`function` run with every OpenBLAS library on one thread, each library's own count set again after it."""

    @functools.wraps(function)
    def limited(*args: P.args, **kwargs: P.kwargs) -> R:
        libraries = _libraries()
        before = [get() for get, _ in libraries]
        for _, put in libraries:
            put(1)
        try:
            return function(*args, **kwargs)
        finally:
            for (_, put), count in zip(libraries, before, strict=True):
                put(count)

    return limited
