"""A cluster compiled for the TF GPU op: its launch program, its module (NVRTC cubin) and the launch library.

Input: a cluster graph and its stitch plan, the device's arch (`sm_90`), a cache directory, and
optionally an NVRTC (default: the wheel's or a toolkit's). Output: `GpuExecutable`: files on disk
(the cubin, content-addressed; the launch library, built once per source) and the attributes the
`StitchfleetDispatch` op's GPU kernel takes (`attrs`). No GPU is needed to build one (CI does); only
loading and launching it need a driver. `GpuCompileError` says why a cluster cannot be compiled.

Under a job's shape signature the op checks each call's input shapes against the graph's parameter
shapes (`plugin.native.dispatch_op.BridgeOp.dispatch` passes them as `input_shapes`) and runs TF's ops on a miss.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, StitchPlan, plan_cluster
from stitchfleet.compiler.targets.cache import ArtifactCache, artifact_cache
from stitchfleet.compiler.targets.cuda.coresidency import CoresidencyError, fit
from stitchfleet.compiler.targets.cuda.launch_library import LaunchLibrary
from stitchfleet.compiler.targets.cuda.launch_library import build as build_launcher
from stitchfleet.compiler.targets.cuda.launch_plan import LaunchPlan, plan_launches
from stitchfleet.compiler.targets.cuda.nvrtc import Nvrtc, find_nvrtc
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.signature import CudaKernel

AttrValue = str | int | list[str] | list[int]
Holds = Callable[[CudaKernel], int]


class GpuCompileError(RuntimeError):
    """The cluster cannot be compiled for the GPU op here (no NVRTC, an NVRTC error, a plan it cannot run)."""


@dataclass(frozen=True)
class GpuExecutable:
    """What the GPU op runs for one cluster on one arch."""

    graph: Graph
    plan: LaunchPlan
    arch: str
    module_path: Path
    launcher_path: Path

    @property
    def symbol(self) -> str:
        """The cluster's key for the op library's counters (unique per module)."""
        return f"sf_gpu_{self.module_path.stem[:24]}"

    @property
    def passthrough(self) -> tuple[int, ...]:
        return self.plan.passthrough

    @property
    def repeats(self) -> tuple[int, ...]:
        return self.plan.repeats

    @property
    def output_shapes(self) -> list[list[int]]:
        return [list(self.graph.node(node).shape) for _, node in self.graph.outputs]

    def attrs(self) -> dict[str, AttrValue]:
        """The GPU kernel's attributes of `StitchfleetDispatch` (beside the shared ones)."""
        return {
            "module": str(self.module_path),
            "kernels": list(self.plan.names),
            "layout": list(self.plan.spec),
            "scratch_bytes": self.plan.scratch_bytes,
            "launcher": str(self.launcher_path),
            "symbol": self.symbol,
        }


def compile_gpu(
    graph: Graph,
    plan: StitchPlan,
    arch: str,
    cache_dir: Path,
    *,
    nvrtc: Nvrtc | None = None,
    launcher: Path | None = None,
    holds: Holds | None = None,
) -> GpuExecutable:
    """Lowers, plans the launches, compiles the module for `arch` and builds the launch library (unless
    `launcher`, a prebuilt one, is given: a pod has no C compiler). With `holds` (blocks of a compiled
    kernel the device keeps resident at once: `occupancy_holds`), a grid-barrier kernel whose grid does
    not fit is re-planned for fewer blocks first (`coresidency.fit`), or the cluster is refused."""
    if holds is not None:
        plan = _fitted(graph, plan, holds)
    try:
        launches = plan_launches(graph, lower(graph, plan))
    except ValueError as err:
        raise GpuCompileError(f"no launch plan: {err}") from None
    compiler = nvrtc or find_nvrtc()
    if compiler is None:
        raise GpuCompileError("no libnvrtc (the nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit)")
    cubins = artifact_cache(Path(cache_dir), "cubin")
    try:
        image = compiler.compile(launches.source, arch, cubins)
    except RuntimeError as err:
        raise GpuCompileError(f"NVRTC: {err}") from None
    modules = artifact_cache(Path(cache_dir), "gpu_modules")
    key = hashlib.sha256(image).hexdigest()
    module = modules.path(key) if modules.path(key).is_file() else modules.put(key, image)
    if launcher is None:
        try:
            launcher = build_launcher(artifact_cache(Path(cache_dir), "launch"))
        except RuntimeError as err:
            raise GpuCompileError(f"launch library: {err}") from None
    return GpuExecutable(graph, launches, arch, module, launcher)


def _fitted(graph: Graph, plan: StitchPlan, holds: Holds) -> StitchPlan:
    """`plan` when its grid-barrier grids fit the device at once, else the cluster re-planned to fit."""
    kernels = [render_kernel(k) for k in lower(graph, plan).kernels]
    if all(k.launch.grid <= holds(k) for k in kernels if k.grid_barrier):
        return plan
    try:
        fitted = fit(graph, plan.cluster, PlanOptions(device=plan.device), holds)
    except CoresidencyError as err:
        raise GpuCompileError(str(err)) from None
    return plan_cluster(graph, plan.cluster, fitted.options)


def occupancy_holds(library: LaunchLibrary, nvrtc: Nvrtc, arch: str, cache: ArtifactCache, ordinal: int = 0) -> Holds:
    """`holds` from the real device `ordinal` (an initialised launch library): a kernel compiled alone,
    loaded in the device's primary context, its occupancy per SM x the SM count."""

    def holds(kernel: CudaKernel) -> int:
        with library.primary(ordinal):
            module = library.load(nvrtc.compile(kernel.source, arch, cache))
            try:
                blocks = library.occupancy(library.function(module, kernel), kernel)
                return blocks * library.device().sms
            finally:
                library.unload(module)

    return holds
