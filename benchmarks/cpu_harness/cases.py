"""Which clusters the CPU benchmark runs: the saved workload clusters and the suite at CPU-sized shapes.

Input: the workload folders (benchmarks/workloads/*/cluster_*.json), the suite builders, and
filters: name substrings, a scale for the suite's row count, an element-count ceiling.
Output: `CpuCase` items (name, standalone cluster graph), workloads first, in a stable order.
A suite case becomes one item per cluster `find_clusters` makes of it (`#0`, `#1`...).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suite import build_case
from stitchfleet.compiler.ir import Graph, Op, load
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"
MIN_CLUSTER_OPS = 8  # what the plugin's scope pass uses for a training step's clusters

SUITE_CPU: dict[str, tuple[tuple[int, ...], str]] = {
    "layernorm_fwd": ((4096, 1024), "f32"),
    "layernorm_bwd": ((4096, 1024), "f32"),
    "rmsnorm_fwd": ((4096, 1024), "f32"),
    "softmax_fwd": ((4096, 1024), "f32"),
    "softmax_bwd": ((4096, 1024), "f32"),
    "bias_gelu_fwd": ((4096, 1024), "f32"),
    "gelu_bwd_bias_grad": ((4096, 1024), "f32"),
    "dropout_residual_layernorm": ((4096, 1024), "f32"),
    "cross_entropy_fwd": ((512, 8192), "f32"),
    "astitch_fig7": ((4096, 1024), "f32"),
}


@dataclass(frozen=True)
class CpuCase:
    name: str  # workload/cluster_NN, or suite/<case>_<shape>_<dtype>#<cluster>
    graph: Graph

    @property
    def elements(self) -> int:
        """Elements of every value the cluster computes or reads (constants left out)."""
        return sum(math.prod(n.shape) for n in self.graph.nodes if n.op is not Op.CONSTANT)

    @property
    def ops(self) -> int:
        """Memory-intensive ops (constants left out)."""
        return sum(1 for n in self.graph.nodes if n.op.is_memory_intensive and n.op is not Op.CONSTANT)


def scaled(shape: tuple[int, ...], scale: float) -> tuple[int, ...]:
    """The shape with its leading (row) dimension scaled, at least 1 row; the rows keep their length."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale:g}")
    return (max(1, round(shape[0] * scale)), *shape[1:])


def _matches(name: str, only: Sequence[str]) -> bool:
    return not only or any(o in name for o in only)


def workload_cases(only: Sequence[str] = (), root: Path = WORKLOADS) -> Iterator[CpuCase]:
    """The saved clusters whose name matches (the others are not even loaded)."""
    for path in sorted(root.glob("*/cluster_*.json")):
        name = f"{path.parent.name}/{path.stem}"
        if _matches(name, only):
            yield CpuCase(name, load(path))


def suite_cases(only: Sequence[str] = (), scale: float = 1.0) -> Iterator[CpuCase]:
    """Every cluster of each matching suite case at its CPU shape, scaled (others are not built)."""
    for name, (full, dtype) in SUITE_CPU.items():
        shape = scaled(full, scale)
        label = f"suite/{name}_{'x'.join(map(str, shape))}_{dtype}"
        if not (_matches(label, only) or any(o.startswith(f"{label}#") for o in only)):
            continue
        graph = build_case(name, shape, dtype)
        for i, cluster in enumerate(find_clusters(graph, MIN_CLUSTER_OPS).clusters):
            yield CpuCase(f"{label}#{i}", extract(graph, cluster.nodes))


def select(
    only: Sequence[str] = (), scale: float = 1.0, max_elements: int | None = None, root: Path = WORKLOADS
) -> list[CpuCase]:
    """Cases whose name contains any of `only` (all when empty) and whose elements fit under the ceiling."""
    if max_elements is not None and max_elements <= 0:
        raise ValueError(f"max_elements must be positive, got {max_elements}")
    found = [*workload_cases(only, root), *suite_cases(only, scale)]
    return [c for c in found if _matches(c.name, only) and (max_elements is None or c.elements <= max_elements)]
