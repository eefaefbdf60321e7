"""A stitch plan as C over task ranges: the `cpu` backend's code generator.

Input: a cluster graph and its `StitchPlan`. Output: `CSource`: the C text and the
function's parameters (graph inputs then outputs, in order, with names, dtypes, shapes).
The function returns 0, 1 when its scratch could not be allocated, or `finite.NONFINITE`
when a computed floating-point output holds NaN or Inf (the guard's test, done in C).

Layout, from the plan (AStitch's structure on a CPU):
- element-wise loops of a stage are fused into one row/column loop nest (`fused`);
- each planned (or fused) loop is a function over a task range, `part<i>(ctx, lo, hi)`,
  reading the cluster's pointers from one context struct; the function calls a runner
  (`sf_runner`, csrc/helpers.h) per loop in plan order with the loop's task count and
  its elements touched per task (the cost estimate): a runner returns when every task
  ran, which stands for the grid barrier between stages. Three entries: `<f>(...)` and
  `<f>_entry(buffers)` run on OpenMP's runner (a team only from `PARALLEL_ELEMENTS`
  touched by the loop: beside TF's pools a descheduled thread holds the team's barrier),
  `<f>_pooled(buffers, runner, pool)` on the caller's (the TF bridge op passes one over
  its device's intra-op worker threads: plugin/native/csrc/pool.h);
- a task's groups run in plan order in one thread; a reduction accumulates in
  registers (16 lanes, so the inner loop vectorises without reassociating: no
  fast-math needed; float sums in double, see `accumulator`), its tail and stores
  follow; element-wise groups loop over the task's rows, columns innermost; loops whose
  iterations are independent (a reduction's 16 lanes, a column tile's columns, an
  element-wise row) are `omp simd`;
- regional values live in a stack array of rows-per-task elements, declared in the
  task; so does a row reduction's operand that later groups of the task recompute
  (`rowcache`: computed once, loaded after); global values and split-reduction partials
  in heap scratch allocated per call (so concurrent calls share nothing); a split
  reduction's finalize loop folds them; where the plan combines atomically, each task
  writes its share as a partial too, and a part of its own after the stage folds them
  into the value in task order (`_fold_shares`: an `omp atomic` add summed them in the
  order the pool's threads finished, other bits run to run); the NaN/Inf flag is per
  task range, or'ed atomically into the context.
Element values (broadcast/transpose/slice/concat index math, inlined producers) come
from the lowering's value emitter, so CPU and GPU code share one definition of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from stitchfleet.compiler.ir import DType, Graph, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower import Namer, Phase, Sources, store_results
from stitchfleet.compiler.plan import Combine, Group, Loop, MappingKind, Scheme, StitchPlan
from stitchfleet.compiler.targets.cpu import cexpr as c
from stitchfleet.compiler.targets.cpu.finite import (
    BAD,
    DECLARE,
    FLAG,
    HELPERS,
    LANES_MAX,
    NONFINITE,
    laned,
    lanes_declared,
    lanes_reduced,
    pass_after,
    with_reductions,
)
from stitchfleet.compiler.targets.cpu.fused import fused_loop, fused_sets, inner_extent
from stitchfleet.compiler.targets.cpu.generator import (
    PARALLEL_ELEMENTS,
    CSource,
    Gen,
    Param,
    accumulator,
    ident,
    loop_range,
    no_shared_reduce,
)
from stitchfleet.compiler.targets.cpu.pieces import column_loops, in_runs
from stitchfleet.compiler.targets.cpu.reduction import REDUCERS, Reduce
from stitchfleet.compiler.targets.cpu.rowcache import bind, depends, load_stored, loaded, row_caches, row_shape

# A fused loop's rows beyond LANES_MAX columns (no flag per column: `finite.laned`) keep the NaN/Inf test in the
# loop from this many columns: in short inner loops (the demo's 1024 x 32 softmax input) gcc 12's simd reduction
# cost more than the pass after (`finite`). A loop split into runs (`pieces.in_runs`: a transpose's gather) is
# such a loop too: its flag was reduced across the lanes at the end of every run (demo cluster 2: 6.6 us vs 2.3 us).
CHECKED_INNER = 128
_WHOLE = (MappingKind.ROWWISE, MappingKind.ELEMENTWISE)  # groups that store each root at every element


def _params(graph: Graph, plan: StitchPlan) -> tuple[dict[int, k.Buffer], dict[int, list[k.Buffer]], list[Param]]:
    """Every input and output a parameter of the function; the outputs the C code stores, by node: not a
    parameter passed through, nor an output repeating an earlier one's value (the caller hands out its buffer)."""
    inputs: dict[int, k.Buffer] = {}
    outputs: dict[int, list[k.Buffer]] = {}
    params: list[Param] = []
    for i, p in enumerate(graph.parameters):
        name = str(p.attrs["name"])
        inputs[p.id] = k.Buffer(ident("in", i, name), p.dtype, math.prod(p.shape), k.Role.INPUT)
        params.append(Param(inputs[p.id].name, name, p.dtype, p.shape, False))
    for i, (name, node_id) in enumerate(graph.outputs):
        node = graph.node(node_id)
        buf = k.Buffer(ident("out", i, name), node.dtype, math.prod(node.shape), k.Role.OUTPUT)
        params.append(Param(buf.name, name, node.dtype, node.shape, True))
        if node.op is not Op.PARAMETER and plan.repeat_of(i) < 0:
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
    """A split reduction's per-task partials in its accumulator type: folded by the plan's finalize loop, or, for
    an atomic combine, by `_fold_shares`."""
    out = {}
    for g in plan.groups:
        if g.combine is not None:
            node = graph.node(g.dominant)
            dtype = accumulator(node.dtype, node.op)
            out[g.id] = k.Buffer(f"part_{g.id}", dtype, g.mapping.partial_count, k.Role.SCRATCH)
    return out


def _elementwise(gen: Gen, groups: Sequence[Group], pad: str) -> list[str]:
    """The task's rows, columns innermost (a flat range when the group has no row structure), computing every
    root of `groups` (one group, or a run of them that `_shared_runs` found) at each element."""
    m = groups[0].mapping
    row, col = k.Var(gen.names("r"), DType.I64), k.Var(gen.names("c"), DType.I64)
    bounds = gen.group_bounds(**{row.name: m.rows, col.name: m.cols})
    em = replace(gen.ph.emitter(groups[0]), own=frozenset(r for g in groups for r in g.roots))
    index = row if m.cols == 1 else k.add(k.mul(row, k.i64(m.cols)), col)
    if m.cols > 1:
        bind(em, gen.ready, groups[0], list(em.own), index)  # the run's groups share their rows: one shape
        load_stored(em, gen.stored, groups, index)
    for group in groups:
        store_results(gen.ph, em, group, index)
    head = loop_range(row.name, "row0", m.rows_per_task, m.rows)
    if m.cols == 1:
        return [f"{pad}{head} {{", *c.block(em.stmts, bounds, frozenset(), pad + "    "), f"{pad}}}"]
    return [f"{pad}{head} {{", *column_loops(em.stmts, col.name, m.cols, bounds, pad + "    "), f"{pad}}}"]


def _finalize(gen: Gen, group: Group, pad: str) -> list[str]:
    """Folds a split reduction's partials: one reduced value after another."""
    m = group.mapping
    r = Reduce(gen, group)
    v = k.Var(gen.names("v"), DType.I64)
    acc = gen.names("acc")
    values, _, fold = _fold(gen, r, v.name, acc, pad + "    ")
    first = f"t * {m.block_threads}L"
    return [
        f"{pad}{loop_range(v.name, first, m.block_threads, values)} {{",
        *fold,
        *r.finish(acc, v, gen.group_bounds(**{v.name: values}), pad + "    "),
        f"{pad}}}",
    ]


def _fold(gen: Gen, r: Reduce, value: str, acc: str, pad: str) -> tuple[int, int, list[str]]:
    """A split reduction's partials of the value `value` folded in task order into `acc`: how many values and
    partials per value there are, and the lines (`_finalize`, `_fold_shares`)."""
    m = r.group.mapping
    column = m.kind is MappingKind.COLUMN_TILES
    values, parts = (m.cols, m.row_splits) if column else (m.rows, m.blocks_per_row)
    where = f"p * {m.cols}L + {value}" if column else f"{value} * {parts}L + p"
    part = gen.ph.partials[r.group.id].name
    lines = [
        f"{pad}{r.ctype} {acc} = {r.identity()};",
        f"{pad}for (int64_t p = 0; p < {parts}L; ++p) {r.fold(acc, f'{part}[{where}]')}",
    ]
    return values, parts, lines


def _fold_shares(gen: Gen, group: Group) -> _Part:
    """The value of a split reduction the plan combines atomically: each value's shares folded in task order, in the
    accumulator type, then rounded once, as the finalize loop folds partials. Its own part, after the stage whose
    loop wrote the shares (its consumers run in a later stage). Why not `omp atomic` adds into the value: they
    summed the shares in the order tasks finished, which on TF's pool (two threads claiming blocks) varies from run
    to run, so the same inputs gave other last bits (`test_task_order`)."""
    r = Reduce(gen, group)
    values, parts, fold = _fold(gen, r, "v", "acc", "        ")
    (exported,) = group.exports
    target = gen.ph.sources.scratch[exported]
    total = "acc" if r.node.op is not Op.REDUCE_MEAN else f"acc / {r.count}"
    lines = [
        f"    /* group {group.id}: its tasks' shares, folded in task order */",
        "    for (int64_t v = sf_lo; v < sf_hi; ++v) {",
        *fold,
        f"        {target.name}[v] = {c.cast_text(total, r.acc, target.dtype)};",
        "    }",
    ]
    return _Part(lines, values, parts)


def _group(gen: Gen, groups: Sequence[Group], pad: str) -> list[str]:
    group = groups[0]
    ids = ", ".join(str(g.id) for g in groups)
    lines = [f"{pad}/* group{'s' if len(groups) > 1 else ''} {ids}: {group.kind.value}, {group.mapping.kind.value} */"]
    lines.append(f"{pad}{{")
    if group.mapping.kind in REDUCERS:
        lines += REDUCERS[group.mapping.kind](gen, Reduce(gen, group), pad + "    ")
    else:
        lines += _elementwise(gen, groups, pad + "    ")
    return [*lines, f"{pad}}}"]


def _sources(gen: Gen, group: Group) -> tuple[frozenset[int], frozenset[int]]:
    """The values the group's emitter reads from a task's shared buffers and from heap scratch."""
    em = gen.ph.emitter(group)
    return frozenset(em.sources.shared), frozenset(em.sources.scratch)


def _shared_runs(gen: Gen, groups: Sequence[Group]) -> list[list[Group]]:
    """The loop's groups in order, consecutive row-wise groups over the same rows, columns and tasks together: one
    column loop computes them all, so a value several of them compute is computed once an element (the emitter
    memoises it). Apart, gcc recomputed it in each group's loop (the transformer's dropout + residual + layer norm:
    the normalised row's chain twice, for the normalised output and the scaled one). Members read their values
    from the same places and none imports a value another exports (its loop would have to have finished)."""
    runs: list[list[Group]] = []
    for group in groups:
        last = runs[-1][-1] if runs else None
        joins = (
            last is not None
            and group.mapping.kind is MappingKind.ROWWISE
            and last.mapping.kind is MappingKind.ROWWISE
            and group.mapping.cols > 1
            and row_shape(group) == row_shape(last)
            and _sources(gen, group) == _sources(gen, last)
            and not any(e.consumer == group.id and e.producer in {g.id for g in runs[-1]} for e in gen.plan.edges)
        )
        if joins:
            runs[-1].append(group)
        else:
            runs.append([group])
    return runs


def _host(gen: Gen, loops: Sequence[Loop], groups: Sequence[Group]) -> Loop | None:
    """A planned loop of the same stage whose last group is row-wise over as many elements as the fused set `groups`,
    in rows of the set's columns: it computes the set in its last column loop (`_loop`), where a part of its own
    read the set's inputs in a pass of their own (the transformer's dropout mask beside its attention softmax: 11 of
    89 us with cold caches, through _pooled, one thread). The set is closed (`fused_sets`): it reads nothing the loop
    computes; the loop's earlier groups compute what they read of the set themselves (its outputs are not stored
    yet: `Gen.stored`), as do its last run's groups, once, beside it."""
    elements, cols = groups[0].mapping.rows * groups[0].mapping.cols, inner_extent(gen.ph, groups)
    roots = [r for g in groups for r in g.roots]
    for loop in loops:
        last = gen.plan.group(loop.groups[-1]) if loop.groups else None
        m = last.mapping if last is not None else None
        if m is not None and m.kind is MappingKind.ROWWISE and m.cols == cols > 1 and m.rows * m.cols == elements:
            others = [gen.plan.group(g) for lp in loops if lp is not loop for g in (*lp.groups, *lp.finalize)]
            # another loop of the stage that reads the set would compute it again where it loaded the set's part's
            # outputs (`Gen.stored`): the set keeps its part
            if not any(depends(gen.graph, r, n) for g in others for r in g.roots for n in roots):
                return loop
    return None


def _loop(gen: Gen, loop: Loop, pad: str, hosted: Sequence[Group] = ()) -> list[str]:
    """The planned loop's tasks, each running its groups in order; `hosted`: fused groups computed in its last column
    loop (`_host`)."""
    first = gen.plan.group(loop.groups[0]) if loop.groups else gen.plan.group(loop.finalize[0])
    per_task = first.mapping.rows_per_task
    lines = [
        f"{pad}/* loop {loop.id} (stage {loop.stage}): {loop.tasks} task(s) */",
        f"{pad}#pragma omp for schedule(static)",
        f"{pad}for (int64_t t = 0; t < {loop.tasks}L; ++t) {{",
        f"{pad}    const int64_t row0 = t * {per_task}L;",
        f"{pad}    (void)row0;",
    ]
    groups = [gen.plan.group(g) for g in loop.groups]
    gen.caches, gen.ready = row_caches(gen.graph, groups, lambda g: loaded(gen.ph.emitter(g))), []
    for buf in [*_loop_shared(gen, loop), *(rc.buffer for rc in gen.caches)]:
        lines.append(f"{pad}    {c.STORAGE[buf.dtype]} {buf.name}[{buf.size}];")
    runs = _shared_runs(gen, groups)
    if hosted:  # `_host` chose the loop for its last group: a row-wise one
        runs[-1] = [*runs[-1], *hosted]
    for run in runs:
        lines += _group(gen, run, pad + "    ")
        gen.ready += [rc for rc in gen.caches if rc.producer in {g.id for g in run}]
    gen.caches, gen.ready = [], []
    for gid in loop.finalize:
        lines += _finalize(gen, gen.plan.group(gid), pad + "    ")
    return [*lines, f"{pad}}}"]


def _loop_shared(gen: Gen, loop: Loop) -> list[k.SharedBuffer]:
    nodes = sorted({b.node for b in gen.plan.shared if b.loop == loop.id})
    return [gen.ph.sources.shared[n] for n in nodes if n in gen.ph.sources.shared]


_HEAD = re.compile(r"^(\s*)for \(int64_t (\w+) = 0; \2 < (\d+)L; \+\+\2\) \{$")


@dataclass(frozen=True)
class _Part:
    """One planned (or fused) loop as a function over a task range: its C lines, tasks and elements per task."""

    lines: list[str]
    tasks: int
    cost: int  # elements touched per task: the runner's cost estimate
    lanes: int = 0  # the longest simd loop whose stores keep column flags (`finite.laned`): fused loops only


def _part(lines: list[str], elements: int) -> _Part:
    """The loop's lines with its `omp for` dropped and its task loop running over [sf_lo, sf_hi)."""
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#pragma omp for"))
    m = _HEAD.match(lines[at + 1])
    if m is None:
        raise c.CRenderError(f"a planned loop without a task loop: {lines[at + 1]!r}")
    pad, var, tasks = m.group(1), m.group(2), int(m.group(3))
    head = f"{pad}for (int64_t {var} = sf_lo; {var} < sf_hi; ++{var}) {{"
    return _Part([*lines[:at], head, *lines[at + 2 :]], tasks, max(1, math.ceil(elements / max(tasks, 1))))


def _elements_of(groups: list[Group]) -> int:
    return sum(g.mapping.rows * g.mapping.cols for g in groups)


def _stage_parts(gen: Gen, loops: list[Loop], fused: set[str]) -> list[_Part]:
    """One stage's parts: its fused element-wise sets (each its own part, unless a planned loop hosts it: `_host`),
    then its planned loops; `fused` collects the outputs whose NaN/Inf test stays in a fused loop's stores."""
    plan, ph, outputs = gen.plan, gen.ph, gen.ph.outputs
    parts: list[_Part] = []
    sets, planned = fused_sets(plan, loops)
    hosted: dict[int, list[Group]] = {}
    for groups in sets:
        host = _host(gen, planned, groups)
        if host is not None:
            hosted.setdefault(host.id, []).extend(groups)
            continue
        body = fused_loop(ph, groups, "    ")
        # a fused loop's short rows keep their NaN/Inf test in the loop on column flags (`finite.laned`), where a
        # planned loop's row reductions keep the pass after the region (below)
        parts.append(replace(_part(body, _elements_of(groups)), lanes=LANES_MAX))
        # every element of every root is written before the next part starts (the runner's barrier)
        gen.stored |= {n: outputs[n][0] for g in groups for n in g.roots if outputs.get(n)}
        if inner_extent(ph, groups) >= CHECKED_INNER and not in_runs(body):
            fused |= {b.name for g in groups for n in g.roots for b in outputs.get(n, ())}
    for loop in planned:
        members = [plan.group(g) for g in (*loop.groups, *loop.finalize)] + hosted.get(loop.id, [])
        # no column flags: with them a row-reducing loop ran 4-12% slower than with the pass after (softmax,
        # layernorm, attention softmax, dropout-residual-layernorm at the demo's sizes; `finite.laned`)
        parts.append(_part(_loop(gen, loop, "    ", hosted.get(loop.id, [])), _elements_of(members)))
        # its element-wise groups' outputs are whole once the part returns: a later part's reduction loads them
        # instead of recomputing their chain (the transformer's layer-norm backward + dropout: the bias gradient's
        # column tiles recomputed 7 loads and 15 ops an element that the loop before had stored)
        gen.stored |= {n: outputs[n][0] for g in members if g.mapping.kind in _WHOLE for n in g.roots if outputs.get(n)}
    return parts


def cluster_source(graph: Graph, plan: StitchPlan, function: str = "stitch_cluster") -> CSource:
    """The C function computing every output of the cluster graph (see the module docstring)."""
    inputs, outputs, params = _params(graph, plan)
    scratch, shared = _scratch(graph, plan)
    partials = _partials(graph, plan)
    names = Namer()
    sources = Sources(inputs, shared, scratch, k.Var("row0", DType.I64))
    ph = Phase(graph, plan, sources, outputs, partials, no_shared_reduce, names, k.Var("t", DType.I64), 0)
    gen = Gen(graph, plan, ph, names, {"t": max((lp.tasks for lp in plan.loops), default=1)})
    heap = [*scratch.values(), *partials.values()]
    pointers = [(f"{'' if p.output else 'const '}{c.STORAGE[p.dtype]} *", p.cname) for p in params]
    pointers += [(f"{c.STORAGE[b.dtype]} *", b.name) for b in heap]
    parts: list[_Part] = []
    fused: set[str] = set()
    for stage in sorted({lp.stage for lp in plan.loops}):
        loops = [lp for lp in plan.loops if lp.stage == stage]
        parts += _stage_parts(gen, loops, fused)
        groups = [plan.group(g) for lp in loops for g in lp.groups]
        parts += [_fold_shares(gen, g) for g in groups if g.combine is Combine.ATOMIC]
    context = f"struct {function}_tasks"
    lines = [f"{context} {{", *[f"    {t}{n};" for t, n in pointers], "    int bad;", "};", ""]
    moved: list[str] = []
    for i, part in enumerate(parts):
        body, gone, lanes = laned(part.lines, fused, part.lanes)
        moved += [name for name in gone if name not in moved]
        # noinline: the entry's own runner (`sf_run_omp`, in this unit) would otherwise take the part in, and gcc
        # vectorised the copy across rows with gathers (a transpose's part: 4.6 -> 18.6 us through the entry)
        lines += [
            f"__attribute__((noinline)) static void {function}_part{i}(void *sf_arg, int64_t sf_lo, int64_t sf_hi) {{"
        ]
        lines += [f"    {context} *sf_x = sf_arg;", f"    {DECLARE}", *lanes_declared(lanes, "    ")]
        lines += [f"    {t}restrict {n} = sf_x->{n};" for t, n in pointers]
        lines += [*body, *lanes_reduced(lanes, "    ")]
        lines += [f"    __atomic_fetch_or(&sf_x->bad, {BAD}, __ATOMIC_RELAXED);", "}", ""]
    args = ", ".join(f"{t}restrict {n}" for t, n in pointers[: len(params)])
    lines += [f"static int {function}_on(sf_runner sf_run, void *sf_pool, {args}) {{", f"    {DECLARE}"]
    for buf in heap:
        count = max(buf.size, 1)
        lines.append(f"    {c.STORAGE[buf.dtype]} *restrict {buf.name} = malloc({count} * sizeof(*{buf.name}));")
    if heap:
        lines.append(f"    if ({' || '.join(f'!{b.name}' for b in heap)}) {{")
        lines += [f"        free({b.name});" for b in heap] + ["        return 1;", "    }"]
    lines.append(f"    {context} sf_x = {{{', '.join(n for _, n in pointers)}{', ' if pointers else ''}0}};")
    for i, part in enumerate(parts):  # in plan order: each call returns when its tasks are done (the stage barrier)
        lines.append(f"    sf_run(sf_pool, {part.tasks}L, {part.cost}L, {function}_part{i}, &sf_x);")
    lines.append(f"    {FLAG} = sf_x.bad ? SF_BAD_KEY : 0u;")
    lines += [f"    free({b.name});" for b in heap]
    lines += pass_after([(p.cname, c.STORAGE[p.dtype], math.prod(p.shape)) for p in params if p.cname in moved], "    ")
    lines += [f"    return {BAD} ? {NONFINITE} : 0;", "}", "", *_entry(function, params)]
    threshold = f"#define SF_PARALLEL_ELEMENTS {PARALLEL_ELEMENTS}L"
    return CSource(function, "\n".join([threshold, c.PRELUDE, HELPERS, *with_reductions(lines)]), tuple(params))


def _entry(function: str, params: list[Param]) -> list[str]:
    """The function itself (OpenMP's runner), the uniform-signature wrapper (`CSource.entry`) and the wrapper
    that takes a caller's runner and pool (`CSource.pooled`: the TF bridge op's intra-op threads)."""
    names = ", ".join(p.cname for p in params)
    typed = ", ".join(f"{'' if p.output else 'const '}{c.STORAGE[p.dtype]} *restrict {p.cname}" for p in params)
    casts = ", ".join(f"({'' if p.output else 'const '}{c.STORAGE[p.dtype]} *)b[{i}]" for i, p in enumerate(params))
    return [
        f"int {function}({typed}) {{",
        f"    return {function}_on(sf_run_omp, 0, {names});",
        "}",
        "",
        f"int {function}_entry(void *const *b) {{",
        f"    return {function}_on(sf_run_omp, 0, {casts});",
        "}",
        "",
        f"int {function}_pooled(void *const *b, sf_runner run, void *pool) {{",
        f"    return {function}_on(run, pool, {casts});",
        "}",
        "",
    ]
