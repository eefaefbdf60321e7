"""Which element loops get vector loads and stores (float4-style 16-byte accesses), proven safe.

Input: a `For` of the kernel, the kernel, and whether the surrounding control flow is
uniform. Output: a `VectorPlan` (lanes per thread, the buffers read and written as
vectors, the rewritten loop bounds) or None. The analysis is deliberately narrow:

- the loop is a cooperative stride loop: `start = base + T` with (T, step) one of
  (threadIdx, blockDim), (lane, 32) or (global thread index, blockDim * gridDim), run by
  every thread of that group (uniform control flow, uniform base and stop), so
  `base + (T * V + k)` for k < V covers exactly the same elements, V per thread;
- `base` and `stop` are provably multiples of V (`multiple_of`: divisibility through
  constants, products, sums, min/max and single-assignment variables), so every
  vector starts V-aligned and no tail is left; buffers come from allocations aligned
  to 16 bytes (the runtime's contract), so the access is V * itemsize aligned;
- the body is element-wise: assignments, stores and branches only (no barriers,
  shuffles, atomics or inner loops), and no variable it assigns lives past the loop,
  so moving an element to another thread changes nothing observable;
- a buffer is read as a vector only if every read of it is `buf[e]` with one read
  outside any branch (so the whole vector is in bounds) and the loop never writes
  it; written as a vector only if its one write is `buf[e] = ...` outside branches
  and the loop never reads it.
Reduction loops (an accumulator lives past the loop) stay scalar: reassigning
elements to threads would be legal for them too, but proving that the accumulator
is only folded symmetrically afterwards is beyond this analysis.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from stitchfleet.compiler.ir.types import Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.uniformity import is_variant, sub_exprs, variant_vars
from stitchfleet.compiler.targets.cuda.scope import children, defined_var, stmt_exprs

VECTOR_BYTES = 16


@dataclass(frozen=True)
class VectorPlan:
    lanes: int
    loads: tuple[ir.Buffer, ...]
    stores: tuple[ir.Buffer, ...]
    start: ir.Expr
    step: ir.Expr


def single_assignments(body: tuple[ir.Stmt, ...]) -> dict[str, ir.Expr]:
    """Variables assigned exactly once in the whole kernel (by an Assign), with their value."""
    counts: dict[str, int] = {}
    values: dict[str, ir.Expr] = {}
    for stmt in _walk(body):
        var = defined_var(stmt)
        if var is None:
            continue
        counts[var.name] = counts.get(var.name, 0) + 1
        if isinstance(stmt, ir.Assign):
            values[var.name] = stmt.value
    return {name: value for name, value in values.items() if counts[name] == 1}


def _walk(body: tuple[ir.Stmt, ...]) -> Iterator[ir.Stmt]:
    for stmt in body:
        yield stmt
        for _, inner in children(stmt):
            yield from _walk(inner)


def multiple_of(e: ir.Expr, launch: ir.Launch, facts: dict[str, ir.Expr], depth: int = 0) -> int:  # noqa: PLR0911
    """A number `e` is provably a multiple of (0: `e` is zero, a multiple of everything)."""
    if depth > 64:
        return 1
    match e:
        case ir.Const(value=value) if not e.dtype.is_float and not isinstance(value, bool):
            return abs(int(value))
        case ir.SpecialIndex(which=ir.Special.BLOCK_DIM):
            return launch.block
        case ir.SpecialIndex(which=ir.Special.GRID_DIM):
            return launch.grid
        case ir.Var(name=name) if name in facts:
            return multiple_of(facts[name], launch, facts, depth + 1)
        case ir.Binary(op=Op.MUL, a=a, b=b):
            return multiple_of(a, launch, facts, depth + 1) * multiple_of(b, launch, facts, depth + 1)
        case ir.Binary(op=Op.ADD | Op.SUB | Op.MAXIMUM | Op.MINIMUM, a=a, b=b):
            return math.gcd(multiple_of(a, launch, facts, depth + 1), multiple_of(b, launch, facts, depth + 1))
        case ir.Select(a=a, b=b):
            return math.gcd(multiple_of(a, launch, facts, depth + 1), multiple_of(b, launch, facts, depth + 1))
    return 1


def _split_start(loop: ir.For, launch: ir.Launch) -> tuple[ir.Expr, ir.Expr] | None:
    """(base, T) of a cooperative stride loop, or None."""
    gtid = ir.global_thread_index()
    grid_steps = (ir.mul(ir.BLOCK_DIM, ir.GRID_DIM), ir.i64(launch.grid * launch.block))
    if loop.start == gtid and loop.step in grid_steps:
        return ir.i64(0), gtid
    steps = {ir.THREAD_IDX: (ir.BLOCK_DIM, ir.i64(launch.block)), ir.LANE: (ir.i64(ir.WARP_SIZE),)}
    for t, allowed in steps.items():
        if loop.step not in allowed:
            continue
        if loop.start == t:
            return ir.i64(0), t
        if isinstance(loop.start, ir.Binary) and loop.start.op is Op.ADD and loop.start.b == t:
            return loop.start.a, t
    return None


def _elementwise(body: tuple[ir.Stmt, ...]) -> bool:
    return all(
        isinstance(s, ir.Assign | ir.Store | ir.Comment) or (isinstance(s, ir.If) and _elementwise(s.then + s.orelse))
        for s in body
    )


def _loads(stmt_or_expr: ir.Expr) -> Iterator[ir.Load]:
    return (e for e in sub_exprs(stmt_or_expr) if isinstance(e, ir.Load))


def _unconditional_loads(e: ir.Expr) -> Iterator[ir.Load]:
    """Loads evaluated whenever `e` is (not inside a Select's arms)."""
    match e:
        case ir.Load(index=index):
            yield e
            yield from _unconditional_loads(index)
        case ir.Select(cond=cond):
            yield from _unconditional_loads(cond)
        case ir.Unary(x=x) | ir.Cast(x=x):
            yield from _unconditional_loads(x)
        case ir.Binary(a=a, b=b):
            yield from _unconditional_loads(a)
            yield from _unconditional_loads(b)


def _vector_buffers(loop: ir.For) -> tuple[list[ir.Buffer], list[ir.Buffer]]:
    e = loop.var
    all_loads = [ld for s in _walk(loop.body) for x in stmt_exprs(s) for ld in _loads(x)]
    stores = [s for s in _walk(loop.body) if isinstance(s, ir.Store)]
    top_loads = {ld.buffer.name for s in loop.body for x in stmt_exprs(s) for ld in _unconditional_loads(x)}
    written = {s.buffer.name for s in stores}
    read = {ld.buffer.name for ld in all_loads}
    loads: dict[str, ir.Buffer] = {}
    for ld in all_loads:
        b = ld.buffer
        contiguous = all(other.index == e for other in all_loads if other.buffer.name == b.name)
        if isinstance(b, ir.Buffer) and b.name in top_loads and b.name not in written and contiguous:
            loads[b.name] = b
    top_stores = [s for s in loop.body if isinstance(s, ir.Store)]
    out = [
        s.buffer
        for s in top_stores
        if isinstance(s.buffer, ir.Buffer) and s.index == e and s.buffer.name not in read
        if sum(1 for t in stores if t.buffer.name == s.buffer.name) == 1
    ]
    return list(loads.values()), out


def _lanes(buffers: list[ir.Buffer]) -> int:
    widest = max(b.dtype.itemsize for b in buffers)
    return VECTOR_BYTES // widest


def plan_vector(
    loop: ir.For, kernel: ir.Kernel, uniform: frozenset[ir.Special], facts: KernelFacts
) -> VectorPlan | None:
    """The vector form of `loop`, or None when vectorizing it is not provably safe and aligned.

    `uniform` names the groups the surrounding control flow is uniform over:
    THREAD_IDX (whole block), LANE (whole warp), BLOCK_IDX (whole grid).
    """
    split = _split_start(loop, kernel.launch)
    if split is None or not _elementwise(loop.body) or _assigned_vars_escape(loop, facts):
        return None
    base, t = split
    group = ir.Special.BLOCK_IDX if t == ir.global_thread_index() else t.which  # type: ignore[union-attr]
    if group not in uniform or not (facts.uniform(group, base) and facts.uniform(group, loop.stop)):
        return None
    loads, stores = _vector_buffers(loop)
    if not loads and not stores:
        return None
    lanes = _lanes(loads + stores)
    bounds = (multiple_of(base, kernel.launch, facts.values), multiple_of(loop.stop, kernel.launch, facts.values))
    if lanes < 2 or any(m % lanes for m in bounds):
        return None
    start = ir.add(base, ir.mul(t, ir.i64(lanes)))
    return VectorPlan(lanes, tuple(loads), tuple(stores), start, ir.mul(loop.step, ir.i64(lanes)))


VARIANT = {
    ir.Special.THREAD_IDX: frozenset({ir.Special.THREAD_IDX, ir.Special.LANE, ir.Special.WARP}),
    ir.Special.LANE: frozenset({ir.Special.THREAD_IDX, ir.Special.LANE}),
    ir.Special.BLOCK_IDX: frozenset({ir.Special.THREAD_IDX, ir.Special.LANE, ir.Special.WARP, ir.Special.BLOCK_IDX}),
}


@dataclass(frozen=True)
class KernelFacts:
    """Per-kernel analysis results: single-assignment values and per-group variant variables."""

    values: dict[str, ir.Expr]
    variant: dict[ir.Special, set[str]]
    names: Counter[str]  # each variable's mentions over the whole body (`_mentions`), for `_assigned_vars_escape`
    loops: Counter[int]  # how often each `For` (by identity) stands in the body

    @classmethod
    def of(cls, kernel: ir.Kernel) -> KernelFacts:
        variant = {group: variant_vars(kernel.body, specials) for group, specials in VARIANT.items()}
        loops = Counter(id(stmt) for stmt in _walk(kernel.body) if isinstance(stmt, ir.For))
        return cls(single_assignments(kernel.body), variant, _tally(kernel.body), loops)

    def uniform(self, group: ir.Special, e: ir.Expr) -> bool:
        """Whether `e` is provably the same in every thread of the group (block, warp or grid)."""
        return not is_variant(e, VARIANT[group], self.variant[group])


def _assigned_vars_escape(loop: ir.For, facts: KernelFacts) -> bool:
    """Whether a variable the loop sets (its own counter included) is used outside the loop: mentioned in the kernel
    more often than in the loop's every occurrence. Counted once per kernel (`KernelFacts.names`) and per loop, not
    by a walk of the whole kernel per loop (quadratic in the loops: 65M expression visits in one test's plans)."""
    inside = {loop.var.name} | {v.name for s in _walk(loop.body) if (v := defined_var(s)) is not None}
    within = _mentions(loop) + _tally(loop.body)
    copies = facts.loops[id(loop)]
    return any(facts.names[name] > copies * within[name] for name in inside)


def _mentions(stmt: ir.Stmt) -> Counter[str]:
    """The variables a statement itself defines or reads, with their multiplicity (nested statements aside)."""
    var = defined_var(stmt)
    found = Counter(e.name for x in stmt_exprs(stmt) for e in sub_exprs(x) if isinstance(e, ir.Var))
    if var is not None:
        found[var.name] += 1
    return found


def _tally(body: tuple[ir.Stmt, ...]) -> Counter[str]:
    total: Counter[str] = Counter()
    for stmt in _walk(body):
        total.update(_mentions(stmt))
    return total
