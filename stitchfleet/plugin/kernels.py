"""One stitched cluster as a numpy callable: the bridge's target inside `tf.numpy_function`.

Input: a cluster graph (compiler artifact), its stitch plan, a backend name (`cpu`: C +
OpenMP, `sim`: the kernel-IR interpreter; `auto` means `cpu`, the only backend a TF CPU job
can call) and an optional test-only `Fault`. Output: `ClusterKernel`, called with the
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

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import PlanOptions, StitchPlan, plan_cluster
from stitchfleet.compiler.runtime.cpu import CpuExecutable
from stitchfleet.plugin.faults import Fault

log = logging.getLogger("stitchfleet.plugin")
Array = npt.NDArray[Any]
Run = Callable[[Sequence[Array]], tuple[tuple[Array, ...], bool]]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run clusters in this process; the message says why."""


def resolve_backend(name: str) -> str:
    """The backend a TF job uses: `auto` -> `cpu` (a GPU bridge op does not exist yet)."""
    if name == "auto":
        return "cpu"
    if name == "cuda":
        raise BackendUnavailableError("the cuda bridge (a TF custom op on TF's stream) is not built yet")
    if name not in ("cpu", "sim"):
        raise BackendUnavailableError(f"unknown backend {name!r} (expected auto, cpu or sim)")
    return name


def nonfinite(values: Sequence[Array]) -> bool:
    """Whether a floating-point array among `values` holds NaN or Inf (numpy; the cpu backend tests in C)."""
    return not all(np.isfinite(v).all() for v in values if np.issubdtype(v.dtype, np.floating))


def compile_run(graph: Graph, plan: StitchPlan, backend: str, cache_dir: Path) -> tuple[Run, CpuExecutable | None]:
    """Compiles one cluster for `backend`: arrays by position -> (outputs by position, NaN/Inf flag), and
    the compiled C when the backend is `cpu` (what the native bridge op calls)."""
    if backend == "cpu":
        from stitchfleet.compiler.runtime.cpu import compile_cluster

        executable = compile_cluster(graph, cache_dir, plan)
        return executable.run, executable
    return _lowered_run(graph, plan), None


def _lowered_run(graph: Graph, plan: StitchPlan) -> Run:
    from stitchfleet.compiler.lower import lower, run_lowered

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
            if compiled_graph is not graph:
                compiled_plan = plan_cluster(compiled_graph, plan.cluster, PlanOptions())
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
