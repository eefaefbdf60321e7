"""Graph <-> JSON, with a format name and version, so graphs travel between machines.

Input: a `Graph`, or JSON text / a file written by `dumps`/`save`. Output: the JSON
text, or the verified `Graph`. Loading bad input (truncated JSON, another format or
version, unknown op or dtype, malformed shape, wrong wiring) raises `IRFormatError`
naming the node and field at fault. Shapes are metadata only: no tensor data is stored
beyond small CONSTANT values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from stitchfleet.compiler.ir.attrs import Attrs
from stitchfleet.compiler.ir.graph import Graph, IRError, Node, verify
from stitchfleet.compiler.ir.shapes import ShapeError, check_shape
from stitchfleet.compiler.ir.types import DType, Op

FORMAT = "stitchfleet-ir"
VERSION = 1


class IRFormatError(IRError):
    """A JSON document is not a valid stitchfleet IR graph."""


def to_json(graph: Graph) -> dict[str, object]:
    """The JSON-ready document of a graph."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "metadata": graph.metadata.to_json(),
        "nodes": [_node_json(n) for n in graph.nodes],
        "outputs": [{"name": name, "node": node_id} for name, node_id in graph.outputs],
    }


def _node_json(node: Node) -> dict[str, object]:
    return {
        "id": node.id,
        "op": node.op.value,
        "name": node.name,
        "dtype": node.dtype.value,
        "shape": list(node.shape),
        "inputs": list(node.inputs),
        "attrs": node.attrs.to_json(),
    }


def dumps(graph: Graph) -> str:
    """Compact but line-per-node JSON: small files that diff well."""
    doc = to_json(graph)
    nodes = ",\n  ".join(json.dumps(n, separators=(",", ":")) for n in doc.pop("nodes"))  # type: ignore[attr-defined]
    head = json.dumps(doc, separators=(",", ":"))[:-1]
    return f'{head},"nodes":[\n  {nodes}\n]}}\n'


def save(graph: Graph, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dumps(graph))
    return target


def loads(text: str) -> Graph:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise IRFormatError(f"not valid JSON (truncated?): {err.msg} at line {err.lineno} column {err.colno}") from None
    return from_json(doc)


def load(path: str | Path) -> Graph:
    try:
        return loads(Path(path).read_text())
    except IRFormatError as err:
        raise IRFormatError(f"{path}: {err}") from None


def from_json(doc: object) -> Graph:
    """Parses and verifies a JSON document into a Graph."""
    if not isinstance(doc, Mapping):
        raise IRFormatError("the document is not a JSON object")
    if doc.get("format") != FORMAT:
        raise IRFormatError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise IRFormatError(f"format version {doc.get('version')!r} is not supported (this reader knows {VERSION})")
    nodes = _list(doc, "nodes", "graph")
    graph = Graph(
        tuple(_parse_node(i, raw) for i, raw in enumerate(nodes)),
        _parse_outputs(_list(doc, "outputs", "graph")),
        Attrs(_dict(doc, "metadata", "graph")) if "metadata" in doc else Attrs(),
    )
    try:
        verify(graph)
    except IRError as err:
        raise IRFormatError(str(err)) from None
    return graph


def _field(raw: Mapping[str, object], key: str, kind: type, where: str) -> object:
    if key not in raw:
        raise IRFormatError(f"{where}: missing field {key!r}")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise IRFormatError(f"{where}: field {key!r} should be a {kind.__name__}, got {type(value).__name__}")
    return value


def _list(raw: Mapping[str, object], key: str, where: str) -> list[object]:
    value = _field(raw, key, list, where)
    assert isinstance(value, list)  # _field checked it; the assert narrows the type
    return value


def _dict(raw: Mapping[str, object], key: str, where: str) -> dict[str, object]:
    value = _field(raw, key, dict, where)
    assert isinstance(value, dict)
    return value


def _str(raw: Mapping[str, object], key: str, where: str) -> str:
    return str(_field(raw, key, str, where))


def _int(raw: Mapping[str, object], key: str, where: str) -> int:
    value = _field(raw, key, int, where)
    assert isinstance(value, int)
    return value


def _parse_node(position: int, raw: object) -> Node:
    where = f"node {position}"
    if not isinstance(raw, Mapping):
        raise IRFormatError(f"{where}: not a JSON object")
    try:
        op = Op.parse(_str(raw, "op", where))
        dtype = DType.parse(_str(raw, "dtype", where))
        shape = check_shape(_list(raw, "shape", where), "shape")
        inputs = check_shape(_list(raw, "inputs", where), "inputs")
        node_id = _int(raw, "id", where)
        attrs = Attrs(_dict(raw, "attrs", where)) if "attrs" in raw else Attrs()
    except (ValueError, TypeError, ShapeError) as err:
        raise IRFormatError(f"{where}: {err}") from None
    return Node(node_id, op, inputs, shape, dtype, str(raw.get("name", "")), attrs)


def _parse_outputs(raw: list[object]) -> tuple[tuple[str, int], ...]:
    outputs = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise IRFormatError(f"output {i}: not a JSON object")
        outputs.append((_str(item, "name", f"output {i}"), _int(item, "node", f"output {i}")))
    return tuple(outputs)
