"""The stitch planner: one cluster graph in, a `StitchPlan` with reasons out (AStitch §4).

Input: a cluster as a standalone `Graph`, its cluster id, and `PlanOptions` (device
profile name, forced row mapping for tests, grid barriers allowed, shared memory limit).
Output: `StitchPlan`: groups with thread mappings, edges with schemes, loops and
stages, shared buffers, and launches: one kernel wherever the resources allow;
without grid barriers, one kernel per stage (the fewest that keep global edges safe).
An output that repeats an earlier output's value (the same node, or a reshape of it: plan/repeats.py) is
planned once: the plan says which (`StitchPlan.repeats`, with a `repeat` choice), and targets store it once.

Launch configuration follows "assume, relax, apply": blocks of 1024 threads (or the
device's maximum) with 32 registers/thread give the blocks per wave the mappings
are planned with; the grid never exceeds one wave (blocks loop over tasks: vertical
packing), and a kernel with a grid barrier leaves `BARRIER_HEADROOM` of that wave free
for other streams' blocks (NCCL's) beside its cooperative launch. The register cap is
then relaxed per kernel to the largest value keeping the blocks per SM that kernel's
grid needs (ceil(grid / SMs)) resident: a grid of at most one block per SM may use 64
registers a thread where a full wave of two allows 32 (the renderer's launch bounds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stitchfleet.compiler.devices import Device, device, occupancy, relax_registers
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import groups as grouping
from stitchfleet.compiler.plan import mapping as mappings
from stitchfleet.compiler.plan.combine import combine_choice
from stitchfleet.compiler.plan.locality import aligned
from stitchfleet.compiler.plan.model import (
    Choice,
    Edge,
    Group,
    GroupKind,
    Launch,
    Loop,
    Mapping,
    MappingKind,
    Scheme,
    StitchPlan,
)
from stitchfleet.compiler.plan.repeats import output_repeats, stored_graph
from stitchfleet.compiler.plan.structure import Structure, build, reduce_scratch_bytes, smem_layout

BLOCK = 1024
ASSUMED_REGISTERS = 32
BARRIER_HEADROOM = (
    1 / 8
)  # of the co-resident wave a grid-barrier kernel leaves free (compiler/targets/cuda/resources.py)


@dataclass(frozen=True)
class PlanOptions:
    device: str = "h200"
    force_row_mapping: MappingKind | None = None  # tests: force one row-reduction path
    grid_barrier: bool = True
    smem_limit: int | None = None  # bytes; default: the device's per-block limit
    deterministic: bool = False  # refuse atomic cross-block combines (bitwise reproducible sums)
    # Blocks per wave at most: the co-resident grid the real device measured for a compiled kernel
    # (its real registers and shared memory), when the model's wave does not fit there.
    max_wave: int | None = None


@dataclass(frozen=True)
class _Context:
    graph: Graph
    dev: Device
    block: int
    wave: int
    options: PlanOptions
    owner: dict[int, int]  # node -> group, for dominants and tails


def _reduce_group(ctx: _Context, raw: grouping.RawGroup) -> Mapping:
    node = ctx.graph.node(raw.dominant)
    operand = ctx.graph.node(node.inputs[0])
    return mappings.reduce_mapping(node, operand, ctx.block, ctx.wave, ctx.options.force_row_mapping)


def _imports_aligned(ctx: _Context, raw: grouping.RawGroup, producer: int, rows: int, owner: dict[int, int]) -> bool:
    stops = [n for n, g in owner.items() if g != raw.id]
    values = [v for p, v in raw.imports if p == producer]
    return all(aligned(ctx.graph, raw.roots, stops, v, rows) for v in values)


def _adopt(
    ctx: _Context, raw: grouping.RawGroup, done: Sequence[Group], owner: dict[int, int]
) -> tuple[Mapping, int | None]:
    """Proactive adaptation: an element-wise group takes an aligned producer's row partition."""
    elements = math.prod(ctx.graph.node(raw.dominant).shape)
    for producer in sorted({p for p, _ in raw.imports}, reverse=True):
        partition = done[producer].mapping.partition
        if partition is None or elements % partition[0]:
            continue
        if _imports_aligned(ctx, raw, producer, partition[0], owner):
            return mappings.rowwise_mapping(partition, elements, ctx.block, ctx.wave, producer), producer
    return mappings.elementwise_mapping(elements, ctx.block, ctx.wave), None


def _edge(ctx: _Context, raw: grouping.RawGroup, mapping: Mapping, producer: Group, value: int) -> Edge:
    partition = producer.mapping.partition
    if partition is None:
        why = f"global: group {producer.id} ({producer.mapping.kind.value}) spreads a value over several blocks"
        return Edge(producer.id, raw.id, value, Scheme.GLOBAL, why)
    if mapping.partition != partition:
        why = f"global: partitions differ (rows, rows/task) {partition} vs {mapping.partition}"
        return Edge(producer.id, raw.id, value, Scheme.GLOBAL, why)
    stops = [n for n, g in ctx.owner.items() if g != raw.id]
    if not aligned(ctx.graph, raw.roots, stops, value, partition[0]):
        why = "global: the consumer's rows read elements other blocks produce"
        return Edge(producer.id, raw.id, value, Scheme.GLOBAL, why)
    why = f"regional: the consumer reads only its block's {partition[1]} row(s) of this value"
    return Edge(producer.id, raw.id, value, Scheme.REGIONAL, why)


def _groups_and_edges(ctx: _Context, raw: grouping.Grouping) -> tuple[list[Group], list[Edge]]:
    done: list[Group] = []
    edges: list[Edge] = []
    for r in raw.groups:
        if r.kind is GroupKind.REDUCE:
            mapping, reason = _reduce_group(ctx, r), r.reason
        else:
            mapping, adopted = _adopt(ctx, r, done, raw.owner)
            reason = r.reason if adopted is None else f"{r.reason}; adapts to group {adopted}"
        node = ctx.graph.node(r.dominant)
        layout = None
        if r.kind is GroupKind.REDUCE:
            layout = mappings.reduce_view(ctx.graph.node(node.inputs[0]).shape, node.attrs.get_ints("axes"))[0]
        exports = raw.exports.get(r.id, ())
        done.append(Group(r.id, r.kind, r.dominant, r.tail, r.inlined, exports, r.outputs, layout, mapping, reason))
        edges += [_edge(ctx, r, mapping, done[p], v) for p, v in r.imports]
    return done, edges


def _combines(ctx: _Context, groups: list[Group]) -> tuple[list[Group], list[Choice]]:
    """Each split reduction's cross-block combine (partials or atomics), and why."""
    out, choices = [], []
    opts = ctx.options
    for group in groups:
        if not group.mapping.combines:
            out.append(group)
            continue
        how, why = combine_choice(ctx.graph, group, one_kernel=opts.grid_barrier, deterministic=opts.deterministic)
        out.append(dataclasses.replace(group, combine=how))
        choices.append(Choice("combine", f"group {group.id}", why))
    return out, choices


def _launches(ctx: _Context, structure: Structure, groups: Sequence[Group]) -> list[Launch]:
    stages = sorted({loop.stage for loop in structure.loops})
    per_kernel = [stages] if ctx.options.grid_barrier else [[s] for s in stages]
    return [
        _launch(ctx, i, ks, [lp for lp in structure.loops if lp.stage in ks], _smem(ctx, structure, groups, ks))
        for i, ks in enumerate(per_kernel)
    ]


def _smem(ctx: _Context, structure: Structure, groups: Sequence[Group], stages: Sequence[int]) -> tuple[int, int]:
    """(block-reduce scratch offset, shared bytes) of the kernel running `stages`: what its loops use."""
    loops = [lp for lp in structure.loops if lp.stage in stages]
    ids = {lp.id for lp in loops}
    reducing = [groups[g] for lp in loops for g in lp.groups]
    scratch = reduce_scratch_bytes(ctx.graph, reducing)
    return smem_layout([b for b in structure.shared if b.loop in ids], scratch)


def _capped(options: PlanOptions, wave: int) -> int:
    return wave if options.max_wave is None else max(1, min(wave, options.max_wave))


def _launch(ctx: _Context, kernel: int, stages: Sequence[int], loops: Sequence[Loop], smem: tuple[int, int]) -> Launch:
    scratch_offset, smem_bytes = smem
    occ = occupancy(ctx.dev, ctx.block, ASSUMED_REGISTERS, smem_bytes)
    tasks = max(loop.tasks for loop in loops)
    wave = _capped(ctx.options, occ.blocks_per_wave)
    barriers = len(stages) - 1
    # the modelled wave less the headroom; a wave the real device measured (max_wave) caps it as it is
    usable = math.floor(occ.blocks_per_wave * (1 - BARRIER_HEADROOM)) if barriers else occ.blocks_per_wave
    usable = max(1, usable if ctx.options.max_wave is None else min(usable, ctx.options.max_wave))
    grid = min(tasks, usable)
    # blocks per SM this grid needs resident; a grid-barrier grid keeps its headroom at the relaxed cap too
    room = ctx.dev.sms * (1 - BARRIER_HEADROOM) if barriers else ctx.dev.sms
    needed = math.ceil(grid / room)
    registers = relax_registers(ctx.dev, ctx.block, smem_bytes, ASSUMED_REGISTERS, blocks_per_sm=needed)
    why = f"{occ.reason}; {tasks} task(s) per loop at most -> grid {grid}"
    if wave < occ.blocks_per_wave:
        why += f" (wave capped at {wave}: what the device holds at once of the compiled kernel)"
    if barriers:
        why += f"; {barriers} grid barrier(s): grid within one wave less {BARRIER_HEADROOM:.1%} headroom ({usable})"
    why += f"; register cap relaxed to {registers} keeping the {needed} block(s)/SM the grid needs"
    return Launch(
        kernel,
        tuple(stages),
        grid,
        ctx.block,
        wave,
        registers,
        smem_bytes,
        barriers,
        why,
        scratch_offset,
    )


def _independent(structure: Structure) -> list[Choice]:
    choices = []
    for stage in sorted({lp.stage for lp in structure.loops}):
        loops = [lp for lp in structure.loops if lp.stage == stage and lp.groups]
        if len(loops) > 1:
            ids = [list(lp.groups) for lp in loops]
            choices.append(
                Choice("independent", f"stage {stage}", f"group sets {ids} share no value: packed side by side")
            )
    return choices


def plan_cluster(graph: Graph, cluster: int = 0, options: PlanOptions | None = None) -> StitchPlan:
    """The stitch plan of one cluster graph (see the module docstring)."""
    opts = options or PlanOptions()
    if opts.force_row_mapping is not None and opts.force_row_mapping not in mappings.ROW_KINDS:
        raise mappings.MappingError(f"cannot force {opts.force_row_mapping.value}: not a row-reduction mapping")
    dev = device(opts.device)
    block = min(BLOCK, dev.threads_per_block)
    wave = _capped(opts, occupancy(dev, block, ASSUMED_REGISTERS).blocks_per_wave)
    repeats, repeated = output_repeats(graph)
    graph = stored_graph(graph, repeats)  # the same node ids: targets read the plan beside the cluster's graph
    raw = grouping.group(graph)
    ctx = _Context(graph, dev, block, wave, opts, raw.owner)
    groups, edges = _groups_and_edges(ctx, raw)
    groups, combined = _combines(ctx, groups)
    limit = dev.smem_per_block if opts.smem_limit is None else min(opts.smem_limit, dev.smem_per_block)
    structure = build(graph, groups, edges, limit)
    launches = _launches(ctx, structure, groups)
    choices = [*raw.choices, *(Choice("map", f"group {g.id}", g.mapping.reason) for g in groups)]
    choices += combined
    choices += [Choice("scheme", f"edge {e.producer}->{e.consumer} value {e.node}", e.reason) for e in structure.edges]
    choices += [*structure.choices, *_independent(structure), *repeated]
    if not opts.grid_barrier and len(launches) > 1:
        why = f"grid barriers are not allowed: {len(launches)} kernels, one per stage"
        choices.append(Choice("split", f"cluster {cluster}", f"one kernel refused: {why}"))
    return StitchPlan(
        cluster,
        dev.name,
        tuple(groups),
        structure.edges,
        structure.loops,
        structure.shared,
        tuple(launches),
        tuple(choices),
        repeats if any(r >= 0 for r in repeats) else (),
    )
