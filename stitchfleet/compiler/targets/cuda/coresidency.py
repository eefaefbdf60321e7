"""Fit a cluster's kernels to what the real device holds at once, re-planning for fewer blocks.

Input: a cluster graph, its index, the plan options, and `holds(kernel) -> int`: how many blocks
of that compiled kernel the device keeps resident together (on a GPU: the launch library's
`occupancy` of the loaded function x the SM count). Output: `Fitted` (the rendered kernels and
what was re-planned, as data) or `CoresidencyError` with the reason, which leaves the cluster to
TF. Why: the planner sizes a grid-barrier kernel's grid from a model with 32 registers per thread;
the compiled kernel may use more and hold fewer blocks per SM, and a grid larger than what is
resident at once would deadlock at its barrier (a cooperative launch refuses it instead). Blocks
loop over tasks (vertical packing), so a smaller wave is always a correct plan, only slower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.signature import CudaKernel

MAX_REPLANS = 3


class CoresidencyError(RuntimeError):
    """No plan of the cluster fits the device at once: the cluster stays with TF (the reason says why)."""


@dataclass(frozen=True)
class Fitted:
    """Kernels whose grid-barrier grids all fit at once, and the re-plans it took (empty: none)."""

    kernels: tuple[CudaKernel, ...]
    options: PlanOptions
    replans: tuple[str, ...]


def _render(graph: Graph, cluster: int, options: PlanOptions) -> tuple[CudaKernel, ...]:
    return tuple(render_kernel(k) for k in lower(graph, plan_cluster(graph, cluster, options)).kernels)


def fit(graph: Graph, cluster: int, options: PlanOptions, holds: Callable[[CudaKernel], int]) -> Fitted:
    """The cluster's kernels planned so that each grid-barrier kernel's grid is at most what `holds` says."""
    current, notes = options, list[str]()
    for _ in range(MAX_REPLANS + 1):
        kernels = _render(graph, cluster, current)
        over = [(k, holds(k)) for k in kernels if k.grid_barrier]
        over = [(k, fits) for k, fits in over if k.launch.grid > fits]
        if not over:
            return Fitted(kernels, current, tuple(notes))
        kernel, fits = min(over, key=lambda item: item[1])
        if fits < 1:
            raise CoresidencyError(f"cluster {cluster}: kernel {kernel.name} does not fit on one SM at all")
        notes.append(
            f"{kernel.name}: grid {kernel.launch.grid} with a grid barrier, the device holds {fits} at once:"
            f" re-planned with at most {fits} blocks per wave"
        )
        if current.max_wave is not None and fits >= current.max_wave:
            break  # the cap did not shrink the grid: another plan would be the same one
        current = dataclasses.replace(current, max_wave=fits)
    raise CoresidencyError(f"cluster {cluster}: no plan fits the device at once ({'; '.join(notes)})")
