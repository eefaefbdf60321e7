"""Row caches: a row reduction's operand kept in a task-local array for the later groups of its task.

Input: one planned loop (its groups in task order) and the cluster graph. Output: `RowCache`s,
one per row-reduction operand that a later row-wise group or row reduction of the same task
reads at the same element, and `bind`, which makes an emitter read such a value from its
cache instead of computing it (`load_stored`: from an output an earlier part wrote whole).

Why: the GPU plan recomputes a row reduction's operand in every group that needs it (a
softmax's `exp(x - max)`: once for the sum and once per output; registers are free there,
the row is in shared memory). On a CPU each recomputation is a pass of the row's expensive
producers; the row is short (the demo's attention rows are 32 floats), so the task keeps the
values in a stack array (L1) written while reducing, and its later groups load them.
The cached value is exactly the value computed (same statements, stored in the compute type),
so results do not change. A consumer only reads a cache when every path from the value to
what it computes is element-wise or a reshape over as many elements (so it reads the value at its own
element); otherwise it computes the value as before. A cache is kept when its value takes a
heavy op (exp, division, ...) or two later groups read it: a light value read once is cheaper
recomputed than stored and loaded (measured on the demo's layer-norm backward).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from stitchfleet.compiler.ir import Graph, Kind, Node, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower import Emitter
from stitchfleet.compiler.plan import Group, MappingKind
from stitchfleet.compiler.targets.cpu.cexpr import exact_storage

ROW_REDUCTIONS = (MappingKind.WARP_PER_ROW, MappingKind.BLOCK_PER_ROW)
MAX_BYTES = 16 << 10  # a task's cache arrays together stay well inside L1 and the stack
Loaded = Callable[[Group], Collection[int]]


@dataclass(frozen=True)
class RowCache:
    node: int
    producer: int  # the group whose reduction writes it
    buffer: k.SharedBuffer  # rows_per_task x cols values, row-major from the task's first row
    shape: tuple[int, int, int]  # rows, cols, rows per task of the groups that share it


def row_shape(group: Group) -> tuple[int, int, int]:
    m = group.mapping
    return m.rows, m.cols, m.rows_per_task


def _operand(graph: Graph, group: Group) -> Node | None:
    """The operand of a row reduction over its last axis that the group computes (not a plain load)."""
    if group.mapping.kind not in ROW_REDUCTIONS:
        return None
    operand = graph.node(graph.node(group.dominant).inputs[0])
    while operand.op is Op.RESHAPE:  # the value reshaped: what the reduction computes, and what others read
        operand = graph.node(operand.inputs[0])
    rows, cols, _ = row_shape(group)
    last = [d for d in operand.shape if d != 1]  # a (1, rows, cols, 1) operand has rows of cols too
    whole = last and last[-1] == cols and math.prod(operand.shape) == rows * cols
    return operand if whole and operand.op.is_elementwise else None


def in_place(graph: Graph, root: int, value: int, loaded: Collection[int] = ()) -> bool:
    """Whether every path from `value` up to `root` is element-wise or a reshape over `value`'s elements (or none
    exists), so `root` reads `value` at its own flat index;
    `loaded` values (read from a buffer, not recomputed: a regional row max) end a path."""
    shape = graph.node(value).shape
    seen: dict[int, bool] = {}

    def ok(node_id: int) -> bool:  # True: node_id reads `value` only in place, or not at all
        if node_id == value:
            return True
        if node_id not in seen:
            node = graph.node(node_id)
            seen[node_id] = True  # a DAG: provisional value never read on a cycle
            reads = [i for i in node.inputs if i not in loaded and depends(graph, i, value, loaded)]
            same = _flat(node, shape)
            seen[node_id] = not reads or (same and all(ok(i) for i in reads))
        return seen[node_id]

    return ok(root)


def _flat(node: Node, shape: tuple[int, ...]) -> bool:
    """Whether `node` reads its operands at its own flat index over as many elements as `shape`: element-wise, or a
    reshape (a layer norm's rows as `(1, rows, cols, 1)`: with shapes compared, the transformer's layer-norm backward
    recomputed its row's chain in three groups)."""
    return (node.op.is_elementwise or node.op is Op.RESHAPE) and math.prod(node.shape) == math.prod(shape)


def depends(graph: Graph, node_id: int, value: int, loaded: Collection[int] = ()) -> bool:
    """Whether computing `node_id` computes `value` (`loaded` values are read, not computed)."""
    stack, seen = [node_id], set()
    while stack:
        n = stack.pop()
        if n == value:
            return True
        if n not in seen and n not in loaded:
            seen.add(n)
            stack.extend(graph.node(n).inputs)
    return False


def reads(graph: Graph, group: Group) -> list[int]:
    """The nodes a consumer computes at its own element: a row-wise group's roots, a row reduction's operand."""
    if group.mapping.kind in ROW_REDUCTIONS:
        return [graph.node(group.dominant).inputs[0]]
    return list(group.roots) if group.mapping.kind is MappingKind.ROWWISE else []


def loaded(em: Emitter) -> set[int]:
    """The values an emitter reads from a buffer instead of computing them."""
    src = em.sources
    return {*src.inputs, *src.shared, *src.scratch} - em.own


def _later_readers(graph: Graph, groups: Sequence[Group], at: int, operand: int, buffered: Loaded) -> int:
    """How many groups after position `at` in the task compute from `operand`, all of them in place
    (0 when one reads it elsewhere: it would recompute the value anyway)."""
    count = 0
    for g in groups[at + 1 :]:
        roots, stop = reads(graph, g), buffered(g)
        if row_shape(g) != row_shape(groups[at]) or not any(depends(graph, r, operand, stop) for r in roots):
            continue
        if not all(in_place(graph, r, operand, stop) for r in roots):
            return 0
        count += 1
    return count


def _heavy(graph: Graph, value: int, loaded: Collection[int]) -> bool:
    """Whether computing `value` takes a heavy element-wise op (exp, division, ...)."""
    stack, seen = [value], set()
    while stack:
        node = graph.node(stack.pop())
        if node.id in seen or node.id in loaded or not node.op.is_elementwise:
            continue
        seen.add(node.id)
        if node.op.kind is Kind.ELEMENTWISE_HEAVY:
            return True
        stack.extend(node.inputs)
    return False


def row_caches(graph: Graph, groups: Sequence[Group], buffered: Loaded) -> list[RowCache]:
    """The caches worth keeping in one task of `groups` (in task order), within `MAX_BYTES`;
    `buffered(group)`: the values that group's emitter loads."""
    out: list[RowCache] = []
    budget = MAX_BYTES
    for at, group in enumerate(groups):
        operand = _operand(graph, group)
        readers = 0 if operand is None else _later_readers(graph, groups, at, operand.id, buffered)
        # a store and a load per element pay for a heavy op once, or for loads and selects twice
        # (measured: dropout+residual read by one group 125 -> 131 us, by four 50 -> 39 us)
        if operand is None or not (readers > 1 or (readers and _heavy(graph, operand.id, buffered(group)))):
            continue
        _, cols, per_task = row_shape(group)
        size = cols * per_task * 8  # at most a double per value
        if size > budget:
            continue
        budget -= size
        buffer = k.SharedBuffer(f"rowc_{operand.id}", operand.dtype, cols * per_task)
        out.append(RowCache(operand.id, group.id, buffer, row_shape(group)))
    return out


def local(cache: RowCache, index: k.Expr, row0: k.Expr) -> k.Expr:
    """The cache slot of the element at flat `index` (row-major, rows counted from the task's first)."""
    return k.sub(index, k.mul(row0, k.i64(cache.shape[1])))


def bind(em: Emitter, ready: Sequence[RowCache], group: Group, roots: Sequence[int], index: k.Expr) -> None:
    """Makes `em` load each ready cache's value at `index` where all of `roots` read it in place."""
    row0, buffered = em.sources.row0, loaded(em)
    for cache in ready:
        fits = cache.shape == row_shape(group)
        if fits and row0 is not None and all(in_place(em.graph, r, cache.node, buffered) for r in roots):
            em.bound[cache.node] = k.Load(cache.buffer, local(cache, index, row0))


def load_stored(em: Emitter, stored: dict[int, k.Buffer], groups: Sequence[Group], index: k.Expr) -> None:
    """Makes `em` load each stored output (written whole by an earlier part) that every root of `groups` (computed
    by `em` at the same elements) reads in place and that is computed (not an input), instead of recomputing it."""
    buffered = loaded(em)
    shape = em.graph.node(groups[0].dominant).shape
    roots = [r for g in groups for r in g.roots]
    for node_id, buf in stored.items():
        node = em.graph.node(node_id)
        if node.shape != shape or node_id in buffered or node_id in em.own or not exact_storage(node.dtype):
            continue
        if all(in_place(em.graph, r, node_id, buffered) for r in roots) and any(
            depends(em.graph, r, node_id, buffered) for r in roots
        ):
            em.bound[node_id] = k.Load(buf, index)
