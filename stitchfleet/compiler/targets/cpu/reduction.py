"""C loops for the plan's reductions: rows (16 register lanes), split rows, column tiles,
memory-order strided reductions and thread-per-output reductions.

Input: a `Gen` (cluster, plan, value emitter) and a reduction group. Output: lines of C for
the task loop body; accumulation order is fixed by the plan, and a split reduction's tasks write
partials that one thread per value folds in task order, so results do not depend on which
thread ran which task when (bitwise the same run to run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import blocks
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower import COMBINE, coords, flat, store_results
from stitchfleet.compiler.plan import Group, MappingKind
from stitchfleet.compiler.targets.cpu import cexpr as c
from stitchfleet.compiler.targets.cpu.generator import (
    LANES,
    MEMORY_ORDER_ACCUMULATORS,
    Gen,
    accumulator,
    loop_range,
)
from stitchfleet.compiler.targets.cpu.invariant import branchy, hoisted_block
from stitchfleet.compiler.targets.cpu.rowcache import bind, local


class Reduce:
    """One reduction group: accumulation and the final value, tail and stores."""

    def __init__(self, gen: Gen, group: Group) -> None:
        self.gen, self.group = gen, group
        self.node = gen.graph.node(group.dominant)
        self.operand = gen.graph.node(self.node.inputs[0])
        self.acc = accumulator(self.node.dtype, self.node.op)
        self.ctype = c.COMPUTE[self.acc]
        self.count = math.prod(self.operand.shape) // max(math.prod(self.node.shape), 1)

    def identity(self) -> str:
        return c.const_text(blocks.identity(COMBINE[self.node.op], self.acc).value, self.acc)

    def fold(self, acc: str, value: str) -> str:
        return f"{acc} = {c.binary_text(COMBINE[self.node.op], acc, value, self.acc)};"

    def operand_stmts(self, index: k.Expr, bounds: dict[str, int]) -> tuple[list[k.Stmt], str]:
        """Statements computing the operand at `index`, and its value (in the operand's compute type)."""
        gen, em = self.gen, self.gen.ph.emitter(self.group)
        bind(em, gen.ready, self.group, [self.operand.id], index)
        stored = gen.stored.get(self.operand.id)
        if stored is not None and c.exact_storage(self.operand.dtype):
            # an earlier part wrote the operand whole as an output: one load instead of its producers' loads and
            # math (the demo's GELU-backward bias gradient: one stream instead of four); the same bits, since
            # the output holds the value computed (storage type = compute type)
            em.bound[self.operand.id] = k.Load(stored, index)
        value = em.value(self.operand.id, index)
        row0 = gen.ph.sources.row0
        for cache in (rc for rc in gen.caches if rc.producer == self.group.id):
            assert row0 is not None, "a row cache is written outside a task loop"
            em.stmts.append(k.Store(cache.buffer, local(cache, index, row0), value))
        return em.stmts, c.render(value, bounds)

    def operand_value(self, index: k.Expr, bounds: dict[str, int], pad: str) -> tuple[list[str], str]:
        stmts, text = self.operand_stmts(index, bounds)
        return c.block(stmts, bounds, frozenset(), pad), text

    def widened(self, text: str) -> str:
        return c.cast_text(text, self.operand.dtype, self.acc)

    def element(self, index: k.Expr, bounds: dict[str, int], into: str, pad: str) -> list[str]:
        """Statements folding the operand at `index` into `into`."""
        stmts, text = self.operand_value(index, bounds, pad)
        return [*stmts, pad + self.fold(into, self.widened(text))]

    def lanes(
        self, acc: str, span: tuple[str, str], index: Callable[[k.Var], k.Expr], bound: int, pad: str
    ) -> Iterator[str]:
        """acc = the fold of index(i) for i in span = [start, stop), over 16 lanes combined as a tree."""
        lane = self.gen.names("lane")
        yield from self.lanes_open(lane, pad)
        yield from self.lanes_pass(lane, span, index, {"": bound}, pad)
        yield from self.lanes_close(lane, acc, pad)

    def lanes_open(self, lane: str, pad: str) -> Iterator[str]:
        yield f"{pad}{self.ctype} {lane}[{LANES}];"
        yield f"{pad}for (int l = 0; l < {LANES}; ++l) {lane}[l] = {self.identity()};"

    def lanes_close(self, lane: str, acc: str, pad: str) -> Iterator[str]:
        """The lanes folded as a tree into `acc`. Each level is `omp simd`: gcc 12 otherwise unrolled a float max's
        levels into scalar compares and branches on the data (`sf_max_float`'s NaN test), one mispredicted branch
        after another per row (the transformer's attention softmax + dropout, 2048 rows of 32: 93.8 -> 81.1 us a
        call, one thread); a level's lanes are independent, so the values are the same."""
        width = LANES // 2
        while width:
            yield f"{pad}#pragma omp simd"
            yield f"{pad}for (int l = 0; l < {width}; ++l) {self.fold(f'{lane}[l]', f'{lane}[l + {width}]')}"
            width //= 2
        yield f"{pad}{self.ctype} {acc} = {lane}[0];"

    def lanes_pass(
        self, lane: str, span: tuple[str, str], index: Callable[[k.Var], k.Expr], bound: dict[str, int], pad: str
    ) -> Iterator[str]:
        """Folds index(i) for i in span into the lanes; bound: "" -> the extent of i, plus outer loop bounds."""
        start, stop = span
        i = self.gen.names("i")
        var = k.Var(self.gen.names("c"), DType.I64)
        bounds = self.gen.group_bounds(**{(name or var.name): size for name, size in bound.items()})
        inner = pad + "        "
        yield f"{pad}int64_t {i} = {start};"
        raw, text = self.operand_stmts(index(var), bounds)
        before, stmts = hoisted_block(raw, {var.name}, bounds, (pad, inner))
        yield from before
        yield f"{pad}for (; {i} + {LANES} <= {stop}; {i} += {LANES}) {{"
        if branchy([s for s in raw if not isinstance(s, k.Store)]):  # a row cache's store is no branch
            yield from self._split_chunk(lane, var, i, (stmts, text), pad)
        else:
            yield f"{pad}    #pragma omp simd"
            yield f"{pad}    for (int64_t {var.name} = {i}; {var.name} < {i} + {LANES}; ++{var.name}) {{"
            yield from stmts
            yield inner + self.fold(f"{lane}[{var.name} - {i}]", self.widened(text))
            yield f"{pad}    }}"
        yield f"{pad}}}"
        yield f"{pad}for (int64_t {var.name} = {i}; {var.name} < {stop}; ++{var.name}) {{"
        yield from self.element(index(var), bounds, f"{lane}[0]", pad + "    ")
        yield f"{pad}}}"

    def _split_chunk(self, lane: str, var: k.Var, i: str, value: tuple[list[str], str], pad: str) -> Iterator[str]:
        """One chunk of LANES values into a temporary (in the operand's type), then the folds: with the
        widening fold in the same loop gcc 12 leaves a branchy value chain scalar (softmax's exp+sum
        measured 4x slower); for plain arithmetic the fused loop is faster (layernorm bwd 15%)."""
        inner = pad + "        "
        stmts, text = value
        vals = self.gen.names("vals")
        yield f"{pad}    {c.COMPUTE[self.operand.dtype]} {vals}[{LANES}];"
        yield f"{pad}    #pragma omp simd"
        yield f"{pad}    for (int64_t {var.name} = {i}; {var.name} < {i} + {LANES}; ++{var.name}) {{"
        yield from stmts
        yield f"{inner}{vals}[{var.name} - {i}] = {text};"
        yield f"{pad}    }}"
        yield f"{pad}    #pragma omp simd"
        yield f"{pad}    for (int l = 0; l < {LANES}; ++l) {self.fold(f'{lane}[l]', self.widened(f'{vals}[l]'))}"

    def finish(self, acc: str, index: k.Expr, bounds: dict[str, int], pad: str) -> list[str]:
        """The reduced value (mean divided), rounded to its dtype, then the tail and the stores."""
        gen = self.gen
        em = gen.ph.emitter(self.group)
        value: k.Expr = k.Var(acc, self.acc)
        if self.node.op is Op.REDUCE_MEAN:
            value = k.div(value, k.const(self.count, self.acc))
        final = gen.ph.var("red", self.node.dtype, k.Cast(value, self.node.dtype), em.stmts)
        em.bound[self.node.id] = final
        store_results(gen.ph, em, self.group, index)
        return c.block(em.stmts, bounds, frozenset(), pad)


def reduce_rows(gen: Gen, r: Reduce, pad: str) -> list[str]:
    """Warp/block per row on a CPU: the task's rows one after another, each a lane reduction."""
    m = r.group.mapping
    row = k.Var(gen.names("row"), DType.I64)
    acc = gen.names("acc")
    bounds = gen.group_bounds(**{row.name: m.rows})
    lines = [f"{pad}{loop_range(row.name, 'row0', m.rows_per_task, m.rows)} {{"]
    lines += r.lanes(acc, ("0", f"{m.cols}L"), lambda col: k.add(k.mul(row, k.i64(m.cols)), col), m.cols, pad + "    ")
    lines += r.finish(acc, row, bounds, pad + "    ")
    return [*lines, f"{pad}}}"]


def reduce_split_row(gen: Gen, r: Reduce, pad: str) -> list[str]:
    """A row split over tasks, each folding a chunk into its partial (a share, for an atomic combine)."""
    m = r.group.mapping
    row = k.Var(gen.names("row"), DType.I64)
    acc = gen.names("acc")
    lines = [f"{pad}const int64_t {row.name} = t / {m.blocks_per_row}L;"]
    last = r.operand.shape[-1] if r.operand.shape else 1
    # whole runs only while there are at least as many runs as tasks: a (1, N) row summed over its last axis is one
    # run, which would give task 0 the whole row and the others nothing
    if last >= LANES and m.cols % last == 0 and m.cols // last >= m.blocks_per_row:
        lines += _split_row_nested(gen, r, (row, acc), last, pad)
    else:
        chunk = -(-m.cols // m.blocks_per_row)
        first = gen.names("c0")
        lines.append(f"{pad}const int64_t {first} = (t % {m.blocks_per_row}L) * {chunk}L;")
        stop = f"sf_min_int64_t({first} + {chunk}L, {m.cols}L)"
        lines += r.lanes(acc, (first, stop), lambda col: k.add(k.mul(row, k.i64(m.cols)), col), m.cols, pad)
    # partials or, for the plan's atomic combine, this task's share of the value: both folded in task order after
    # the loop (source._fold_shares: an atomic add summed the shares in the order tasks finished)
    return [*lines, f"{pad}{gen.ph.partials[r.group.id].name}[t] = {acc};"]


def _split_row_nested(gen: Gen, r: Reduce, names: tuple[k.Var, str], last: int, pad: str) -> list[str]:
    """The chunk as whole runs of the operand's last dimension: index (row*O + o)*last + c, so the
    producers' broadcast div/mod simplify to `o` (once per run) and `c` (none) instead of a
    64-bit div/mod chain per element of a flat range (measured ~2 ms of 4.6 in an attention
    backward cluster)."""
    row, acc = names
    m = r.group.mapping
    runs = m.cols // last
    chunk = -(-runs // m.blocks_per_row)
    o, first, lane = k.Var(gen.names("o"), DType.I64), gen.names("o0"), gen.names("lane")
    start = f"(t % {m.blocks_per_row}L) * {chunk}L"
    head = f"for (int64_t {o.name} = {first}; {o.name} < sf_min_int64_t({first} + {chunk}L, {runs}L); ++{o.name})"
    bound = {"": last, o.name: runs, row.name: m.rows}
    run = k.add(k.mul(row, k.i64(runs)), o)
    body = r.lanes_pass(lane, ("0", f"{last}L"), lambda col: k.add(k.mul(run, k.i64(last)), col), bound, pad + "    ")
    return [
        f"{pad}const int64_t {first} = {start};",
        *r.lanes_open(lane, pad),
        f"{pad}{head} {{",
        *body,
        f"{pad}}}",
        *r.lanes_close(lane, acc, pad),
    ]


def reduce_column_tiles(gen: Gen, r: Reduce, pad: str) -> list[str]:
    """A tile of columns over a slice of rows: one accumulator per column, columns innermost."""
    m = r.group.mapping
    chunk = -(-m.rows // m.row_splits)
    col, i = k.Var(gen.names("col"), DType.I64), k.Var(gen.names("i"), DType.I64)
    accs, split = gen.names("accs"), gen.names("split")
    c0, c1, r0 = gen.names("c0"), gen.names("c1"), gen.names("r0")
    bounds = gen.group_bounds(**{col.name: m.cols, i.name: m.rows})
    lines = [
        f"{pad}const int64_t {split} = t % {m.row_splits}L;",
        f"{pad}const int64_t {c0} = (t / {m.row_splits}L) * {m.block_threads}L;",
        f"{pad}const int64_t {c1} = sf_min_int64_t({c0} + {m.block_threads}L, {m.cols}L);",
        f"{pad}const int64_t {r0} = {split} * {chunk}L;",
        f"{pad}{r.ctype} {accs}[{m.block_threads}];",
        f"{pad}for (int64_t j = 0; j < {c1} - {c0}; ++j) {accs}[j] = {r.identity()};",
        f"{pad}for (int64_t {i.name} = {r0}; {i.name} < sf_min_int64_t({r0} + {chunk}L, {m.rows}L); ++{i.name}) {{",
        f"{pad}    #pragma omp simd",
        f"{pad}    for (int64_t {col.name} = {c0}; {col.name} < {c1}; ++{col.name}) {{",
        *r.element(k.add(k.mul(i, k.i64(m.cols)), col), bounds, f"{accs}[{col.name} - {c0}]", pad + "        "),
        f"{pad}    }}",
        f"{pad}}}",
        f"{pad}for (int64_t {col.name} = {c0}; {col.name} < {c1}; ++{col.name}) {{",
    ]
    if m.row_splits == 1:
        acc = gen.names("acc")
        lines += [f"{pad}    {r.ctype} {acc} = {accs}[{col.name} - {c0}];", *r.finish(acc, col, bounds, pad + "    ")]
    else:  # partials, or the atomic combine's shares (see reduce_split_row)
        part = gen.ph.partials[r.group.id].name
        lines.append(f"{pad}    {part}[{split} * {m.cols}L + {col.name}] = {accs}[{col.name} - {c0}];")
    return [*lines, f"{pad}}}"]


def reduce_memory_order(gen: Gen, r: Reduce, pad: str) -> list[str] | None:
    """Strided reductions read in memory order: per leading index `p`, one accumulator per kept element
    of the remaining dims and a loop nest over those dims (Horner-form index: the broadcast math of the
    producers simplifies to loop variables, no 64-bit div/mod per element). Each output still folds its
    elements in increasing reduced index, so results equal `_thread_per_output`'s. None when the kept
    block does not fit a stack array or the plan's tasks do not split at whole `p`."""
    m, axes = r.group.mapping, set(r.node.attrs.get_ints("axes"))
    dims = [(size, d in axes) for d, size in enumerate(r.operand.shape) if size != 1]
    lead = next((j for j, (_, reduced) in enumerate(dims) if reduced), len(dims))
    outer, rest = math.prod(s for s, _ in dims[:lead]), dims[lead:]
    kept = math.prod(s for s, reduced in rest if not reduced)
    if not rest or kept > MEMORY_ORDER_ACCUMULATORS or (m.tasks > 1 and m.block_threads % kept):
        return None
    per = m.block_threads // kept if m.tasks > 1 else outer
    p, j = k.Var(gen.names("p"), DType.I64), k.Var(gen.names("j"), DType.I64)
    vs = [k.Var(gen.names("v"), DType.I64) for _ in rest]
    accs, acc = gen.names("accs"), gen.names("acc")
    bounds = gen.group_bounds(
        **{p.name: outer, j.name: kept}, **{v.name: s for v, (s, _) in zip(vs, rest, strict=True)}
    )
    index: k.Expr = p
    slot: k.Expr | None = None
    for v, (size, reduced) in zip(vs, rest, strict=True):
        index = k.add(k.mul(index, k.i64(size)), v)
        if not reduced:
            slot = v if slot is None else k.add(k.mul(slot, k.i64(size)), v)
    lines = [
        f"{pad}{loop_range(p.name, f't * {per}L', per, outer)} {{",
        f"{pad}    {r.ctype} {accs}[{kept}];",
        f"{pad}    for (int64_t {j.name} = 0; {j.name} < {kept}L; ++{j.name}) {accs}[{j.name}] = {r.identity()};",
    ]
    inner = pad + "    "
    for n, (v, (size, reduced)) in enumerate(zip(vs, rest, strict=True)):
        if n == len(rest) - 1 and not reduced:
            lines.append(f"{inner}#pragma omp simd")  # distinct accumulators per iteration
        lines.append(f"{inner}for (int64_t {v.name} = 0; {v.name} < {size}L; ++{v.name}) {{")
        inner += "    "
    lines += r.element(index, bounds, f"{accs}[{c.render(slot or k.i64(0), bounds)}]", inner)
    lines += [f"{pad}    {'    ' * (len(rest) - 1 - n)}}}" for n in range(len(rest))]
    lines.append(f"{pad}    for (int64_t {j.name} = 0; {j.name} < {kept}L; ++{j.name}) {{")
    lines.append(f"{pad}        {r.ctype} {acc} = {accs}[{j.name}];")
    lines += r.finish(acc, k.add(k.mul(p, k.i64(kept)), j), bounds, pad + "        ")
    return [*lines, f"{pad}    }}", f"{pad}}}"]


def reduce_thread_per_output(gen: Gen, r: Reduce, pad: str) -> list[str]:
    """Strided reductions: in memory order where it fits, else each output folds its elements in order."""
    ordered = reduce_memory_order(gen, r, pad)
    if ordered is not None:
        return ordered
    m = r.group.mapping
    out, i = k.Var(gen.names("o"), DType.I64), k.Var(gen.names("i"), DType.I64)
    acc = gen.names("acc")
    axes = r.node.attrs.get_ints("axes")
    shape = r.operand.shape
    kept = coords(out, tuple(d for j, d in enumerate(shape) if j not in axes))
    reduced = coords(i, tuple(shape[a] for a in axes))
    kept_it, reduced_it = iter(kept), iter(reduced)
    index = flat([next(reduced_it) if d in axes else next(kept_it) for d in range(len(shape))], shape)
    bounds = gen.group_bounds(**{out.name: m.rows, i.name: m.cols})
    first = f"t * {m.block_threads}L"
    return [
        f"{pad}{loop_range(out.name, first, m.block_threads, m.rows)} {{",
        f"{pad}    {r.ctype} {acc} = {r.identity()};",
        f"{pad}    for (int64_t {i.name} = 0; {i.name} < {m.cols}L; ++{i.name}) {{",
        *r.element(index, bounds, acc, pad + "        "),
        f"{pad}    }}",
        *r.finish(acc, out, bounds, pad + "    "),
        f"{pad}}}",
    ]


REDUCERS: dict[MappingKind, Callable[[Gen, Reduce, str], list[str]]] = {
    MappingKind.WARP_PER_ROW: reduce_rows,
    MappingKind.BLOCK_PER_ROW: reduce_rows,
    MappingKind.SPLIT_ROW: reduce_split_row,
    MappingKind.COLUMN_TILES: reduce_column_tiles,
    MappingKind.THREAD_PER_OUTPUT: reduce_thread_per_output,
}
