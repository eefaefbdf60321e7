"""The cuda target behind the seam: a cluster and its plan -> kernels rendered, compiled, run on the GPU.

Input: the cache directory (cubins) and, for the TF dispatch op, the folders a shim ships prebuilt files
in. Output: a `ProgramTarget` over pycuda (driver.py; building a cluster needs pycuda, nvcc and a GPU:
`CudaUnavailableError` otherwise), and `CudaNativeTarget`, what the plugin reaches jobs' GPU clusters
through: each cluster as a `CudaNativeKernel` (NVRTC cubin, launch plan, launch library: the GPU
kernel's attributes of the op), the launch library prebuilt for a shim.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import HostArray, OpAttr, Placement
from stitchfleet.compiler.targets.cache import artifact_cache
from stitchfleet.compiler.targets.cuda import PROFILE
from stitchfleet.compiler.targets.cuda.driver import CudaBackend
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuExecutable, compile_gpu
from stitchfleet.compiler.targets.cuda.launch_library import build
from stitchfleet.compiler.targets.cuda.launch_source import SOURCE as LAUNCH_SOURCE
from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
from stitchfleet.compiler.targets.program import ProgramTarget

NO_NVRTC = "no libnvrtc (the nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit)"


def target(cache_dir: Path) -> ProgramTarget:
    """The cuda target, its cubins cached under `cache_dir`."""
    return ProgramTarget(PROFILE, CudaBackend(cache_dir))


def launcher_name() -> str:
    """The file name of a prebuilt launch library: its source decides its bytes (it links against nothing
    of TF's and opens the CUDA driver itself)."""
    return f"launch-{hashlib.sha256(LAUNCH_SOURCE.encode()).hexdigest()[:32]}.so"


@dataclass(frozen=True)
class CudaNativeKernel:
    """One cluster as the dispatch op's GPU kernel runs it (`base.NativeKernel`)."""

    executable: GpuExecutable

    @property
    def symbol(self) -> str:
        return self.executable.symbol

    @property
    def passthrough(self) -> tuple[int, ...]:
        return self.executable.passthrough

    @property
    def repeats(self) -> tuple[int, ...]:
        return self.executable.repeats

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(node.shape) for node in self.executable.graph.parameters]

    @property
    def output_shapes(self) -> list[list[int]]:
        return self.executable.output_shapes

    binds = False  # the op's GPU kernel runs the module of its own attributes only
    cached = True  # not told apart: NVRTC's cubins are cached by source, the launch plan is cheap

    def op_attrs(self) -> dict[str, OpAttr]:
        return dict(self.executable.attrs())

    def run(self, arrays: Sequence[HostArray]) -> tuple[tuple[HostArray, ...], bool]:
        # A GPU cluster has no host path: tf.numpy_function would put a CPU op into the GPU data path.
        raise RuntimeError("a GPU cluster runs only through the StitchfleetDispatch GPU kernel")


class CudaNativeTarget:
    """The cuda target as the TF dispatch op runs it (`base.NativeTarget`)."""

    profile = PROFILE

    def __init__(self, cache_dir: Path, shipped: Sequence[Path] = ()) -> None:
        self.cache_dir = Path(cache_dir)
        self.shipped = tuple(shipped)

    def launcher(self) -> Path:
        """The launch library: a shim's prebuilt one when shipped, else built into the cache (a C compiler)."""
        found = [folder / launcher_name() for folder in self.shipped]
        prebuilt = next((path for path in found if path.is_file()), None)
        return prebuilt or build(artifact_cache(self.cache_dir, "launch"))

    def native(self, graph: Graph, plan: StitchPlan, placement: Placement) -> CudaNativeKernel:
        """The cluster for the arch of the GPU TF placed it on. No driver call here: each kernel's launch
        bounds keep the blocks per SM its grid needs resident (the plan's geometry holds by construction,
        checked by the ptxas gate), and the op checks co-residency again when it loads the module in its
        own stream's context, on its own device; so no rank opens a context on another rank's GPU."""
        nvrtc = find_nvrtc()
        if nvrtc is None:
            raise RuntimeError(NO_NVRTC)
        if not placement.arch:
            raise ValueError("a GPU cluster needs its device's arch (Placement.arch)")
        executable = compile_gpu(graph, plan, placement.arch, self.cache_dir, nvrtc=nvrtc, launcher=self.launcher())
        return CudaNativeKernel(executable)

    def native_unavailable(self) -> str | None:
        if find_nvrtc() is None:
            return NO_NVRTC
        try:
            self.launcher()
        except RuntimeError as err:
            return str(err)
        return None

    def builder(self) -> dict[str, str] | None:
        return None  # its cubins are keyed by the arch a placement names: a job's setup records none of them

    def prebuild(self, folder: Path) -> list[Path]:
        """The launch library, named by its source (a pod has no C compiler to build it)."""
        built = build(artifact_cache(self.cache_dir, "launch"))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / launcher_name()
        shutil.copyfile(built, path)
        return [path]


def native_target(cache_dir: Path, shipped: Sequence[Path] = ()) -> CudaNativeTarget:
    """The cuda target for the TF dispatch op, its cubins cached under `cache_dir`, a shim's prebuilt
    launch library found in the `shipped` folders."""
    return CudaNativeTarget(cache_dir, shipped)
