"""Modeled GPU time of a cluster's kernels: global-memory bytes, launches, grid barriers and flops, priced.

Input: a baseline plan (`per_op`, `xla_style`: node groups of the whole graph) or a `StitchPlan` (of the
cluster graph), and a `GpuCost` (H100 or H200 constants). Output: `KernelTraffic` per kernel and
`ModeledTime` per plan, in microseconds. A model, never a measurement: what it counts, what it leaves
out and where each constant comes from is in docs/gpu_time_model.md; nothing here is reported as measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stitchfleet.compiler.baselines import Plan
from stitchfleet.compiler.ir import Graph, Kind, Op
from stitchfleet.compiler.plan.model import Combine, Scheme, StitchPlan

PARTIAL_BYTES = 4  # cross-block partials are float32 (the lowering's accumulator type)
_FREE = frozenset({Op.RESHAPE, Op.BROADCAST})  # read through: a kernel reads what they view
_COMPUTE_FREE = frozenset({Kind.CONSTANT, Kind.PARAMETER, Kind.RESHAPE, Kind.BROADCAST})


@dataclass(frozen=True)
class GpuCost:
    """Device constants of the model (sources: docs/gpu_time_model.md)."""

    name: str
    bytes_per_us: float  # device-to-device copy rate, bytes read + written per microsecond
    launch_us: float  # GPU-side gap a dependent kernel adds on one stream
    barrier_us: float  # one grid barrier of a co-resident grid
    flops_per_us: float  # FP32 non-tensor peak


COSTS = {
    "h100": GpuCost("h100", bytes_per_us=3.0e6, launch_us=1.0, barrier_us=1.5, flops_per_us=67e6),
    "h200": GpuCost("h200", bytes_per_us=4.3e6, launch_us=1.0, barrier_us=1.5, flops_per_us=67e6),
}


@dataclass(frozen=True)
class KernelTraffic:
    """What one kernel moves and waits for."""

    read_bytes: int
    write_bytes: int
    scratch_bytes: int  # global-scheme partials written and read back
    barriers: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes + self.scratch_bytes

    def microseconds(self, cost: GpuCost) -> float:
        """Launch, barriers, then the longer of memory and compute (they overlap on a GPU)."""
        busy = max(self.bytes / cost.bytes_per_us, self.flops / cost.flops_per_us)
        return cost.launch_us + self.barriers * cost.barrier_us + busy


@dataclass(frozen=True)
class ModeledTime:
    """A plan's modeled time on one device (`modeled`: never a measured figure)."""

    planner: str
    cluster: int
    device: str
    microseconds: float
    bytes: int
    launches: int
    barriers: int

    modeled: bool = True


def _nbytes(graph: Graph, node: int) -> int:
    n = graph.node(node)
    return math.prod(n.shape) * n.dtype.itemsize


def _source(graph: Graph, node: int, inside: frozenset[int]) -> int:
    """The tensor a read of `node` really loads: through reshapes and broadcasts not computed inside."""
    while graph.node(node).op in _FREE and node not in inside and graph.node(node).inputs:
        node = graph.node(node).inputs[0]
    return node


def _flops(graph: Graph, nodes: Iterable[int]) -> int:
    """One operation per output element, per input element for a reduction; data movement counts none."""
    total = 0
    for i in nodes:
        n = graph.node(i)
        kind = n.op.kind
        if kind in _COMPUTE_FREE or kind in (Kind.TRANSPOSE, Kind.SLICE, Kind.CONCAT):
            continue
        elements = math.prod(graph.node(n.inputs[0]).shape) if kind is Kind.REDUCE and n.inputs else math.prod(n.shape)
        total += elements
    return total


def _reads(graph: Graph, nodes: frozenset[int], on_chip: frozenset[int]) -> int:
    """Bytes a kernel computing `nodes` loads from global memory, each tensor once; `on_chip`: values it
    gets from shared memory or registers instead."""
    loaded: set[int] = set()
    for i in nodes:
        for operand in graph.node(i).inputs:
            if operand in nodes:
                continue
            source = _source(graph, operand, nodes)
            if source in on_chip or source in nodes or graph.node(source).op is Op.CONSTANT:
                continue
            loaded.add(source)
    return sum(_nbytes(graph, s) for s in loaded)


def baseline_traffic(graph: Graph, plan: Plan) -> list[KernelTraffic]:
    """Per kernel of a baseline plan (on the whole graph): its operands from outside it, its roots written."""
    out = []
    for kernel in plan.kernels:
        nodes = frozenset(kernel.nodes)
        writes = sum(_nbytes(graph, r) for r in kernel.roots)
        out.append(KernelTraffic(_reads(graph, nodes, frozenset()), writes, 0, 0, _flops(graph, nodes)))
    return out


def _launch_groups(plan: StitchPlan) -> list[list[int]]:
    stage_of = {loop.id: loop.stage for loop in plan.loops}
    groups = []
    for launch in plan.launches:
        loops = [loop for loop in plan.loops if stage_of[loop.id] in launch.stages]
        groups.append([g for loop in loops for g in loop.groups])
    return groups


def stitch_traffic(graph: Graph, plan: StitchPlan) -> list[KernelTraffic]:
    """Per launch of a stitch plan (on the cluster graph): cluster inputs and global-scheme values read,
    cluster outputs and global-scheme exports written, combining partials written and read back."""
    produced = {node: g.id for g in plan.groups for node in g.exports}
    global_exports = {e.node for e in plan.edges if e.scheme is Scheme.GLOBAL}
    outputs = {node for _, node in graph.outputs}
    out = []
    for launch, group_ids in zip(plan.launches, _launch_groups(plan), strict=True):
        reads, writes, scratch, flops = 0, 0, 0, 0
        loaded: set[int] = set()
        for gid in group_ids:
            group = plan.group(gid)
            nodes = frozenset((*group.roots, *group.inlined))
            flops += _flops(graph, nodes)
            for i in nodes:
                for operand in graph.node(i).inputs:
                    source = _source(graph, operand, nodes)
                    if source in nodes or graph.node(source).op is Op.CONSTANT or source in loaded:
                        continue
                    producer = produced.get(source)
                    scheme = plan.edge_scheme(producer, gid) if producer is not None else Scheme.GLOBAL
                    if producer == gid or scheme is not Scheme.GLOBAL:
                        continue
                    loaded.add(source)
                    reads += _nbytes(graph, source)
            writes += sum(_nbytes(graph, n) for n in set(group.roots) & (outputs | global_exports))
            if group.mapping.combines:
                factor = 2 if group.combine is not Combine.ATOMIC else 1  # atomics combine at L2 as they land
                scratch += factor * group.mapping.partial_count * PARTIAL_BYTES * len(group.roots)
        out.append(KernelTraffic(reads, writes, scratch, launch.grid_barriers, flops))
    return out


def total(planner: str, cluster: int, traffic: Sequence[KernelTraffic], cost: GpuCost) -> ModeledTime:
    """The plan's kernels back to back on one stream."""
    return ModeledTime(
        planner,
        cluster,
        cost.name,
        round(sum(k.microseconds(cost) for k in traffic), 3),
        sum(k.bytes for k in traffic),
        len(traffic),
        sum(k.barriers for k in traffic),
    )
