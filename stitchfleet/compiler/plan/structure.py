"""Stages, loops and shared memory (AStitch §4.4): where the barriers go and what lives in smem.

Input: mapped groups and edges with provisional schemes. Output: the final edges
(regional edges demoted to global where the stage order or shared memory forbids
them), `Loop`s by stage, `SharedBuffer`s with offsets reused by liveness, the
kernel's shared memory bytes, and `Choice` records for every demotion.

A group's stage is the first after the grid barrier that makes its global inputs
ready (a producer combining by partials needs one more stage to finalize them); a
regional edge needs producer and consumer in the same stage and partition, so they
share one task loop. Shared memory: each regional value takes rows-per-task elements
in its loop from its producer to its last consumer; buffers whose lifetimes do not
overlap share space; loops run one after another, so they all start at offset 0;
block reductions' per-warp partials (accumulator dtype) follow, 16-byte aligned. The
lowering places its shared views at exactly these offsets.
When the largest loop does not fit the limit, the largest regional buffer is demoted
to global and the plan is redone (one by one, as AStitch does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.ir import DType, Graph
from stitchfleet.compiler.plan.model import Choice, Combine, Edge, Group, Loop, MappingKind, Scheme, SharedBuffer

_BLOCK_REDUCE = frozenset({MappingKind.BLOCK_PER_ROW, MappingKind.SPLIT_ROW})


@dataclass(frozen=True)
class Structure:
    edges: tuple[Edge, ...]
    loops: tuple[Loop, ...]
    shared: tuple[SharedBuffer, ...]
    smem_bytes: int
    choices: tuple[Choice, ...]


def _demote(edges: list[Edge], pick: Edge, reason: str) -> list[Edge]:
    return [dataclasses.replace(e, scheme=Scheme.GLOBAL, reason=reason) if e == pick else e for e in edges]


def _stages(groups: Sequence[Group], edges: list[Edge]) -> tuple[list[int], list[Edge], list[Choice]]:
    """Stage per group; regional edges whose producer ends before the consumer's stage are demoted."""
    choices: list[Choice] = []
    while True:
        stage = [0] * len(groups)
        for g in groups:
            for e in (e for e in edges if e.consumer == g.id):
                ready = stage[e.producer] + (2 if groups[e.producer].combine is Combine.PARTIALS else 1)
                stage[g.id] = max(stage[g.id], ready if e.scheme is Scheme.GLOBAL else stage[e.producer])
        late = next((e for e in edges if e.scheme is Scheme.REGIONAL and stage[e.producer] != stage[e.consumer]), None)
        if late is None:
            return stage, edges, choices
        why = f"group {late.consumer} also waits for values only ready after a grid barrier"
        choices.append(Choice("demote", f"edge {late.producer}->{late.consumer}", f"regional refused: {why}"))
        edges = _demote(edges, late, f"global: {why}")


def _loops(groups: Sequence[Group], edges: list[Edge], stage: list[int]) -> list[Loop]:
    parent = list(range(len(groups)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for e in edges:
        if e.scheme is Scheme.REGIONAL:
            parent[find(e.consumer)] = find(e.producer)
    members: dict[int, list[int]] = {}
    for g in groups:
        members.setdefault(find(g.id), []).append(g.id)
    loops: list[tuple[int, tuple[int, ...], int, tuple[int, ...]]] = [
        (stage[ids[0]], tuple(ids), groups[ids[0]].mapping.tasks, ()) for ids in members.values()
    ]
    for g in groups:
        if g.combine is Combine.PARTIALS:
            loops.append((stage[g.id] + 1, (), _finalize_tasks(g), (g.id,)))
    loops.sort(key=lambda item: (item[0], min(item[1] or item[3])))
    return [Loop(i, s, ids, tasks, fin) for i, (s, ids, tasks, fin) in enumerate(loops)]


def _finalize_tasks(group: Group) -> int:
    """A thread per reduced value combines its partials."""
    m = group.mapping
    values = m.cols if m.kind is MappingKind.COLUMN_TILES else m.rows
    return -(-values // m.block_threads)


def _buffers(graph: Graph, groups: Sequence[Group], edges: list[Edge], loops: list[Loop]) -> list[SharedBuffer]:
    out: list[SharedBuffer] = []
    for loop in loops:
        position = {g: i for i, g in enumerate(loop.groups)}
        lifetimes: dict[int, tuple[int, int, int]] = {}
        for e in edges:
            if e.scheme is Scheme.REGIONAL and e.consumer in position:
                first, last = position[e.producer], position[e.consumer]
                _, old_first, old_last = lifetimes.get(e.node, (0, first, last))
                size = groups[e.producer].mapping.rows_per_task * graph.node(e.node).dtype.itemsize
                lifetimes[e.node] = (size, min(old_first, first), max(old_last, last))
        out += _assign_offsets(loop.id, lifetimes)
    return out


def _assign_offsets(loop: int, lifetimes: dict[int, tuple[int, int, int]]) -> list[SharedBuffer]:
    """First fit by start: a buffer reuses space of buffers whose lifetimes ended before it starts."""
    placed: list[SharedBuffer] = []
    for node, (size, first, last) in sorted(lifetimes.items(), key=lambda kv: (kv[1][1], kv[0])):
        busy = sorted((b.offset, b.offset + b.bytes) for b in placed if not (b.last < first or last < b.first))
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, _align(end))
        placed.append(SharedBuffer(node, loop, offset, size, first, last))
    return placed


def _align(offset: int) -> int:
    return -(-offset // 16) * 16


def accumulator(dtype: DType) -> DType:
    """f16 and bf16 reductions accumulate in f32, as evaluate (and TensorFlow's GPU kernels) do."""
    return DType.F32 if dtype in (DType.F16, DType.BF16) else dtype


def reduce_scratch_bytes(graph: Graph, groups: Sequence[Group]) -> int:
    """A block reduction's per-warp partials in its accumulator dtype; one space reused by all groups."""
    sizes = [
        g.mapping.block_threads // WARP * accumulator(graph.node(g.dominant).dtype).itemsize
        for g in groups
        if g.mapping.kind in _BLOCK_REDUCE
    ]
    return max(sizes, default=0)


def smem_layout(shared: Sequence[SharedBuffer], scratch: int) -> tuple[int, int]:
    """(byte offset of the block-reduce scratch, total bytes): the scratch goes after the regional values."""
    peak = max((b.offset + b.bytes for b in shared), default=0)
    if not scratch:
        return peak, peak
    return _align(peak), _align(peak) + scratch


def build(graph: Graph, groups: Sequence[Group], edges: Sequence[Edge], smem_limit: int) -> Structure:
    """Stages, loops and shared memory within `smem_limit` bytes, demoting regional edges as needed."""
    current = list(edges)
    choices: list[Choice] = []
    scratch = reduce_scratch_bytes(graph, groups)
    while True:
        stage, current, demoted = _stages(groups, current)
        choices += demoted
        loops = _loops(groups, current, stage)
        shared = _buffers(graph, groups, current, loops)
        total = smem_layout(shared, scratch)[1]
        if total <= smem_limit or not shared:
            return Structure(tuple(current), tuple(loops), tuple(shared), total, tuple(choices))
        largest = max(shared, key=lambda b: (b.bytes, b.node))
        why = f"shared memory {total} B exceeds the {smem_limit} B limit; value node {largest.node} goes to global"
        for e in [e for e in current if e.node == largest.node and e.scheme is Scheme.REGIONAL]:
            choices.append(Choice("demote", f"edge {e.producer}->{e.consumer}", f"regional refused: {why}"))
            current = _demote(current, e, f"global: {why}")
