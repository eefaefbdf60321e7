"""The cuda target behind the seam: a cluster and its plan -> kernels rendered, compiled, run on the GPU.

Input: a cluster graph, its `StitchPlan` and the cache directory (cubins). Output: the cluster's
run over pycuda (driver.py); building it needs pycuda, nvcc and a GPU (`CudaUnavailableError`
otherwise). Jobs reach the GPU through the TF op and gpu_executable.py instead.
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import ClusterRun
from stitchfleet.compiler.targets.cuda import PROFILE
from stitchfleet.compiler.targets.cuda.driver import CudaBackend
from stitchfleet.compiler.targets.program import cluster_run


class CudaTarget:
    """The `Target` of the cuda backend (pycuda launches)."""

    profile = PROFILE

    def __init__(self, cache_dir: Path) -> None:
        self.backend = CudaBackend(cache_dir)

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun:
        lowered = lower(graph, plan)
        return cluster_run(lowered, graph, self.backend.compile(lowered.kernels))


def target(cache_dir: Path) -> CudaTarget:
    """The cuda target, its cubins cached under `cache_dir`."""
    return CudaTarget(cache_dir)
