"""The cuda-cpu target behind the seam: a cluster and its plan -> the CUDA text built by g++, run here.

Input: a cluster graph, its `StitchPlan` and the cache directory (shared objects, cache.py's
"cuda-cpu" artifacts). Output: the cluster's run over `CudaCpuBackend` (backend.py).
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import ClusterRun
from stitchfleet.compiler.targets.cuda_cpu import PROFILE
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from stitchfleet.compiler.targets.program import cluster_run


class CudaCpuTarget:
    """The `Target` of the cuda-cpu backend."""

    profile = PROFILE

    def __init__(self, cache_dir: Path) -> None:
        self.backend = CudaCpuBackend(cache_dir)

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun:
        lowered = lower(graph, plan)
        return cluster_run(lowered, graph, self.backend.compile(lowered.kernels))


def target(cache_dir: Path) -> CudaCpuTarget:
    """The cuda-cpu target, its shared objects cached under `cache_dir`."""
    return CudaCpuTarget(cache_dir)
