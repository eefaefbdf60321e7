"""The cpu target behind the seam: a cluster and its plan -> C + OpenMP built and called here.

Input: a cluster graph, its `StitchPlan` and the cache directory. Output: the compiled cluster
(`CpuExecutable`: graph inputs by name -> graph outputs by name), from the artifact cache when
the same source was built before.
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import ClusterRun
from stitchfleet.compiler.targets.cpu import PROFILE
from stitchfleet.compiler.targets.cpu.executable import compile_cluster


class CpuTarget:
    """The `Target` of the cpu backend."""

    profile = PROFILE

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun:
        return compile_cluster(graph, self.cache_dir, plan)


def target(cache_dir: Path) -> CpuTarget:
    """The cpu target, its shared objects cached under `cache_dir`."""
    return CpuTarget(cache_dir)
