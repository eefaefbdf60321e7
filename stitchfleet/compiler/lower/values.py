"""Element values as kernel IR: the local scheme (registers, same thread) of the lowering.

Input: the cluster graph, where each value lives when another group produced it
(shared memory for regional edges, global scratch for global ones, an input
buffer for parameters), and a flat element index expression. Output: kernel IR
statements (appended to `Emitter.stmts`) assigning the value to a fresh variable,
and the expression naming it. Data movement becomes index math: a broadcast,
transpose or slice maps the element's coordinates to its operand's; a concat picks
its operand under an `If`, so no thread loads outside the operand it reads.
Values are memoised per (node, index), so a value read twice is computed once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stitchfleet.compiler.ir import Graph, Node, Op
from stitchfleet.compiler.kernel import ir as k

Index = k.Expr


class Namer:
    """Fresh variable names: `stem_N`, N counting up per kernel (or C function)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"


@dataclass
class Sources:
    """Where values computed outside the current group are read from."""

    inputs: dict[int, k.Buffer]  # parameter node -> input buffer
    shared: dict[int, k.SharedBuffer]  # regional value -> shared buffer (indexed by row - row0)
    scratch: dict[int, k.Buffer]  # global value -> scratch buffer (flat index)
    row0: k.Expr | None = None  # first row of the current task (regional reads)


@dataclass
class Emitter:
    graph: Graph
    sources: Sources
    names: Callable[[str], str]
    own: frozenset[int] = frozenset()  # the group's own dominant and tail: computed here, never loaded
    bound: dict[int, k.Expr] = field(default_factory=dict)  # values already in registers (the dominant)
    stmts: list[k.Stmt] = field(default_factory=list)
    memo: dict[tuple[int, k.Expr], k.Expr] = field(default_factory=dict)

    def child(self) -> Emitter:
        """A scope whose statements and memo are separate (a branch, a loop body)."""
        return Emitter(self.graph, self.sources, self.names, self.own, dict(self.bound), [], dict(self.memo))

    def value(self, node_id: int, index: Index) -> k.Expr:
        """The value of node `node_id` at flat `index`, as an expression (statements emitted)."""
        if node_id in self.bound:
            return self.bound[node_id]
        key = (node_id, index)
        if key not in self.memo:
            expr = self._compute(self.graph.node(node_id), index)
            if isinstance(expr, k.Const | k.Var):
                self.memo[key] = expr
            else:
                var = k.Var(self.names(f"n{node_id}"), expr.dtype)
                self.stmts.append(k.Assign(var, expr))
                self.memo[key] = var
        return self.memo[key]

    def _compute(self, node: Node, index: Index) -> k.Expr:
        src = self.sources
        if node.id in self.own:
            return _RULES.get(node.op.kind.value, _elementwise)(self, node, index)
        if node.id in src.shared:
            assert src.row0 is not None, "a regional value is read outside a task loop"
            return k.Load(src.shared[node.id], k.sub(index, src.row0))
        if node.id in src.scratch:
            return k.Load(src.scratch[node.id], index)
        if node.id in src.inputs:
            return k.Load(src.inputs[node.id], index)
        return _RULES.get(node.op.kind.value, _elementwise)(self, node, index)


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return tuple(out)


def coords(index: Index, shape: tuple[int, ...]) -> list[k.Expr]:
    """Row-major coordinates of a flat index (dims of size 1 give 0)."""
    st = strides(shape)
    out: list[k.Expr] = []
    for d, size in enumerate(shape):
        if size == 1:
            out.append(k.i64(0))
            continue
        c = index if d == 0 else k.mod(index, k.i64(st[d - 1]))
        out.append(c if st[d] == 1 else k.div(c, k.i64(st[d])))
    return out


def flat(coordinates: Sequence[k.Expr], shape: tuple[int, ...]) -> k.Expr:
    total: k.Expr = k.i64(0)
    for c, s, size in zip(coordinates, strides(shape), shape, strict=True):
        if size != 1:
            total = k.add(total, c if s == 1 else k.mul(c, k.i64(s)))
    return total


def _elementwise(em: Emitter, node: Node, index: Index) -> k.Expr:
    args = [em.value(i, index) for i in node.inputs]
    if node.op is Op.CAST:
        return k.Cast(args[0], node.dtype)
    if node.op is Op.SELECT:
        return k.Select(args[0], args[1], args[2])
    if len(args) == 1:
        return k.Unary(node.op, args[0])
    return k.Binary(node.op, args[0], args[1])


def _constant(em: Emitter, node: Node, index: Index) -> k.Expr:
    value = node.attrs.get("value")
    if isinstance(value, tuple):
        raise NotImplementedError(f"{node.label}: tensor constants are not lowered (only scalars and splats)")
    assert isinstance(value, int | float | bool)
    return k.const(value, node.dtype)


def _broadcast(em: Emitter, node: Node, index: Index) -> k.Expr:
    operand = em.graph.node(node.inputs[0])
    if math.prod(operand.shape) == 1:
        return em.value(operand.id, k.i64(0))
    out = coords(index, node.shape)
    dims = node.attrs.get_ints("dims")
    mapped = [out[d] if operand.shape[i] != 1 else k.i64(0) for i, d in enumerate(dims)]
    return em.value(operand.id, flat(mapped, operand.shape))


def _reshape(em: Emitter, node: Node, index: Index) -> k.Expr:
    return em.value(node.inputs[0], index)


def _transpose(em: Emitter, node: Node, index: Index) -> k.Expr:
    operand = em.graph.node(node.inputs[0])
    out = coords(index, node.shape)
    perm = node.attrs.get_ints("perm")
    mapped: list[k.Expr] = [k.i64(0)] * len(perm)
    for j, p in enumerate(perm):
        mapped[p] = out[j]
    return em.value(operand.id, flat(mapped, operand.shape))


def _slice(em: Emitter, node: Node, index: Index) -> k.Expr:
    operand = em.graph.node(node.inputs[0])
    out = coords(index, node.shape)
    a = node.attrs
    mapped = [
        k.add(k.i64(b), k.mul(c, k.i64(s)))
        for c, b, s in zip(out, a.get_ints("begin"), a.get_ints("strides"), strict=True)
    ]
    return em.value(operand.id, flat(mapped, operand.shape))


def _concat(em: Emitter, node: Node, index: Index) -> k.Expr:
    axis = node.attrs.get_int("axis")
    out = coords(index, node.shape)
    result = k.Var(em.names(f"n{node.id}"), node.dtype)
    branches: list[tuple[k.Expr, tuple[k.Stmt, ...]]] = []
    offset = 0
    for source in node.inputs:
        operand = em.graph.node(source)
        local = list(out)
        local[axis] = k.sub(out[axis], k.i64(offset))
        scope = em.child()
        value = scope.value(source, flat(local, operand.shape))
        offset += operand.shape[axis]
        branches.append((k.lt(out[axis], k.i64(offset)), (*scope.stmts, k.Assign(result, value))))
    body: tuple[k.Stmt, ...] = branches[-1][1]
    for cond, then in reversed(branches[:-1]):
        body = (k.If(cond, then, body),)
    em.stmts.extend(body)
    return result


def _unsupported(em: Emitter, node: Node, index: Index) -> k.Expr:
    raise NotImplementedError(f"{node.label}: not computable inline (reductions are dominants)")


_RULES: dict[str, Callable[[Emitter, Node, Index], k.Expr]] = {
    "constant": _constant,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "concat": _concat,
    "reduce": _unsupported,
    "opaque": _unsupported,
    "parameter": _unsupported,
}
