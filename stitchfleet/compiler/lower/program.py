"""Lowering: a `StitchPlan` and its cluster graph -> kernel IR kernels, plus how to call them.

Input: the cluster graph (as planned) and its `StitchPlan`. Output: `Lowered`: the
kernels in launch order, and the mapping from graph parameter/output names to
buffer names (targets/program.py runs them with graph-shaped arrays on a target).

Each planned launch becomes one kernel: its stages in order with a grid barrier
between them; each loop of a stage is a task loop (block b runs tasks b, b+grid, ...:
vertical packing) over its groups, with `__syncthreads` after each group (regional
values are handed over in shared memory) and after each loop (shared memory is
reused). Global values and split-reduction partials live in scratch buffers; when
the plan splits a cluster into several kernels they are kernel outputs instead, so
they survive from one launch to the next. Shared memory follows the plan's layout
exactly: one arena per kernel, a typed view per regional value at its planned offset
(values whose lifetimes do not overlap share bytes), and a per-warp view per
accumulator dtype at the launch's scratch offset (block reductions leave it free, so
all dtypes share it); a kernel declares only the views its own loops use, so its
shared bytes are the launch's `smem_bytes`, which the occupancy model assumed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from stitchfleet.compiler.devices import device
from stitchfleet.compiler.ir import DType, Graph
from stitchfleet.compiler.kernel import blocks
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower.phases import Phase, finalize_task, group_task
from stitchfleet.compiler.lower.values import Namer, Sources
from stitchfleet.compiler.plan import Combine, Launch, Loop, Scheme, SharedBuffer, StitchPlan
from stitchfleet.compiler.plan.structure import accumulator


@dataclass(frozen=True)
class Lowered:
    kernels: tuple[k.Kernel, ...]
    inputs: tuple[tuple[str, str], ...]  # (graph parameter name, buffer name)
    # (graph output name, buffer name): an output repeating an earlier one's value (`StitchPlan.repeats`) names
    # that output's buffer, which holds its bytes (the kernels store each value once)
    outputs: tuple[tuple[str, str], ...]

    @property
    def repeats(self) -> tuple[int, ...]:
        """Per output, the earlier output whose buffer it names, or -1."""
        first: dict[str, int] = {}
        repeats = []
        for j, (_, buf) in enumerate(self.outputs):
            source = first.setdefault(buf, j)
            repeats.append(source if source != j else -1)
        return tuple(repeats)


def _ident(prefix: str, name: str) -> str:
    return prefix + re.sub(r"\W", "_", name)


@dataclass
class _Buffers:
    inputs: dict[int, k.Buffer]
    outputs: dict[int, list[k.Buffer]]
    scratch: dict[int, k.Buffer]
    partials: dict[int, k.Buffer]
    shared: dict[int, k.SharedBuffer]  # regional value -> its arena view


def _buffers(graph: Graph, plan: StitchPlan, persistent: bool) -> _Buffers:
    temp = k.Role.OUTPUT if persistent else k.Role.SCRATCH
    inputs = {
        p.id: k.Buffer(_ident("in_", str(p.attrs["name"])), p.dtype, math.prod(p.shape), k.Role.INPUT)
        for p in graph.parameters
    }
    outputs: dict[int, list[k.Buffer]] = {}
    for j, (name, node_id) in enumerate(graph.outputs):
        if plan.repeat_of(j) >= 0:
            continue  # its value is an earlier output's: that buffer is stored, this one is not a parameter
        node = graph.node(node_id)
        outputs.setdefault(node_id, []).append(
            k.Buffer(_ident("out_", name), node.dtype, math.prod(node.shape), k.Role.OUTPUT)
        )
    scratch: dict[int, k.Buffer] = {}
    for e in plan.edges:
        node = graph.node(e.node)
        if e.scheme is Scheme.GLOBAL:
            scratch[e.node] = k.Buffer(f"tmp_{e.node}", node.dtype, math.prod(node.shape), temp)
    shared = {b.node: _view(graph, b) for b in plan.shared}
    partials = {g.id: _partials(graph, g.id, plan, temp) for g in plan.groups if g.combine is Combine.PARTIALS}
    return _Buffers(inputs, outputs, scratch, partials, shared)


def _view(graph: Graph, planned: SharedBuffer) -> k.SharedBuffer:
    """A regional value's rows-per-task elements at its planned arena offset."""
    dtype = graph.node(planned.node).dtype
    return k.SharedBuffer(f"smem_{planned.node}", dtype, planned.bytes // dtype.itemsize, planned.offset)


def _partials(graph: Graph, group_id: int, plan: StitchPlan, role: k.Role) -> k.Buffer:
    g = plan.group(group_id)
    return k.Buffer(f"part_{group_id}", accumulator(graph.node(g.dominant).dtype), g.mapping.partial_count, role)


def _loop_body(ph: Phase, plan: StitchPlan, loop: Loop) -> tuple[k.Stmt, ...]:
    body: list[k.Stmt] = []
    rows_per_task = plan.group(loop.groups[0]).mapping.rows_per_task if loop.groups else 1
    row0 = k.Var(ph.names("row0"), DType.I64)
    body.append(k.Assign(row0, k.mul(ph.task, k.i64(rows_per_task))))
    ph.sources.row0 = row0
    for gid in loop.groups:
        body += [*group_task(ph, plan.group(gid)), k.SyncThreads()]
    for gid in loop.finalize:
        body += finalize_task(ph, plan.group(gid))
    return tuple(body)


def _stage(ph: Phase, plan: StitchPlan, stage: int) -> list[k.Stmt]:
    out: list[k.Stmt] = []
    for loop in (lp for lp in plan.loops if lp.stage == stage):
        task = k.Var(ph.names("t"), DType.I64)
        ph.task = task
        body = _loop_body(ph, plan, loop)
        out += [
            k.Comment(f"loop {loop.id}: {loop.tasks} task(s)"),
            blocks.block_task_loop(task, k.i64(loop.tasks), body),
            k.SyncThreads(),
        ]
    return out


def _kernel(graph: Graph, plan: StitchPlan, launch: Launch, bufs: _Buffers, name: str) -> k.Kernel:
    names = Namer()
    reduce_smem: dict[DType, k.SharedBuffer] = {}

    def warp_partials(dtype: DType) -> k.SharedBuffer:
        if dtype not in reduce_smem:
            warps = launch.block_threads // k.WARP_SIZE
            reduce_smem[dtype] = k.SharedBuffer(f"warp_{dtype.value}", dtype, warps, launch.scratch_offset)
        return reduce_smem[dtype]

    sources = Sources(bufs.inputs, bufs.shared, bufs.scratch)
    task = k.Var("t", DType.I64)
    ph = Phase(graph, plan, sources, bufs.outputs, bufs.partials, warp_partials, names, task, launch.block_threads)
    body: list[k.Stmt] = []
    for i, stage in enumerate(launch.stages):
        if i:
            body.append(k.GridSync())
        body += _stage(ph, plan, stage)
    params = (
        *bufs.inputs.values(),
        *(b for bs in bufs.outputs.values() for b in bs),
        *bufs.scratch.values(),
        *bufs.partials.values(),
    )
    loops = {lp.id for lp in plan.loops if lp.stage in launch.stages}
    regional = tuple(bufs.shared[b.node] for b in plan.shared if b.loop in loops)
    limit = device(plan.device).smem_per_block
    cfg = k.Launch(launch.grid, launch.block_threads, launch.max_coresident_blocks, launch.registers, 0, limit)
    return k.Kernel(name, tuple(params), (*regional, *reduce_smem.values()), cfg, tuple(body), doc=launch.reason)


def lower(graph: Graph, plan: StitchPlan) -> Lowered:
    """Kernel IR for every launch of the plan."""
    persistent = plan.kernel_count > 1
    bufs = _buffers(graph, plan, persistent)
    kernels = tuple(
        _kernel(graph, plan, launch, bufs, f"stitch_c{plan.cluster}_k{launch.kernel}") for launch in plan.launches
    )
    inputs = tuple((str(graph.node(n).attrs["name"]), b.name) for n, b in bufs.inputs.items())
    names = [name for name, _ in graph.outputs]
    buffers = [
        _ident("out_", names[plan.repeat_of(j)] if plan.repeat_of(j) >= 0 else name) for j, name in enumerate(names)
    ]
    return Lowered(kernels, inputs, tuple(zip(names, buffers, strict=True)))
