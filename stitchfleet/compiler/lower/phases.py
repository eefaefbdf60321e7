"""One group's work inside a task loop, as kernel IR, for each thread mapping of the plan.

Input: a `Phase` context (cluster graph, plan, buffers, the task variable `t` and the
task's first row `row0`) and a planned `Group`. Output: the statements one task of
that group runs. Reductions accumulate in registers (f32 for f16/bf16) in the
kernel building blocks' stride loops, and combine with `blocks.warp_reduce` (xor
shuffles) or `blocks.block_reduce` (per-warp partials in the shared view the plan
placed at its scratch offset); split reductions write per-task partials to global
scratch, and a finalize loop after the next grid barrier folds them, or (atomic
combine) add their share to the value's scratch with `blocks.atomic_combine` (not
`blocks.grid_reduce`: that one needs every block at its own grid barrier, while here
blocks run different numbers of tasks and share the plan's barrier between stages).
Results (the dominant, then its tail) are written by one thread per value to the
cluster outputs and to the group's exports: shared memory at `value index - row0`
(regional) or global scratch (global).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from stitchfleet.compiler.ir import DType, Graph, Op
from stitchfleet.compiler.kernel import blocks
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower.values import Emitter, Sources, coords, flat
from stitchfleet.compiler.plan import Combine, Group, MappingKind, Scheme, StitchPlan
from stitchfleet.compiler.plan.structure import accumulator

COMBINE = {Op.REDUCE_SUM: Op.ADD, Op.REDUCE_MEAN: Op.ADD, Op.REDUCE_MAX: Op.MAXIMUM, Op.REDUCE_MIN: Op.MINIMUM}
COMBINE[Op.REDUCE_PROD] = Op.MUL
Body = tuple[k.Stmt, ...]
LoopBuilder = Callable[[k.Var, Body], k.For]


@dataclass
class Phase:
    graph: Graph
    plan: StitchPlan
    sources: Sources
    outputs: dict[int, list[k.Buffer]]
    partials: dict[int, k.Buffer]
    reduce_smem: Callable[[DType], k.SharedBuffer]
    names: Callable[[str], str]
    task: k.Var
    block: int

    def emitter(self, group: Group) -> Emitter:
        """An emitter reading each imported value where this group's edge for it puts it."""
        src = self.sources
        regional = {e.node for e in self.plan.edges if e.consumer == group.id and e.scheme is Scheme.REGIONAL}
        shared = {n: b for n, b in src.shared.items() if n in regional}
        scratch = {n: b for n, b in src.scratch.items() if n not in regional}
        sources = Sources(src.inputs, shared, scratch, src.row0)
        return Emitter(self.graph, sources, self.names, frozenset(group.roots))

    def var(self, stem: str, dtype: DType, value: k.Expr, into: list[k.Stmt]) -> k.Var:
        v = k.Var(self.names(stem), dtype)
        into.append(k.Assign(v, value))
        return v


def store_results(ph: Phase, em: Emitter, group: Group, index: k.Expr) -> None:
    """Writes the group's roots at `index` to outputs and exports (statements into `em`)."""
    for node_id in group.roots:
        value = em.value(node_id, index)
        for buf in ph.outputs.get(node_id, ()):
            em.stmts.append(k.Store(buf, index, value))
        schemes = {e.scheme for e in ph.plan.edges if e.node == node_id and e.producer == group.id}
        if Scheme.REGIONAL in schemes:
            assert ph.sources.row0 is not None
            em.stmts.append(k.Store(ph.sources.shared[node_id], k.sub(index, ph.sources.row0), value))
        if Scheme.GLOBAL in schemes:
            em.stmts.append(k.Store(ph.sources.scratch[node_id], index, value))


class _Reduction:
    """Accumulation of one reduction group, combined with the kernel building blocks."""

    def __init__(self, ph: Phase, group: Group) -> None:
        self.ph, self.group = ph, group
        self.node = ph.graph.node(group.dominant)
        self.operand = ph.graph.node(self.node.inputs[0])
        self.acc_dtype = accumulator(self.node.dtype)
        self.op = COMBINE[self.node.op]
        self.count = math.prod(self.operand.shape) // max(math.prod(self.node.shape), 1)

    def start(self, into: list[k.Stmt]) -> k.Var:
        return self.ph.var("acc", self.acc_dtype, blocks.identity(self.op, self.acc_dtype), into)

    def loop(self, acc: k.Var, make: LoopBuilder, index: Callable[[k.Var], k.Expr]) -> k.For:
        """`make(i, body)` loops over the elements this thread folds; `index(i)` is the operand's index."""
        i = k.Var(self.ph.names("i"), DType.I64)
        em = self.ph.emitter(self.group)
        value = em.value(self.operand.id, index(i))
        em.stmts.append(self.fold(acc, k.Cast(value, self.acc_dtype)))
        return make(i, tuple(em.stmts))

    def fold(self, acc: k.Var, value: k.Expr) -> k.Assign:
        return k.Assign(acc, blocks.combine(self.op, acc, value))

    def share(self, acc: k.Var) -> k.Expr:
        """What one block adds to the value on the atomic path (a mean's share is already divided)."""
        return k.div(acc, k.const(self.count, self.acc_dtype)) if self.node.op is Op.REDUCE_MEAN else acc

    def target(self) -> k.Buffer:
        """The exported value's global scratch (the dominant or a reshape of it), zeroed per launch."""
        (exported,) = self.group.exports
        return self.ph.sources.scratch[exported]

    def block_reduce(self, acc: k.Var, into: list[k.Stmt]) -> None:
        into += blocks.block_reduce(acc, self.op, self.ph.reduce_smem(self.acc_dtype), self.ph.block)

    def finish(self, acc: k.Var, index: k.Expr, guard: k.Expr, into: list[k.Stmt]) -> None:
        """Final value, tail, stores: all under `guard` (one thread per value)."""
        em = self.ph.emitter(self.group)
        value: k.Expr = acc
        if self.node.op is Op.REDUCE_MEAN:
            value = k.div(value, k.const(self.count, self.acc_dtype))
        final = self.ph.var("red", self.node.dtype, k.Cast(value, self.node.dtype), em.stmts)
        em.bound[self.node.id] = final
        store_results(self.ph, em, self.group, index)
        into.append(k.If(guard, tuple(em.stmts)))


def _min(a: k.Expr, b: k.Expr) -> k.Expr:
    return k.Binary(Op.MINIMUM, a, b)


def _warp_per_row(ph: Phase, r: _Reduction, into: list[k.Stmt]) -> None:
    m = r.group.mapping
    row = ph.var("row", DType.I64, k.add(k.mul(ph.task, k.i64(m.rows_per_task)), k.WARP), into)
    valid = k.lt(row, k.i64(m.rows))
    acc = r.start(into)
    stop = k.Select(valid, k.i64(m.cols), k.i64(0))

    def lanes(i: k.Var, body: Body) -> k.For:
        return blocks.lane_stride_loop(i, k.i64(0), stop, body)

    into.append(r.loop(acc, lanes, lambda c: k.add(k.mul(row, k.i64(m.cols)), c)))
    into += blocks.warp_reduce(acc, r.op)
    r.finish(acc, row, k.Binary(Op.LOGICAL_AND, valid, k.eq(k.LANE, k.i64(0))), into)


def _block_per_row(ph: Phase, r: _Reduction, into: list[k.Stmt]) -> None:
    m = r.group.mapping
    acc = r.start(into)

    def threads(i: k.Var, body: Body) -> k.For:
        return blocks.block_stride_loop(i, k.i64(0), k.i64(m.cols), body)

    into.append(r.loop(acc, threads, lambda c: k.add(k.mul(ph.task, k.i64(m.cols)), c)))
    r.block_reduce(acc, into)
    r.finish(acc, ph.task, k.eq(k.THREAD_IDX, k.i64(0)), into)


def _split_row(ph: Phase, r: _Reduction, into: list[k.Stmt]) -> None:
    m = r.group.mapping
    row = ph.var("row", DType.I64, k.div(ph.task, k.i64(m.blocks_per_row)), into)
    part = k.mod(ph.task, k.i64(m.blocks_per_row))
    chunk = -(-m.cols // m.blocks_per_row)
    first = ph.var("c0", DType.I64, k.mul(part, k.i64(chunk)), into)
    stop = _min(k.add(first, k.i64(chunk)), k.i64(m.cols))
    acc = r.start(into)

    def threads(i: k.Var, body: Body) -> k.For:
        return blocks.block_stride_loop(i, first, stop, body)

    into.append(r.loop(acc, threads, lambda c: k.add(k.mul(row, k.i64(m.cols)), c)))
    r.block_reduce(acc, into)
    if r.group.combine is Combine.ATOMIC:
        into.append(blocks.atomic_combine(r.share(acc), Op.ADD, r.target(), row))
        return
    store = k.Store(ph.partials[r.group.id], ph.task, acc)
    into.append(k.If(k.eq(k.THREAD_IDX, k.i64(0)), (store,)))


def _column_tiles(ph: Phase, r: _Reduction, into: list[k.Stmt]) -> None:
    m = r.group.mapping
    tile, split = k.div(ph.task, k.i64(m.row_splits)), k.mod(ph.task, k.i64(m.row_splits))
    col = ph.var("col", DType.I64, k.add(k.mul(tile, k.i64(m.block_threads)), k.THREAD_IDX), into)
    valid = k.lt(col, k.i64(m.cols))
    chunk = -(-m.rows // m.row_splits)
    first = ph.var("r0", DType.I64, k.mul(split, k.i64(chunk)), into)
    stop = k.Select(valid, _min(k.add(first, k.i64(chunk)), k.i64(m.rows)), k.i64(0))
    acc = r.start(into)

    def rows(i: k.Var, body: Body) -> k.For:
        return k.For(i, first, stop, k.i64(1), body)

    into.append(r.loop(acc, rows, lambda i: k.add(k.mul(i, k.i64(m.cols)), col)))
    if m.row_splits == 1:
        r.finish(acc, col, valid, into)
        return
    if r.group.combine is Combine.ATOMIC:
        into.append(blocks.atomic_combine(r.share(acc), Op.ADD, r.target(), col, writer=valid))
        return
    store = k.Store(ph.partials[r.group.id], k.add(k.mul(split, k.i64(m.cols)), col), acc)
    into.append(k.If(valid, (store,)))


def _thread_per_output(ph: Phase, r: _Reduction, into: list[k.Stmt]) -> None:
    m = r.group.mapping
    out = ph.var("o", DType.I64, k.add(k.mul(ph.task, k.i64(m.block_threads)), k.THREAD_IDX), into)
    valid = k.lt(out, k.i64(m.rows))
    axes = r.node.attrs.get_ints("axes")
    shape = r.operand.shape
    kept_shape = tuple(d for i, d in enumerate(shape) if i not in axes)
    reduced_shape = tuple(shape[a] for a in axes)

    def index(i: k.Var) -> k.Expr:
        kept, reduced = iter(coords(out, kept_shape)), iter(coords(i, reduced_shape))
        return flat([next(reduced) if d in axes else next(kept) for d in range(len(shape))], shape)

    acc = r.start(into)

    def reduced(i: k.Var, body: Body) -> k.For:
        return k.For(i, k.i64(0), k.Select(valid, k.i64(m.cols), k.i64(0)), k.i64(1), body)

    into.append(r.loop(acc, reduced, index))
    r.finish(acc, out, valid, into)


_REDUCERS: dict[MappingKind, Callable[[Phase, _Reduction, list[k.Stmt]], None]] = {
    MappingKind.WARP_PER_ROW: _warp_per_row,
    MappingKind.BLOCK_PER_ROW: _block_per_row,
    MappingKind.SPLIT_ROW: _split_row,
    MappingKind.COLUMN_TILES: _column_tiles,
    MappingKind.THREAD_PER_OUTPUT: _thread_per_output,
}


def _rowwise(ph: Phase, group: Group, into: list[k.Stmt]) -> None:
    """Element-wise over the task's rows: rows_per_task rows of `cols` elements."""
    m = group.mapping
    assert ph.sources.row0 is not None
    begin = k.mul(ph.sources.row0, k.i64(m.cols))
    stop = k.mul(_min(k.add(ph.sources.row0, k.i64(m.rows_per_task)), k.i64(m.rows)), k.i64(m.cols))
    e = k.Var(ph.names("e"), DType.I64)
    em = ph.emitter(group)
    store_results(ph, em, group, e)
    into.append(blocks.block_stride_loop(e, begin, stop, tuple(em.stmts)))


def group_task(ph: Phase, group: Group) -> list[k.Stmt]:
    """The statements one task of `group` runs."""
    into: list[k.Stmt] = [k.Comment(f"group {group.id}: {group.kind.value}, {group.mapping.kind.value}")]
    if group.mapping.kind in _REDUCERS:
        _REDUCERS[group.mapping.kind](ph, _Reduction(ph, group), into)
    else:
        _rowwise(ph, group, into)
    return into


def finalize_task(ph: Phase, group: Group) -> list[k.Stmt]:
    """Folds a split reduction's partials: a thread per reduced value."""
    m = group.mapping
    r = _Reduction(ph, group)
    into: list[k.Stmt] = [k.Comment(f"group {group.id}: combine partials of {m.kind.value}")]
    value = ph.var("v", DType.I64, k.add(k.mul(ph.task, k.i64(m.block_threads)), k.THREAD_IDX), into)
    column = m.kind is MappingKind.COLUMN_TILES
    values, parts = (m.cols, m.row_splits) if column else (m.rows, m.blocks_per_row)
    valid = k.lt(value, k.i64(values))
    acc = r.start(into)
    p = k.Var(ph.names("p"), DType.I64)
    where = k.add(k.mul(p, k.i64(m.cols)), value) if column else k.add(k.mul(value, k.i64(parts)), p)
    fold = r.fold(acc, k.Load(ph.partials[group.id], where))
    into.append(k.For(p, k.i64(0), k.Select(valid, k.i64(parts), k.i64(0)), k.i64(1), (fold,)))
    r.finish(acc, value, valid, into)
    return into
