"""A stable, human-readable text form of a graph (for diffs, dumps and error reports).

Input: a `Graph`. Output: text, one line per node, e.g.
`%3 = ADD f32[4096,1024] (%1, %2)  # name`, then the outputs. The same graph
always prints the same text.
"""

from __future__ import annotations

from stitchfleet.compiler.ir.attrs import thaw_value
from stitchfleet.compiler.ir.graph import Graph, Node

_ELIDE = 8  # longer constant value lists are shortened: the printout is for humans


def _attr_text(key: str, value: object) -> str:
    if isinstance(value, tuple) and len(value) > _ELIDE:
        shown = ", ".join(repr(v) for v in value[:_ELIDE])
        return f"{key}=[{shown}, ... {len(value)} values]"
    return f"{key}={thaw_value(value)!r}"  # type: ignore[arg-type]


def format_node(node: Node) -> str:
    operands = ", ".join(f"%{i}" for i in node.inputs)
    attrs = ", ".join(_attr_text(k, v) for k, v in node.attrs.items())
    shape = ",".join(str(d) for d in node.shape)
    text = f"%{node.id} = {node.op.value} {node.dtype.value}[{shape}] ({operands})"
    if attrs:
        text += f" {{{attrs}}}"
    return f"{text}  # {node.name}" if node.name else text


def print_graph(graph: Graph) -> str:
    """The whole graph as text (returned, not printed, despite the name kept for familiarity)."""
    lines = [format_node(n) for n in graph.nodes]
    lines += [f"output {name} = %{node_id}" for name, node_id in graph.outputs]
    return "\n".join(lines) + "\n"
