"""A stitch plan as one C function with OpenMP: the `cpu` backend's code generator.

Input: a cluster graph and its `StitchPlan`. Output: `CSource`: the C text and the
function's parameters (graph inputs then outputs, in order, with names, dtypes, shapes).
The function returns 0, 1 when its scratch could not be allocated, or `finite.NONFINITE`
when a computed floating-point output holds NaN or Inf (the guard's test, done in C).

Layout, from the plan (AStitch's structure on a CPU):
- element-wise loops of a stage are fused into one row/column loop nest (`fused`);
- one `#pragma omp parallel` region (skipped for tiny clusters: thread start-up costs
  more than the work); each planned loop is an `omp for` over its tasks, and the
  implicit barrier at its end stands for the grid barrier between stages;
- a task's groups run in plan order in one thread; a reduction accumulates in
  registers (16 lanes, so the inner loop vectorises without reassociating: no
  fast-math needed; floats in double, see `accumulator`), its tail and stores follow; element-wise groups loop over the
  task's rows, columns innermost; loops whose iterations are independent (a reduction's
  16 lanes, a column tile's columns, an element-wise row) are `omp simd`: inside an
  outlined OpenMP region gcc 12 does not vectorise them on its own;
- regional values live in a stack array of rows-per-task elements, declared in the
  task; global values and split-reduction partials in heap scratch allocated per call
  (so concurrent calls share nothing); a split reduction's finalize loop folds them,
  or, where the plan combines atomically, each task adds its share (`omp atomic`) to
  the value's scratch (calloc'd: it starts at zero).
Element values (broadcast/transpose/slice/concat index math, inlined producers) come
from the lowering's value emitter, so CPU and GPU code share one definition of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stitchfleet.compiler.cpu import cexpr as c
from stitchfleet.compiler.cpu.finite import NONFINITE, TYPEDEFS, finite_check
from stitchfleet.compiler.cpu.fused import fused_loop, fused_sets
from stitchfleet.compiler.ir import DType, Graph, Op
from stitchfleet.compiler.kernel import blocks
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower.phases import COMBINE, Phase, store_results
from stitchfleet.compiler.lower.values import Namer, Sources, coords, flat
from stitchfleet.compiler.plan import Combine, Group, Loop, MappingKind, Scheme, StitchPlan

LANES = 16
# Below this many elements touched, one thread does the whole cluster. High on purpose: on a
# busy 2-core machine (TF's own pools, other processes) a worker thread that is descheduled
# holds the region's closing barrier for a scheduler time slice (measured: 0.18 ms serial vs
# 3-12 ms with 2 threads for a 130k-element GELU cluster), so only clusters whose serial run
# takes milliseconds are worth the gamble.
PARALLEL_ELEMENTS = 1 << 22
MEMORY_ORDER_ACCUMULATORS = 2048  # a strided reduction's kept block, in accumulators on the stack


@dataclass(frozen=True)
class Param:
    """One pointer argument of the C function."""

    cname: str
    name: str  # graph parameter or output name
    dtype: DType
    shape: tuple[int, ...]
    output: bool


@dataclass(frozen=True)
class CSource:
    function: str
    text: str
    params: tuple[Param, ...]


def _ident(prefix: str, index: int, name: str) -> str:
    return f"{prefix}{index}_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"


@dataclass
class _Gen:
    graph: Graph
    plan: StitchPlan
    ph: Phase
    names: Namer
    bounds: dict[str, int]

    def group_bounds(self, **extra: int) -> dict[str, int]:
        return {**self.bounds, **extra}


def _params(graph: Graph) -> tuple[dict[int, k.Buffer], dict[int, list[k.Buffer]], list[Param]]:
    inputs: dict[int, k.Buffer] = {}
    outputs: dict[int, list[k.Buffer]] = {}
    params: list[Param] = []
    for i, p in enumerate(graph.parameters):
        name = str(p.attrs["name"])
        inputs[p.id] = k.Buffer(_ident("in", i, name), p.dtype, math.prod(p.shape), k.Role.INPUT)
        params.append(Param(inputs[p.id].name, name, p.dtype, p.shape, False))
    for i, (name, node_id) in enumerate(graph.outputs):
        node = graph.node(node_id)
        buf = k.Buffer(_ident("out", i, name), node.dtype, math.prod(node.shape), k.Role.OUTPUT)
        params.append(Param(buf.name, name, node.dtype, node.shape, True))
        if node.op is not Op.PARAMETER:
            outputs.setdefault(node_id, []).append(buf)
    return inputs, outputs, params


def _scratch(graph: Graph, plan: StitchPlan) -> tuple[dict[int, k.Buffer], dict[int, k.SharedBuffer]]:
    scratch: dict[int, k.Buffer] = {}
    shared: dict[int, k.SharedBuffer] = {}
    for e in plan.edges:
        node = graph.node(e.node)
        if e.scheme is Scheme.GLOBAL:
            scratch[e.node] = k.Buffer(f"tmp_{e.node}", node.dtype, math.prod(node.shape), k.Role.SCRATCH)
        elif e.scheme is Scheme.REGIONAL:
            shared[e.node] = k.SharedBuffer(f"reg_{e.node}", node.dtype, plan.group(e.producer).mapping.rows_per_task)
    return scratch, shared


def _partials(graph: Graph, plan: StitchPlan) -> dict[int, k.Buffer]:
    out = {}
    for g in plan.groups:
        if g.combine is Combine.PARTIALS:
            dtype = accumulator(graph.node(g.dominant).dtype)
            out[g.id] = k.Buffer(f"part_{g.id}", dtype, g.mapping.partial_count, k.Role.SCRATCH)
    return out


def accumulator(dtype: DType) -> DType:
    """Float reductions accumulate in double: free on a memory-bound CPU loop, and the result then
    no longer depends on the summation order the plan's task split imposes (one rounding at the end)."""
    return DType.F64 if dtype.is_float else dtype


def _range(var: str, start: str, count: int, limit: int) -> str:
    """`for` over [start, min(start + count, limit))."""
    return f"for (int64_t {var} = {start}; {var} < sf_min_int64_t({start} + {count}L, {limit}L); ++{var})"


def _no_shared_reduce(dtype: DType) -> k.SharedBuffer:
    raise c.CRenderError("CPU code reduces in registers; it has no per-warp shared arrays")


# ---- reductions ----------------------------------------------------------------------------


class _Reduce:
    """One reduction group: accumulation and the final value, tail and stores."""

    def __init__(self, gen: _Gen, group: Group) -> None:
        self.gen, self.group = gen, group
        self.node = gen.graph.node(group.dominant)
        self.operand = gen.graph.node(self.node.inputs[0])
        self.acc = accumulator(self.node.dtype)
        self.ctype = c.COMPUTE[self.acc]
        self.count = math.prod(self.operand.shape) // max(math.prod(self.node.shape), 1)

    def identity(self) -> str:
        return c.const_text(blocks.identity(COMBINE[self.node.op], self.acc).value, self.acc)

    def fold(self, acc: str, value: str) -> str:
        return f"{acc} = {c.binary_text(COMBINE[self.node.op], acc, value, self.acc)};"

    def element(self, index: k.Expr, bounds: dict[str, int], into: str, pad: str) -> list[str]:
        """Statements folding the operand at `index` into `into`."""
        em = self.gen.ph.emitter(self.group)
        value = em.value(self.operand.id, index)
        text = c.cast_text(c.render(value, bounds), self.operand.dtype, self.acc)
        return [*c.block(em.stmts, bounds, frozenset(), pad), pad + self.fold(into, text)]

    def lanes(
        self, acc: str, span: tuple[str, str], index: Callable[[k.Var], k.Expr], bound: int, pad: str
    ) -> Iterator[str]:
        """acc = the fold of index(i) for i in span = [start, stop), over 16 lanes combined as a tree."""
        start, stop = span
        lane, i = self.gen.names("lane"), self.gen.names("i")
        var = k.Var(self.gen.names("c"), DType.I64)
        bounds = self.gen.group_bounds(**{var.name: bound})
        inner = pad + "        "
        yield f"{pad}{self.ctype} {lane}[{LANES}];"
        yield f"{pad}for (int l = 0; l < {LANES}; ++l) {lane}[l] = {self.identity()};"
        yield f"{pad}int64_t {i} = {start};"
        yield f"{pad}for (; {i} + {LANES} <= {stop}; {i} += {LANES}) {{"
        yield f"{pad}    #pragma omp simd"
        yield f"{pad}    for (int64_t {var.name} = {i}; {var.name} < {i} + {LANES}; ++{var.name}) {{"
        yield from self.element(index(var), bounds, f"{lane}[{var.name} - {i}]", inner)
        yield f"{pad}    }}"
        yield f"{pad}}}"
        yield f"{pad}for (int64_t {var.name} = {i}; {var.name} < {stop}; ++{var.name}) {{"
        yield from self.element(index(var), bounds, f"{lane}[0]", pad + "    ")
        yield f"{pad}}}"
        width = LANES // 2
        while width:
            yield f"{pad}for (int l = 0; l < {width}; ++l) {self.fold(f'{lane}[l]', f'{lane}[l + {width}]')}"
            width //= 2
        yield f"{pad}{self.ctype} {acc} = {lane}[0];"

    def atomic_add(self, index: str, acc: str, pad: str) -> list[str]:
        """The plan's atomic combine: this task's share (a mean's already divided) added to the value."""
        share = f"{acc} / {self.count}" if self.node.op is Op.REDUCE_MEAN else acc
        (exported,) = self.group.exports
        target = self.gen.ph.sources.scratch[exported]
        value = c.cast_text(share, self.acc, target.dtype)
        return [f"{pad}#pragma omp atomic", f"{pad}{target.name}[{index}] += {value};"]

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


def _rows(gen: _Gen, r: _Reduce, pad: str) -> list[str]:
    """Warp/block per row on a CPU: the task's rows one after another, each a lane reduction."""
    m = r.group.mapping
    row = k.Var(gen.names("row"), DType.I64)
    acc = gen.names("acc")
    bounds = gen.group_bounds(**{row.name: m.rows})
    lines = [f"{pad}{_range(row.name, 'row0', m.rows_per_task, m.rows)} {{"]
    lines += r.lanes(acc, ("0", f"{m.cols}L"), lambda col: k.add(k.mul(row, k.i64(m.cols)), col), m.cols, pad + "    ")
    lines += r.finish(acc, row, bounds, pad + "    ")
    return [*lines, f"{pad}}}"]


def _split_row(gen: _Gen, r: _Reduce, pad: str) -> list[str]:
    m = r.group.mapping
    chunk = -(-m.cols // m.blocks_per_row)
    row = k.Var(gen.names("row"), DType.I64)
    first, acc = gen.names("c0"), gen.names("acc")
    lines = [
        f"{pad}const int64_t {row.name} = t / {m.blocks_per_row}L;",
        f"{pad}const int64_t {first} = (t % {m.blocks_per_row}L) * {chunk}L;",
    ]
    stop = f"sf_min_int64_t({first} + {chunk}L, {m.cols}L)"
    lines += r.lanes(acc, (first, stop), lambda col: k.add(k.mul(row, k.i64(m.cols)), col), m.cols, pad)
    if r.group.combine is Combine.ATOMIC:
        return [*lines, *r.atomic_add(row.name, acc, pad)]
    return [*lines, f"{pad}{gen.ph.partials[r.group.id].name}[t] = {acc};"]


def _column_tiles(gen: _Gen, r: _Reduce, pad: str) -> list[str]:
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
    elif r.group.combine is Combine.ATOMIC:
        lines += r.atomic_add(col.name, f"{accs}[{col.name} - {c0}]", pad + "    ")
    else:
        part = gen.ph.partials[r.group.id].name
        lines.append(f"{pad}    {part}[{split} * {m.cols}L + {col.name}] = {accs}[{col.name} - {c0}];")
    return [*lines, f"{pad}}}"]


def _memory_order(gen: _Gen, r: _Reduce, pad: str) -> list[str] | None:
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
        f"{pad}{_range(p.name, f't * {per}L', per, outer)} {{",
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


def _thread_per_output(gen: _Gen, r: _Reduce, pad: str) -> list[str]:
    """Strided reductions: in memory order where it fits, else each output folds its elements in order."""
    ordered = _memory_order(gen, r, pad)
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
        f"{pad}{_range(out.name, first, m.block_threads, m.rows)} {{",
        f"{pad}    {r.ctype} {acc} = {r.identity()};",
        f"{pad}    for (int64_t {i.name} = 0; {i.name} < {m.cols}L; ++{i.name}) {{",
        *r.element(index, bounds, acc, pad + "        "),
        f"{pad}    }}",
        *r.finish(acc, out, bounds, pad + "    "),
        f"{pad}}}",
    ]


_REDUCERS: dict[MappingKind, Callable[[_Gen, _Reduce, str], list[str]]] = {
    MappingKind.WARP_PER_ROW: _rows,
    MappingKind.BLOCK_PER_ROW: _rows,
    MappingKind.SPLIT_ROW: _split_row,
    MappingKind.COLUMN_TILES: _column_tiles,
    MappingKind.THREAD_PER_OUTPUT: _thread_per_output,
}


def _elementwise(gen: _Gen, group: Group, pad: str) -> list[str]:
    """The task's rows, columns innermost (a flat range when the group has no row structure)."""
    m = group.mapping
    row, col = k.Var(gen.names("r"), DType.I64), k.Var(gen.names("c"), DType.I64)
    bounds = gen.group_bounds(**{row.name: m.rows, col.name: m.cols})
    em = gen.ph.emitter(group)
    index = row if m.cols == 1 else k.add(k.mul(row, k.i64(m.cols)), col)
    store_results(gen.ph, em, group, index)
    body = c.block(em.stmts, bounds, frozenset(), pad + "        ")
    head = _range(row.name, "row0", m.rows_per_task, m.rows)
    if m.cols == 1:
        return [f"{pad}{head} {{", *(line[4:] for line in body), f"{pad}}}"]
    inner = f"for (int64_t {col.name} = 0; {col.name} < {m.cols}L; ++{col.name})"
    return [f"{pad}{head} {{", f"{pad}    #pragma omp simd", f"{pad}    {inner} {{", *body, f"{pad}    }}", f"{pad}}}"]


def _finalize(gen: _Gen, group: Group, pad: str) -> list[str]:
    """Folds a split reduction's partials: one reduced value after another."""
    m = group.mapping
    r = _Reduce(gen, group)
    column = m.kind is MappingKind.COLUMN_TILES
    values, parts = (m.cols, m.row_splits) if column else (m.rows, m.blocks_per_row)
    v = k.Var(gen.names("v"), DType.I64)
    acc = gen.names("acc")
    where = f"p * {m.cols}L + {v.name}" if column else f"{v.name} * {parts}L + p"
    first = f"t * {m.block_threads}L"
    part = gen.ph.partials[group.id].name
    return [
        f"{pad}{_range(v.name, first, m.block_threads, values)} {{",
        f"{pad}    {r.ctype} {acc} = {r.identity()};",
        f"{pad}    for (int64_t p = 0; p < {parts}L; ++p) {r.fold(acc, f'{part}[{where}]')}",
        *r.finish(acc, v, gen.group_bounds(**{v.name: values}), pad + "    "),
        f"{pad}}}",
    ]


def _group(gen: _Gen, group: Group, pad: str) -> list[str]:
    lines = [f"{pad}/* group {group.id}: {group.kind.value}, {group.mapping.kind.value} */", f"{pad}{{"]
    if group.mapping.kind in _REDUCERS:
        lines += _REDUCERS[group.mapping.kind](gen, _Reduce(gen, group), pad + "    ")
    else:
        lines += _elementwise(gen, group, pad + "    ")
    return [*lines, f"{pad}}}"]


def _loop(gen: _Gen, loop: Loop, pad: str) -> list[str]:
    first = gen.plan.group(loop.groups[0]) if loop.groups else gen.plan.group(loop.finalize[0])
    per_task = first.mapping.rows_per_task
    lines = [
        f"{pad}/* loop {loop.id} (stage {loop.stage}): {loop.tasks} task(s) */",
        f"{pad}#pragma omp for schedule(static)",
        f"{pad}for (int64_t t = 0; t < {loop.tasks}L; ++t) {{",
        f"{pad}    const int64_t row0 = t * {per_task}L;",
        f"{pad}    (void)row0;",
    ]
    for buf in _loop_shared(gen, loop):
        lines.append(f"{pad}    {c.STORAGE[buf.dtype]} {buf.name}[{buf.size}];")
    for gid in loop.groups:
        lines += _group(gen, gen.plan.group(gid), pad + "    ")
    for gid in loop.finalize:
        lines += _finalize(gen, gen.plan.group(gid), pad + "    ")
    return [*lines, f"{pad}}}"]


def _loop_shared(gen: _Gen, loop: Loop) -> list[k.SharedBuffer]:
    nodes = sorted({b.node for b in gen.plan.shared if b.loop == loop.id})
    return [gen.ph.sources.shared[n] for n in nodes if n in gen.ph.sources.shared]


def _touched(graph: Graph) -> int:
    return sum(math.prod(n.shape) for n in graph.nodes if n.op is not Op.CONSTANT)


def cluster_source(graph: Graph, plan: StitchPlan, function: str = "stitch_cluster") -> CSource:
    """The C function computing every output of the cluster graph (see the module docstring)."""
    inputs, outputs, params = _params(graph)
    scratch, shared = _scratch(graph, plan)
    partials = _partials(graph, plan)
    names = Namer()
    sources = Sources(inputs, shared, scratch, k.Var("row0", DType.I64))
    ph = Phase(graph, plan, sources, outputs, partials, _no_shared_reduce, names, k.Var("t", DType.I64), 0)
    gen = _Gen(graph, plan, ph, names, {"t": max((lp.tasks for lp in plan.loops), default=1)})
    args = ", ".join(f"{'' if p.output else 'const '}{c.STORAGE[p.dtype]} *restrict {p.cname}" for p in params)
    heap = [*scratch.values(), *partials.values()]
    lines = [c.PRELUDE, TYPEDEFS, f"int {function}({args}) {{"]
    atomic = {scratch[g.exports[0]].name for g in plan.groups if g.combine is Combine.ATOMIC}
    for buf in heap:
        count, size = max(buf.size, 1), f"sizeof(*{buf.name})"
        alloc = f"calloc({count}, {size})" if buf.name in atomic else f"malloc({count} * {size})"  # atomics add to 0
        lines.append(f"    {c.STORAGE[buf.dtype]} *restrict {buf.name} = {alloc};")
    if heap:
        lines.append(f"    if ({' || '.join(f'!{b.name}' for b in heap)}) {{")
        lines += [f"        free({b.name});" for b in heap] + ["        return 1;", "    }"]
    lines.append("    omp_set_dynamic(1);  /* threads = cores - load average: no team waits on a busy core */")
    lines.append(f"    #pragma omp parallel if({int(_touched(graph) >= PARALLEL_ELEMENTS)})")
    lines.append("    {")
    for stage in sorted({lp.stage for lp in plan.loops}):
        sets, planned = fused_sets(plan, [lp for lp in plan.loops if lp.stage == stage])
        for groups in sets:
            lines += fused_loop(ph, groups, "        ")
        for loop in planned:
            lines += _loop(gen, loop, "        ")
    lines.append("    }")
    lines += [f"    free({b.name});" for b in heap]
    lines += finite_check([bufs[0] for bufs in outputs.values()], c.STORAGE, "    ")
    lines += [f"    return sf_bad ? {NONFINITE} : 0;", "}", ""]
    return CSource(function, "\n".join(lines), tuple(params))
