"""Immutable graph IR: nodes in topological order, named outputs, a verifier, a fingerprint.

Input: nodes (each naming its operands by earlier node ids) and named outputs.
Output: a `Graph` value. `verify` re-infers every node's type and raises
`IRError` naming the node (id, name, op) and the problem. `fingerprint` hashes the
structure only (ops, wiring, shapes, dtypes, attributes; no names), so the same
cluster found in two jobs with different TensorFlow names gets the same key.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stitchfleet.compiler.ir.attrs import EMPTY, Attrs
from stitchfleet.compiler.ir.shapes import Shape, ShapeError, TensorType, infer, is_static
from stitchfleet.compiler.ir.types import DType, Op


class IRError(ValueError):
    """A graph is malformed; the message names the node and what is wrong."""


@dataclass(frozen=True)
class Node:
    """One operation. `id` is its position in the graph; operands are earlier ids."""

    id: int
    op: Op
    inputs: tuple[int, ...]
    shape: Shape
    dtype: DType
    name: str = ""
    attrs: Attrs = field(default=EMPTY)

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    @property
    def label(self) -> str:
        """How errors and reports name this node: id, name and op."""
        return f"node {self.id} {self.name!r} ({self.op.value})"

    @property
    def is_static(self) -> bool:
        return is_static(self.shape)


@dataclass(frozen=True)
class Graph:
    """A verified-on-demand DAG. Build with `GraphBuilder` or `Graph.create`."""

    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, int], ...]
    metadata: Attrs = field(default=EMPTY)

    @classmethod
    def create(
        cls, nodes: Sequence[Node], outputs: Mapping[str, int], metadata: Mapping[str, object] | None = None
    ) -> Graph:
        """Builds and verifies a graph."""
        graph = cls(tuple(nodes), tuple(outputs.items()), Attrs(metadata or {}))
        verify(graph)
        return graph

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id]

    @property
    def output_map(self) -> dict[str, int]:
        return dict(self.outputs)

    @property
    def parameters(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op is Op.PARAMETER)

    @functools.cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """consumers[i]: ids of the nodes reading node i (once per node, in id order)."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for source in dict.fromkeys(node.inputs):
                users[source].append(node.id)
        return tuple(tuple(u) for u in users)

    @functools.cached_property
    def digest(self) -> str:
        """`fingerprint(self)`, computed once: the graph is immutable, and extracting each of a big
        graph's clusters names the source's fingerprint (ResNet50's training graph: 15 s of a job's
        setup went to recomputing it 200 times)."""
        canonical = {
            "nodes": [_structure(n) for n in self.nodes],
            "outputs": [node_id for _, node_id in self.outputs],
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @functools.cached_property
    def output_ids(self) -> frozenset[int]:
        return frozenset(node_id for _, node_id in self.outputs)

    def with_metadata(self, **extra: object) -> Graph:
        return Graph(self.nodes, self.outputs, Attrs({**self.metadata, **extra}))


def _verify_node(graph: Graph, node: Node, position: int) -> None:
    if node.id != position:
        raise IRError(f"{node.label}: id {node.id} does not match its position {position}")
    for source in node.inputs:
        if not 0 <= source < position:
            raise IRError(f"{node.label}: operand {source} is not an earlier node (nodes must be topologically sorted)")
    operands = [graph.nodes[i].type for i in node.inputs]
    try:
        inferred = infer(node.op, node.attrs, operands, node.type)
    except ShapeError as err:
        raise IRError(f"{node.label}: {err}") from None
    if inferred != node.type:
        raise IRError(
            f"{node.label}: declared {node.dtype.value}{list(node.shape)} "
            f"but its operands give {inferred.dtype.value}{list(inferred.shape)}"
        )


def verify(graph: Graph) -> None:
    """Raises IRError for the first malformed node, duplicate parameter name or bad output."""
    for position, node in enumerate(graph.nodes):
        _verify_node(graph, node, position)
    names = [n.attrs["name"] for n in graph.parameters]
    duplicates = sorted({str(n) for n in names if names.count(n) > 1})
    if duplicates:
        raise IRError(f"duplicate parameter name(s): {', '.join(duplicates)}")
    if not graph.outputs:
        raise IRError("graph has no outputs")
    seen: set[str] = set()
    for name, node_id in graph.outputs:
        if name in seen:
            raise IRError(f"output {name!r} is named twice")
        seen.add(name)
        if not 0 <= node_id < len(graph.nodes):
            raise IRError(f"output {name!r} refers to node {node_id}, which does not exist")


def _structure(node: Node) -> list[object]:
    attrs = {k: v for k, v in node.attrs.to_json().items() if not (node.op is Op.PARAMETER and k == "name")}
    return [node.op.value, list(node.inputs), list(node.shape), node.dtype.value, attrs]


def fingerprint(graph: Graph) -> str:
    """A stable hex digest of the graph's structure (names and metadata excluded)."""
    return graph.digest
