"""One stitched cluster as a numpy callable: the bridge's target inside `tf.numpy_function`.

Input: a cluster graph (compiler artifact), its stitch plan, a backend name (`cpu`: C +
OpenMP, `sim`: the kernel-IR interpreter, `cuda`: a cubin for the TF GPU op; `auto` resolves to
`cpu` here and per cluster to `cuda` for GPU-placed clusters: `placement.route`) and an optional
test-only `Fault`. Output: `ClusterKernel`, called with the
cluster's input arrays in parameter order, returning its outputs in output order (by
position end to end: no name dicts on the per-step path; the cpu backend reports NaN/Inf
from its C code, so the bridge runs no numpy pass over the outputs). It never raises into
TensorFlow: when the backend fails, or returns non-finite values where the unfused
computation is finite, the call answers with the unfused numpy result for this one step (so
the training step is not poisoned) and flags the cluster; the hook reverts flagged clusters
at its next decision step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler import targets
from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.pipeline import compile_cluster
from stitchfleet.compiler.plan import PlanOptions, StitchPlan
from stitchfleet.compiler.targets.cache import artifact_cache
from stitchfleet.compiler.targets.cpu.executable import CpuExecutable
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuExecutable, Holds, compile_gpu, occupancy_holds
from stitchfleet.compiler.targets.cuda.launch_library import LaunchLibrary, build
from stitchfleet.compiler.targets.cuda.nvrtc import Nvrtc, find_nvrtc
from stitchfleet.plugin.faults import Fault

log = logging.getLogger("stitchfleet.plugin")
Array = npt.NDArray[Any]
Run = Callable[[Sequence[Array]], tuple[tuple[Array, ...], bool]]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run clusters in this process; the message says why."""


def resolve_backend(name: str, cache_dir: Path | None = None, bridge: str = "auto") -> str:
    """The backend of the job's CPU-placed clusters: `auto` -> `cpu` (GPU-placed ones are routed per
    cluster by `placement.route`); `cuda` only where the GPU op can run (else the reason why not)."""
    if name == "auto":
        return "cpu"
    if name == "cuda":
        if cache_dir is None:
            from stitchfleet import settings

            current = settings.current()
            cache_dir, bridge = current.cache_dir, current.bridge
        why = gpu_op_unavailable(cache_dir, bridge)
        if why is not None:
            raise BackendUnavailableError(
                f"the cuda bridge (the StitchfleetDispatch GPU kernel) cannot run here: {why}"
            )
        return name
    usable = targets.names(in_jobs=True)
    if name not in usable:
        what = "runs in `stitchfleet compile --device` only" if name in targets.NAMES else "is unknown"
        raise BackendUnavailableError(f"backend {name!r} {what} (job backends: auto, {', '.join(usable)})")
    return name


_GPU_OP: dict[tuple[str, str], str | None] = {}


def gpu_op_unavailable(cache_dir: Path, bridge: str = "auto") -> str | None:
    """Why GPU-placed clusters cannot go to the TF GPU op in this process, or None when they can (asked
    once per process: a GPU visible to TF, a CUDA build of TF, NVRTC, the launch library, the op library)."""
    key = (str(cache_dir), bridge)
    if key not in _GPU_OP:
        _GPU_OP[key] = _gpu_op_check(cache_dir, bridge)
    return _GPU_OP[key]


def _gpu_op_check(cache_dir: Path, bridge: str) -> str | None:
    from stitchfleet.plugin import bridge_op, placement

    if bridge == "python":
        return "STITCHFLEET_BRIDGE=python: a GPU cluster runs only through the native op"
    if not placement.gpu_visible():
        return "no GPU visible to TensorFlow in this process"
    if not bridge_op.cuda_build():
        return "this TensorFlow is not a CUDA build"
    if find_nvrtc() is None:
        return "no libnvrtc (the nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit)"
    try:
        if bridge_op.prebuilt_launcher() is None:
            build(artifact_cache(Path(cache_dir), "launch"))
        bridge_op.load(Path(cache_dir))
    except RuntimeError as err:
        return str(err)
    return None


def nonfinite(values: Sequence[Array]) -> bool:
    """Whether a floating-point array among `values` holds NaN or Inf (numpy; the cpu backend tests in C)."""
    return not all(np.isfinite(v).all() for v in values if np.issubdtype(v.dtype, np.floating))


def compile_run(
    graph: Graph, plan: StitchPlan, backend: str, cache_dir: Path
) -> tuple[Run, CpuExecutable | GpuExecutable | None]:
    """Compiles one cluster for `backend`: arrays by position -> (outputs by position, NaN/Inf flag), and
    what the native bridge op runs: the compiled C (`cpu`) or the cubin and launch plan (`cuda`)."""
    if backend == "cpu":
        from stitchfleet.compiler.targets.cpu.executable import compile_cluster

        executable = compile_cluster(graph, cache_dir, plan)
        return executable.run, executable
    if backend == "cuda":
        return _gpu_only, _compile_gpu(graph, plan, cache_dir)
    return _lowered_run(graph, plan), None


def _compile_gpu(graph: Graph, plan: StitchPlan, cache_dir: Path) -> GpuExecutable:
    """The cluster for this process's GPU: its arch from TF, grid-barrier grids fitted to the device's
    real occupancy (`device_holds`), the shim's prebuilt launch library when there is one."""
    from stitchfleet.plugin.bridge_op import prebuilt_launcher
    from stitchfleet.plugin.placement import gpu_arch

    nvrtc = find_nvrtc()
    if nvrtc is None:
        raise BackendUnavailableError("no libnvrtc (the nvidia-cuda-nvrtc-cu12 wheel or a CUDA toolkit)")
    launcher = prebuilt_launcher() or build(artifact_cache(Path(cache_dir), "launch"))
    arch = gpu_arch()
    holds = device_holds(launcher, nvrtc, arch, Path(cache_dir))
    return compile_gpu(graph, plan, arch, cache_dir, nvrtc=nvrtc, launcher=launcher, holds=holds)


def device_holds(launcher: Path, nvrtc: Nvrtc, arch: str, cache_dir: Path) -> Holds:
    """Blocks of a compiled kernel GPU 0 keeps resident at once (the launch library on the driver; the
    GPUs of one job are alike). LaunchError without a driver: no GPU op runs there either."""
    library = LaunchLibrary(launcher)
    library.init()
    return occupancy_holds(library, nvrtc, arch, artifact_cache(cache_dir, "cubin"))


def _gpu_only(arrays: Sequence[Array]) -> tuple[tuple[Array, ...], bool]:
    # A GPU cluster has no host path: tf.numpy_function would put a CPU op into the GPU data path.
    raise BackendUnavailableError("a GPU cluster runs only through the StitchfleetDispatch GPU kernel")


def _lowered_run(graph: Graph, plan: StitchPlan) -> Run:
    from stitchfleet.compiler.lower import lower
    from stitchfleet.compiler.targets.sim.target import run_lowered

    lowered = lower(graph, plan)
    names = tuple(str(p.attrs["name"]) for p in graph.parameters)

    def run(arrays: Sequence[Array]) -> tuple[tuple[Array, ...], bool]:
        got = run_lowered(lowered, graph, dict(zip(names, arrays, strict=True)))
        values = tuple(np.asarray(got[name]).astype(graph.node(i).dtype.numpy, copy=False) for name, i in graph.outputs)
        return values, nonfinite(values)

    return run


class ClusterKernel:
    """See the module docstring. `calls` counts backend runs; `bad` holds why it must be reverted."""

    def __init__(
        self,
        graph: Graph,
        plan: StitchPlan,
        backend: str,
        cache_dir: Path,
        fault: Fault | None = None,
    ) -> None:
        self.graph = graph
        self.names = tuple(str(p.attrs["name"]) for p in graph.parameters)
        self.outputs = tuple(name for name, _ in graph.outputs)
        self.dtypes = tuple(graph.node(i).dtype.numpy for _, i in graph.outputs)
        self.fault = fault
        compiled_graph, compiled_plan = graph, plan
        if fault is not None:
            compiled_graph = fault.corrupt_graph(graph)
            if compiled_graph is not graph:  # a corrupted graph is a changed cluster: the compiler's re-entry plans it
                compiled_plan = compile_cluster(compiled_graph, plan.cluster, PlanOptions())
        self._run, compiled = compile_run(compiled_graph, compiled_plan, backend, cache_dir)
        # the compiled C for the native bridge op (unless a test fault corrupts outputs in Python)
        self.executable = compiled if fault is None or fault.in_graph else None
        self.bridged: Callable[[], int] | None = None  # calls made through the bridge op, once it is wired
        self.faulted: Callable[[], int] | None = None  # the bridge op's NaN/Inf where TF's ops were finite
        self._calls = 0
        self.fallbacks = 0
        self.bad: str | None = None
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        """Backend runs: through tf.numpy_function and through the native bridge op."""
        return self._calls + (self.bridged() if self.bridged is not None else 0)

    def flag(self, reason: str) -> None:
        """Marks the cluster for revert (the first reason is kept)."""
        self.bad = self.bad or reason

    def __call__(self, *arrays: Array) -> tuple[Array, ...]:
        with self._lock:
            self._calls += 1
        try:
            healthy = self.fault is None or self._calls <= self.fault.after
            values, bad = self._run(arrays) if healthy else self._faulty(arrays)
        except Exception as err:  # a backend failure must not reach TensorFlow
            log.warning("stitchfleet: cluster %s backend failed: %s", self.graph.metadata.get("cluster"), err)
            return self._fallback(self._named(arrays), f"backend error: {type(err).__name__}")
        return self._nonfinite(self._named(arrays), values) if bad else values

    def _faulty(self, arrays: Sequence[Array]) -> tuple[tuple[Array, ...], bool]:
        """The test-only corrupted run: outputs changed after the backend, so finiteness is re-tested."""
        assert self.fault is not None
        got, _ = self._run(arrays)
        named = self.fault.corrupt_outputs(dict(zip(self.outputs, got, strict=True)))
        values = tuple(np.asarray(named[n]) for n in self.outputs)
        return values, nonfinite(values)

    def _named(self, arrays: Sequence[Array]) -> dict[str, Array]:
        return dict(zip(self.names, arrays, strict=True))

    def _native(self, inputs: Mapping[str, Array]) -> tuple[Array, ...]:
        native = evaluate(self.graph, inputs)
        return tuple(
            np.asarray(native[n]).astype(d, copy=False) for n, d in zip(self.outputs, self.dtypes, strict=True)
        )

    def _fallback(self, inputs: Mapping[str, Array], reason: str) -> tuple[Array, ...]:
        self.flag(reason)
        self.fallbacks += 1
        return self._native(inputs)

    def _nonfinite(self, inputs: Mapping[str, Array], values: tuple[Array, ...]) -> tuple[Array, ...]:
        native = self._native(inputs)
        for got, want in zip(values, native, strict=True):
            if np.issubdtype(got.dtype, np.floating) and (np.isfinite(want) & ~np.isfinite(got)).any():
                self.flag("non-finite stitched output")
                self.fallbacks += 1
                return native
        return values  # the unfused computation is non-finite too: not the kernel's fault


def poll_faults(bridge: Any, seen: int, kernels: Sequence[Any]) -> int:
    """Flags the kernels whose native op found NaN/Inf where TF's ops were finite; returns the process-wide
    fault count to pass next time (one read per step; the per-cluster counts only when that count moved)."""
    if bridge is None or bridge.faults() == seen:
        return seen
    for kernel in kernels:
        faulted = getattr(kernel, "faulted", None)
        if faulted is not None and faulted() > 0:
            kernel.flag("non-finite stitched output (native bridge: TF's own ops were finite)")
    return int(bridge.faults())
