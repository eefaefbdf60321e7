"""Element-wise loops of one stage fused into one CPU loop nest: the plan reshaped for a CPU.

Input: the loops of one stage of a `StitchPlan` and the lowering `Phase`. Output: C lines
for the loops that are purely element-wise (every group ROWWISE or ELEMENTWISE, nothing
to finalize), fused by element count, and the loops left for the plan-shaped code.

Why: the GPU plan gives every output its own group and loop (one kernel per output is
free on a GPU; inlined producers are recomputed in each). On a CPU that means one pass
over memory, one barrier and one recomputation of every shared producer per output.
A fused set has one emitter for all its groups, so a value several outputs need is
computed once per element (the emitter memoises by node and index), and each element
is visited once. Iteration is a row/column nest over the first root's last dimension:
the column loop is innermost and unit-stride, so broadcast index math simplifies to
the column or the row (no 64-bit div/mod per element), and the column loop is
`omp simd` (elements are independent; outputs never alias inputs): gcc 12 does not
vectorise it by itself inside an outlined OpenMP region ("no vectype" for the loads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower import Emitter, Phase, Sources
from stitchfleet.compiler.plan import Group, Loop, MappingKind, Scheme, StitchPlan
from stitchfleet.compiler.targets.cpu.invariant import hoisted_block
from stitchfleet.compiler.targets.cpu.pieces import column_loops

_ELEMENTWISE = (MappingKind.ROWWISE, MappingKind.ELEMENTWISE)
MIN_COLUMNS = 8  # a shorter last dimension is iterated flat (too short an inner loop to vectorise)
FLAT_CHUNK = 4096


def _elements(group: Group) -> int:
    return group.mapping.rows * group.mapping.cols


def _fusible(plan: StitchPlan, loop: Loop) -> bool:
    groups = [plan.group(g) for g in loop.groups]
    return bool(groups) and not loop.finalize and all(g.mapping.kind in _ELEMENTWISE for g in groups)


def _closed(plan: StitchPlan, ids: set[int]) -> bool:
    """Every regional value a member reads is produced by a member (so it is recomputed, not read)."""
    return all(e.producer in ids for e in plan.edges if e.consumer in ids and e.scheme is Scheme.REGIONAL)


def fused_sets(plan: StitchPlan, loops: Sequence[Loop]) -> tuple[list[list[Group]], list[Loop]]:
    """The stage's element-wise groups by element count, and the loops left as planned."""
    buckets: dict[int, list[Loop]] = {}
    rest: list[Loop] = []
    for loop in loops:
        if _fusible(plan, loop):
            buckets.setdefault(_elements(plan.group(loop.groups[0])), []).append(loop)
        else:
            rest.append(loop)
    sets: list[list[Group]] = []
    for members in buckets.values():
        groups = [plan.group(g) for lp in members for g in lp.groups]
        if len({_elements(g) for g in groups}) == 1 and _closed(plan, {g.id for g in groups}):
            sets.append(groups)
        else:
            rest.extend(members)
    return sets, sorted(rest, key=lambda lp: lp.id)


def _columns(ph: Phase, groups: Sequence[Group]) -> int:
    """The inner extent: the first root's last dimension longer than 1 (1: iterate flat). Trailing 1s change no
    element's position: a `(1, 512, 128, 1)` reshape of a layer's rows iterated flat kept its bias's `c % 128` per
    element, which gcc leaves scalar (the transformer's residual add, 65536 elements, one thread: 30.5 -> 8.4 us)."""
    shape = [d for d in ph.graph.node(groups[0].dominant).shape if d != 1]
    total = _elements(groups[0])
    cols = shape[-1] if shape else 1
    return cols if cols >= MIN_COLUMNS and total % cols == 0 else 1


def inner_extent(ph: Phase, groups: Sequence[Group]) -> int:
    """Iterations of the fused loop's innermost (simd) loop."""
    cols = _columns(ph, groups)
    return cols if cols > 1 else min(FLAT_CHUNK, _elements(groups[0]))


def _emitter(ph: Phase, groups: Sequence[Group]) -> Emitter:
    own = frozenset(n for g in groups for n in g.roots)
    sources = Sources(ph.sources.inputs, {}, ph.sources.scratch, None)
    return Emitter(ph.graph, sources, ph.names, own)


def _stores(ph: Phase, em: Emitter, groups: Sequence[Group], index: k.Expr) -> None:
    """Outputs and global exports of every root; regional exports stay in registers."""
    for group in groups:
        for node_id in group.roots:
            value = em.value(node_id, index)
            for buf in ph.outputs.get(node_id, ()):
                em.stmts.append(k.Store(buf, index, value))
            exported = any(
                e.node == node_id and e.producer == group.id and e.scheme is Scheme.GLOBAL for e in ph.plan.edges
            )
            if exported:
                em.stmts.append(k.Store(ph.sources.scratch[node_id], index, value))


def fused_loop(ph: Phase, groups: Sequence[Group], pad: str) -> list[str]:
    """One `omp for` computing every root of `groups` at each element (see the module docstring)."""
    total, cols = _elements(groups[0]), _columns(ph, groups)
    row, col = k.Var(ph.names("r"), DType.I64), k.Var(ph.names("c"), DType.I64)
    em = _emitter(ph, groups)
    index: k.Expr = col
    if cols > 1:
        rows, index = total // cols, k.add(k.mul(row, k.i64(cols)), col)
        bounds = {row.name: rows, col.name: cols}
        start, stop = "0", f"{cols}L"
    else:
        rows = math.ceil(total / FLAT_CHUNK)
        bounds = {row.name: rows, col.name: total}
        start = f"{row.name} * {FLAT_CHUNK}L"
        stop = f"sf_min_int64_t({start} + {FLAT_CHUNK}L, {total}L)"
    _stores(ph, em, groups, index)
    ids = ", ".join(str(g.id) for g in groups)
    head = [
        f"{pad}/* groups {ids}: element-wise, fused ({total} elements as {rows} x {cols if cols > 1 else 'flat'}) */",
        f"{pad}#pragma omp for schedule(static)",
        f"{pad}for (int64_t {row.name} = 0; {row.name} < {rows}L; ++{row.name}) {{",
    ]
    if cols > 1:
        return [*head, *column_loops(em.stmts, col.name, cols, bounds, pad + "    "), f"{pad}}}"]
    before, body = hoisted_block(em.stmts, {col.name}, bounds, (pad + "    ", pad + "        "))
    flat = f"for (int64_t {col.name} = {start}; {col.name} < {stop}; ++{col.name})"
    loop = [f"{pad}    #pragma omp simd", f"{pad}    {flat} {{"]
    return [*head, *before, *loop, *body, f"{pad}    }}", f"{pad}}}"]
