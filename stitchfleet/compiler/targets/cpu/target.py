"""The cpu target behind the seam: a cluster and its plan -> C + OpenMP built and called here.

Input: a cluster graph, its `StitchPlan` and the cache directory. Output: the compiled cluster
(`CpuExecutable`: graph inputs by name -> graph outputs by name, and by position for the TF
dispatch op, which dlopens its library: a `NativeKernel`), from the artifact cache when the same
source was built before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import ClusterRun, Placement
from stitchfleet.compiler.targets.cpu import PROFILE
from stitchfleet.compiler.targets.cpu.executable import CpuExecutable, CpuOptions, build_identity, compile_cluster


class CpuTarget:
    """The `Target` (and `NativeTarget`) of the cpu backend."""

    profile = PROFILE

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun:
        return compile_cluster(graph, self.cache_dir, plan)

    def native(self, graph: Graph, plan: StitchPlan, placement: Placement) -> CpuExecutable:
        del placement  # one host: the op's CPU kernel calls the entry in its own thread
        return compile_cluster(graph, self.cache_dir, plan)

    def native_unavailable(self) -> str | None:
        return None  # a missing C compiler fails each compile with its own message

    def builder(self) -> dict[str, str] | None:
        return build_identity(CpuOptions(self.cache_dir))

    def prebuild(self, folder: Path) -> list[Path]:
        del folder  # the clusters' C is compiled per job: nothing cluster-independent to ship
        return []


def target(cache_dir: Path) -> CpuTarget:
    """The cpu target, its shared objects cached under `cache_dir`."""
    return CpuTarget(cache_dir)


def native_target(cache_dir: Path, shipped: Sequence[Path] = ()) -> CpuTarget:
    """The cpu target as the TF dispatch op runs it (nothing prebuilt to look for in `shipped`)."""
    del shipped
    return CpuTarget(cache_dir)
