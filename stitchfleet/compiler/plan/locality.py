"""The block-locality check: does a group read another group's value only in rows its own block owns?

Input: the cluster graph, the consumer group's roots and owned nodes, the value read,
and the number of rows R of the partition in question. Output: True when every
element of row r of the consumer reads only element r of the value (so a block that
computed rows [a, b) of the value can hand them over in shared memory).

Walks from the consumer's roots down to the value through the ops it inlines. A node
of N elements is split into R rows of N/R elements. One-to-one ops keep the split;
a BROADCAST keeps it when its leading output dims holding the R rows come unchanged
from its operand's leading dims; any other op (transpose, slice, concat) on the way
to the value breaks it. Subtrees that never reach the value do not matter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection

from stitchfleet.compiler.ir import Graph, Kind, Node

_KEEPS_ROWS = frozenset({Kind.ELEMENTWISE_LIGHT, Kind.ELEMENTWISE_HEAVY, Kind.RESHAPE})


def _row_dims(shape: tuple[int, ...], rows: int) -> int | None:
    """p such that the first p dims hold exactly `rows` rows, or None."""
    total = 1
    for p, size in enumerate(shape):
        if total == rows:
            return p
        total *= size
    return len(shape) if total == rows else None


def _broadcast_keeps_rows(node: Node, operand: Node, rows: int) -> bool:
    p = _row_dims(node.shape, rows)
    if p is None:
        return False
    dims = node.attrs.get_ints("dims")
    leading = [i for i, d in enumerate(dims) if d < p]
    if leading != list(range(len(leading))):
        return False
    sources = {dims[i]: operand.shape[i] for i in leading}
    return all(node.shape[d] == 1 or sources.get(d) == node.shape[d] for d in range(p))


def aligned(graph: Graph, roots: Collection[int], stops: Collection[int], value: int, rows: int) -> bool:
    """Whether the consumer reads `value` row-aligned over `rows` rows (see the module docstring).

    `roots` are the consumer's root nodes; `stops` are nodes computed by other groups
    (the walk stops there; reaching `value` is checked).
    """
    stop_set = frozenset(stops)

    @functools.cache
    def reaches(node_id: int) -> bool:
        if node_id == value:
            return True
        if node_id in stop_set:
            return False
        return any(reaches(i) for i in graph.node(node_id).inputs)

    def ok(node_id: int) -> bool:
        node = graph.node(node_id)
        if not reaches(node_id):
            return True
        if math.prod(node.shape) % rows:
            return False
        if node_id == value:
            return math.prod(node.shape) == rows
        return _keeps(node) and all(ok(i) for i in node.inputs)

    def _keeps(node: Node) -> bool:
        if node.op.kind in _KEEPS_ROWS:
            return True
        if node.op.kind is Kind.BROADCAST:
            return _broadcast_keeps_rows(node, graph.node(node.inputs[0]), rows)
        return node.op.is_reduction and node.id in roots and _reduce_keeps_rows(graph, node, rows)

    return all(ok(r) for r in roots)


def _reduce_keeps_rows(graph: Graph, node: Node, rows: int) -> bool:
    """A row reduction of R rows: element r reads operand row r (reduced axes last)."""
    operand = graph.node(node.inputs[0])
    axes = node.attrs.get_ints("axes")
    rank = len(operand.shape)
    return axes == tuple(range(rank - len(axes), rank)) and math.prod(node.shape) == rows
