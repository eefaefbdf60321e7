"""Cluster outputs that repeat an earlier output's value: stored once, handed out twice.

Input: a cluster `Graph`. Output: per output, the earlier output whose bytes it holds (-1 if none), each
repeat with its reason (`Choice`), and the graph the planner plans: the same nodes, the repeats dropped from
its outputs. An output repeats another when both are the same IR node (the TF frontend lists a node twice
when two TF tensors that map to it are read outside the cluster) or when one is a chain of reshapes of the
other's value (same element count and dtype: row-major, so a bitcast of the same bytes). Outputs that are
parameters are left to `passthrough` (the input itself is handed out).
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.plan.model import Choice


def _root(graph: Graph, node_id: int) -> int:
    """The node whose bytes `node_id` holds: down through reshapes (a reshape reorders no element)."""
    node = graph.node(node_id)
    while node.op is Op.RESHAPE:
        node = graph.node(node.inputs[0])
    return node.id


def output_repeats(graph: Graph) -> tuple[tuple[int, ...], tuple[Choice, ...]]:
    """Per output, the earlier output it repeats (-1: stored by the kernel, or a parameter), and the reasons."""
    first: dict[int, int] = {}  # root node -> the first output holding its bytes
    repeats: list[int] = []
    choices: list[Choice] = []
    for j, (name, node_id) in enumerate(graph.outputs):
        root = _root(graph, node_id)
        if graph.node(root).op is Op.PARAMETER:
            repeats.append(-1)  # passthrough's business (or a copy the kernel makes of an input)
            continue
        source = first.setdefault(root, j)
        repeats.append(source if source != j else -1)
        if source == j:
            continue
        source_name, source_node = graph.outputs[source]
        if source_node == node_id:
            why = f"the same {graph.node(node_id).label} as output {source} {source_name!r}"
        else:
            why = (
                f"{graph.node(node_id).label} reshapes the value of output {source} {source_name!r} "
                f"({graph.node(root).label}): the same bytes"
            )
        choices.append(Choice("repeat", f"output {j} {name!r}", f"{why}; stored once, the op hands out its buffer"))
    return tuple(repeats), tuple(choices)


def stored_graph(graph: Graph, repeats: tuple[int, ...]) -> Graph:
    """`graph` with the repeated outputs dropped from its outputs (node ids unchanged): what the kernel computes.
    A reshape only a repeated output read is left without readers: no group computes it."""
    if all(r < 0 for r in repeats):
        return graph
    kept = tuple(out for out, r in zip(graph.outputs, repeats, strict=True) if r < 0)
    return Graph(graph.nodes, kept, graph.metadata)
