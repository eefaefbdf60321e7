"""IR: builder, verifier errors, printer, fingerprint and JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stitchfleet.compiler.ir import (
    Attrs,
    DType,
    Graph,
    GraphBuilder,
    IRError,
    IRFormatError,
    Kind,
    Node,
    Op,
    ShapeError,
    dumps,
    fingerprint,
    load,
    loads,
    print_graph,
    save,
)


def layernorm(rows: int = 4, cols: int = 8) -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (rows, cols), "f32")
    gamma = b.parameter("gamma", (cols,), "f32")
    mean = b.reduce_mean(x, (1,), keepdims=True)
    centered = x - mean
    var = b.reduce_mean(b.square(centered), (1,), keepdims=True)
    b.output("y", centered * b.rsqrt(var + 1e-5) * gamma)
    return b.build({"case": "layernorm"})


def test_op_kinds() -> None:
    assert Op.ADD.kind is Kind.ELEMENTWISE_LIGHT
    assert Op.EXP.kind is Kind.ELEMENTWISE_HEAVY
    assert Op.REDUCE_MEAN.is_reduction
    assert not Op.OPAQUE.is_memory_intensive
    assert not Op.PARAMETER.is_memory_intensive
    assert Op.CONSTANT.is_memory_intensive
    assert Op.SELECT.arity == 3
    assert Op.CONCAT.arity is None
    assert all(op.kind in Kind for op in Op)


def test_builder_inserts_explicit_broadcasts() -> None:
    graph = layernorm()
    broadcasts = [n for n in graph.nodes if n.op is Op.BROADCAST]
    assert broadcasts, "implicit broadcasting must become BROADCAST nodes"
    for node in graph.nodes:
        if node.op in (Op.ADD, Op.SUB, Op.MUL):
            shapes = {graph.node(i).shape for i in node.inputs}
            assert len(shapes) == 1


def test_json_round_trip(tmp_path) -> None:
    graph = layernorm()
    again = loads(dumps(graph))
    assert again == graph
    assert fingerprint(again) == fingerprint(graph)
    assert load(save(graph, tmp_path / "g" / "ln.json")) == graph
    assert print_graph(again) == print_graph(graph)


def test_printer_is_stable_and_readable() -> None:
    text = print_graph(layernorm())
    assert "%0 = PARAMETER f32[4,8] () {name='x'}  # x" in text
    assert "REDUCE_MEAN f32[4] (%0) {axes=[1]}" in text
    assert text.endswith("output y = %16\n")
    assert text == print_graph(layernorm())


def test_fingerprint_ignores_names_but_not_structure() -> None:
    renamed = GraphBuilder()
    x = renamed.parameter("other", (4, 8))
    renamed.output("z", renamed.exp(x))
    original = GraphBuilder()
    x2 = original.parameter("x", (4, 8))
    original.output("y", original.exp(x2))
    assert fingerprint(renamed.build()) == fingerprint(original.build())
    changed = GraphBuilder()
    x3 = changed.parameter("x", (4, 9))
    changed.output("y", changed.exp(x3))
    assert fingerprint(changed.build()) != fingerprint(original.build())


def test_nodes_are_immutable() -> None:
    node = layernorm().node(0)
    with pytest.raises(AttributeError):
        node.op = Op.ADD  # type: ignore[misc]
    assert hash(node.attrs) == hash(Attrs(name="x"))


def _bad_graph(node: Node) -> Graph:
    x = Node(0, Op.PARAMETER, (), (4, 8), DType.F32, "x", Attrs(name="x"))
    return Graph((x, node), (("out", 1),))


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (Node(1, Op.ADD, (0,), (4, 8), DType.F32, "a"), "takes 2 operand"),
        (Node(1, Op.EXP, (0,), (4, 9), DType.F32, "e"), "declared f32[4, 9] but its operands give f32[4, 8]"),
        (Node(1, Op.EXP, (5,), (4, 8), DType.F32, "e"), "operand 5 is not an earlier node"),
        (Node(1, Op.REDUCE_SUM, (0,), (4,), DType.F32, "r", Attrs(axes=(2,))), "axes (2,)"),
        (Node(1, Op.TRANSPOSE, (0,), (8, 4), DType.F32, "t", Attrs(perm=(0, 0))), "not a permutation"),
        (Node(1, Op.RESHAPE, (0,), (5, 8), DType.F32, "r", Attrs(shape=(5, 8))), "changes the element count"),
        (Node(1, Op.LOGICAL_NOT, (0,), (4, 8), DType.BOOL, "n"), "needs bool operands"),
        (Node(1, Op.BROADCAST, (0,), (3, 8), DType.F32, "b", Attrs(shape=(3, 8), dims=(0, 1))), "cannot become"),
        (Node(7, Op.EXP, (0,), (4, 8), DType.F32, "e"), "does not match its position"),
    ],
)
def test_verifier_names_node_and_problem(node: Node, message: str) -> None:
    with pytest.raises(IRError) as caught:
        Graph.create(_bad_graph(node).nodes, {"out": 1})
    text = str(caught.value)
    assert message in text
    assert f"{node.name!r} ({node.op.value})" in text


def test_verifier_graph_level_errors() -> None:
    x = Node(0, Op.PARAMETER, (), (2,), DType.F32, "x", Attrs(name="x"))
    y = Node(1, Op.PARAMETER, (), (2,), DType.F32, "y", Attrs(name="x"))
    with pytest.raises(IRError, match="duplicate parameter name"):
        Graph.create((x, y), {"a": 0})
    with pytest.raises(IRError, match="no outputs"):
        Graph.create((x,), {})
    with pytest.raises(IRError, match="refers to node 9"):
        Graph.create((x,), {"a": 9})


def test_builder_rejects_bad_shapes() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    y = b.parameter("y", (3, 8))
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        b.add(x, y)
    with pytest.raises(ShapeError, match="negative dimension"):
        b.parameter("z", (4, -2))
    i = b.parameter("i", (4, 8), "i32")
    with pytest.raises(ShapeError, match="different dtypes"):
        b.op(Op.ADD, (x, i))
    with pytest.raises(ShapeError, match="floating-point"):
        b.exp(i)


def test_load_errors_name_the_problem() -> None:
    text = dumps(layernorm())
    with pytest.raises(IRFormatError, match="truncated"):
        loads(text[: len(text) // 2])
    doc = json.loads(text)
    doc["nodes"][3]["op"] = "FROBNICATE"
    with pytest.raises(IRFormatError, match="node 3: unknown op 'FROBNICATE'"):
        loads(json.dumps(doc))
    doc = json.loads(text)
    doc["nodes"][2]["shape"] = [4, "x"]
    with pytest.raises(IRFormatError, match="node 2: shape must be a list of integers"):
        loads(json.dumps(doc))
    doc = json.loads(text)
    doc["nodes"][2]["shape"] = [5]
    with pytest.raises(IRFormatError, match=r"node 2 'reduce_mean.2' \(REDUCE_MEAN\): declared"):
        loads(json.dumps(doc))
    doc = json.loads(text)
    doc["version"] = 99
    with pytest.raises(IRFormatError, match="version 99"):
        loads(json.dumps(doc))
    doc = json.loads(text)
    del doc["nodes"][1]["dtype"]
    with pytest.raises(IRFormatError, match="node 1: missing field 'dtype'"):
        loads(json.dumps(doc))
    doc = json.loads(text)
    doc["nodes"][1]["dtype"] = "f8"
    with pytest.raises(IRFormatError, match="unknown dtype 'f8'"):
        loads(json.dumps(doc))


def test_data_movement_shapes() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 6, 8))
    assert b.transpose(x, (2, 0, 1)).shape == (8, 4, 6)
    assert b.slice(x, (0, 1, 0), (4, 6, 8), (2, 2, 3)).shape == (2, 3, 3)
    assert b.concat([x, x], axis=1).shape == (4, 12, 8)
    assert b.reshape(x, (24, 8)).shape == (24, 8)
    assert b.broadcast(b.reduce_sum(x, (1,)), (4, 6, 8), (0, 2)).shape == (4, 6, 8)
    assert b.cast(x, "f16").dtype is DType.F16
    assert b.op(Op.GREATER, (x, x)).dtype is DType.BOOL
    constant = b.constant([[1.0, 2.0], [3.0, 4.0]])
    assert constant.shape == (2, 2)


_UNARY_CHAIN = [Op.NEG, Op.ABS, Op.EXP, Op.TANH, Op.SIGMOID, Op.SQUARE, Op.RELU, Op.SIGN]


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.sampled_from([*_UNARY_CHAIN, Op.ADD, Op.MUL, Op.SUB, Op.MAXIMUM]), min_size=1, max_size=12),
    rows=st.integers(1, 5),
    cols=st.integers(1, 7),
    dtype=st.sampled_from(["f32", "f16", "bf16", "f64"]),
)
def test_random_chains_round_trip(ops: list[Op], rows: int, cols: int, dtype: str) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (rows, cols), dtype)
    y = b.parameter("y", (cols,), dtype)
    value = x
    for op in ops:
        value = b.unary(op, value) if op in _UNARY_CHAIN else b.binary(op, value, y)
    b.output("out", value)
    graph = b.build()
    again = loads(dumps(graph))
    assert again == graph
    assert fingerprint(again) == fingerprint(graph)


def test_a_graphs_fingerprint_is_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: extracting each cluster of a big graph recomputed the source's fingerprint (15 s of
    a ResNet50 job's setup); the graph is immutable, so its digest is kept with it."""
    from stitchfleet.compiler.ir import graph as graph_module
    from stitchfleet.compiler.subgraph import extract

    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    for k in range(6):
        x = b.tanh(b.add(x, b.constant(float(k))))
    b.output("y", x)
    source = b.build()
    calls = 0
    structure = graph_module._structure

    def counted(node: Any) -> list[object]:
        nonlocal calls
        calls += 1
        return structure(node)

    monkeypatch.setattr(graph_module, "_structure", counted)
    parts = [extract(source, [n.id for n in source.nodes if n.op is not Op.PARAMETER][k : k + 2]) for k in range(4)]
    assert calls == len(source.nodes)  # the source's digest, once, for four extractions
    assert len({p.metadata["source_fingerprint"] for p in parts}) == 1
    assert fingerprint(source) == parts[0].metadata["source_fingerprint"]
