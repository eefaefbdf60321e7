"""The cuda-cpu target behind the seam: a cluster and its plan -> the CUDA text built by g++, run here.

Input: the cache directory (shared objects, cache.py's "cuda-cpu" artifacts). Output: a
`ProgramTarget` over `CudaCpuBackend` (backend.py).
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.targets.cuda_cpu import PROFILE
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from stitchfleet.compiler.targets.program import ProgramTarget


def target(cache_dir: Path) -> ProgramTarget:
    """The cuda-cpu target, its shared objects cached under `cache_dir`."""
    return ProgramTarget(PROFILE, CudaCpuBackend(cache_dir))
