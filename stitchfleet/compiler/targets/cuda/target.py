"""The cuda target behind the seam: a cluster and its plan -> kernels rendered, compiled, run on the GPU.

Input: the cache directory (cubins). Output: a `ProgramTarget` over pycuda (driver.py);
building a cluster needs pycuda, nvcc and a GPU (`CudaUnavailableError` otherwise). Jobs reach
the GPU through the TF op and gpu_executable.py instead.
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.targets.cuda import PROFILE
from stitchfleet.compiler.targets.cuda.driver import CudaBackend
from stitchfleet.compiler.targets.program import ProgramTarget


def target(cache_dir: Path) -> ProgramTarget:
    """The cuda target, its cubins cached under `cache_dir`."""
    return ProgramTarget(PROFILE, CudaBackend(cache_dir))
