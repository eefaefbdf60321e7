"""One stitched cluster as a numpy callable: the bridge's target inside `tf.numpy_function`.

Input: a cluster graph (compiler artifact), its stitch plan, a backend name (reached through the targets
registry: Output: The rules in full: docs/plugin/native.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler import targets
from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.pipeline import compile_cluster
from stitchfleet.compiler.plan import PlanOptions, StitchPlan
from stitchfleet.compiler.targets.base import NativeKernel, Placement
from stitchfleet.plugin.native.faults import Fault

if TYPE_CHECKING:
    from stitchfleet.plugin.native.dispatch_op import BridgeOp

log = logging.getLogger("stitchfleet.plugin")
Array = npt.NDArray[np.generic]
Run = Callable[[Sequence[Array]], tuple[tuple[Array, ...], bool]]


def nonfinite(values: Sequence[Array]) -> bool:
    """Whether a floating-point array among `values` holds NaN or Inf (numpy; the cpu backend tests in C)."""
    return not all(np.isfinite(v).all() for v in values if np.issubdtype(v.dtype, np.floating))


def compile_run(
    graph: Graph, plan: StitchPlan, backend: str, cache_dir: Path, device: str = ""
) -> tuple[Run, NativeKernel | None]:
    """Compiles one cluster for `backend`: arrays by position -> (outputs by position, NaN/Inf flag), and
    what the native dispatch op runs (a target the op runs natively; None for the others: their run goes
    through tf.numpy_function). `device`: the TF device the cluster's ops are placed on ('' unset)."""
    if targets.profile(backend).native_op:
        from stitchfleet.plugin.native import dispatch_op

        placement = _placement(targets.profile(backend).runs_on, device)
        kernel = targets.native(backend, cache_dir, dispatch_op.prebuilt_dirs()).native(graph, plan, placement)
        return kernel.run, kernel
    return _target_run(graph, plan, backend, cache_dir), None


def _placement(kind: str, device: str) -> Placement:
    """Where the op runs: for a GPU, the arch of the device TF placed it on."""
    if kind != "gpu":
        return Placement(kind, device)
    from stitchfleet.plugin.native.gpu_device import gpu_arch

    return Placement(kind, device, gpu_arch(device))


def _target_run(graph: Graph, plan: StitchPlan, backend: str, cache_dir: Path) -> Run:
    """A target without a native entry (the sim) behind the seam, by position."""
    built = targets.load(backend, cache_dir).build(graph, plan)
    names = tuple(str(p.attrs["name"]) for p in graph.parameters)

    def run(arrays: Sequence[Array]) -> tuple[tuple[Array, ...], bool]:
        got = built(dict(zip(names, arrays, strict=True)))
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
        *,
        device: str = "",
    ) -> None:
        self.graph = graph
        self.backend = backend
        self.names = tuple(str(p.attrs["name"]) for p in graph.parameters)
        self.outputs = tuple(name for name, _ in graph.outputs)
        self.dtypes = tuple(graph.node(i).dtype.numpy for _, i in graph.outputs)
        self.fault = fault
        compiled_graph, compiled_plan = graph, plan
        if fault is not None:
            compiled_graph = fault.corrupt_graph(graph)
            if compiled_graph is not graph:  # a corrupted graph is a changed cluster: the compiler's re-entry plans it
                compiled_plan = compile_cluster(compiled_graph, plan.cluster, PlanOptions())
        self._run, compiled = compile_run(compiled_graph, compiled_plan, backend, cache_dir, device)
        # the compiled C for the native bridge op (unless a test fault corrupts outputs in Python)
        self.executable = compiled if fault is None or fault.in_graph else None
        self.bridged: Callable[[], int] | None = None  # calls made through the bridge op, once it is wired
        self.faulted: Callable[[], int] | None = None  # the bridge op's NaN/Inf where TF's ops were finite
        self.missed: Callable[[], int] | None = None  # the bridge op's calls of shapes it has no kernel for
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


def poll_faults(bridge: BridgeOp | None, seen: int, kernels: Sequence[ClusterKernel]) -> int:
    """Flags the kernels whose native op found NaN/Inf where TF's ops were finite; returns the process-wide
    fault count to pass next time (one read per step; the per-cluster counts only when that count moved)."""
    if bridge is None or bridge.faults() == seen:
        return seen
    for kernel in kernels:
        faulted = getattr(kernel, "faulted", None)
        if faulted is not None and faulted() > 0:
            kernel.flag("non-finite stitched output (native bridge: TF's own ops were finite)")
    return int(bridge.faults())
