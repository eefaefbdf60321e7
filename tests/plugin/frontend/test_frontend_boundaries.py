"""What the frontend does not lower, and why: boundaries, folding, dynamic shapes, control flow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.compiler.ir import Op
from stitchfleet.plugin.frontend.converter import convert
from tests.plugin.tf_harness import check_graph

pytestmark = pytest.mark.tf

P = tf.compat.v1.placeholder


def _graph(build: Any) -> Any:
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph


def test_every_op_has_a_fate_and_every_skipped_op_a_reason() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 8])
        y = tf.nn.relu(tf.matmul(x, w))
        tf.compat.v1.assign_sub(w, 0.1 * tf.gradients(tf.reduce_sum(y), [w])[0])

    graph = _graph(build)
    conversion = convert(graph)
    assert set(conversion.ops) == {op.name for op in graph.get_operations()}
    assert all(d.reason for d in conversion.skipped.values())
    assert conversion.ops["w/Read/ReadVariableOp"].reason == "stateful op ReadVariableOp"
    assert conversion.ops["MatMul"].reason == "compute-intensive"
    assert conversion.ops["AssignSubVariableOp"].fate == "dropped"
    # the update the stateful op reads stays a graph output, so the plugin can reroute it
    assert conversion.node_of("mul:0") in conversion.graph.output_ids


def test_tensor_map_goes_both_ways() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        y = tf.identity(tf.tanh(x), name="y")
        tf.matmul(y, tf.transpose(y), name="mm")

    conversion = convert(_graph(build))
    graph = conversion.graph
    for node_id, ref in conversion.origins.items():
        assert conversion.tensors[ref.name] == node_id
    assert conversion.node_of("y:0") == conversion.node_of("Tanh:0")  # an alias shares the node
    assert conversion.ops["y"].fate == "alias"
    mm = graph.node(conversion.node_of("mm:0"))
    assert mm.op is Op.OPAQUE and mm.attrs["type"] == "MatMul" and mm.attrs["reason"] == "compute-intensive"
    with pytest.raises(KeyError, match="'nope:0' has no IR node"):
        conversion.node_of("nope:0")


def test_ref_variables_and_compute_intensive_ops_are_boundaries() -> None:
    def build() -> None:
        image = P(tf.float32, [2, 6, 6, 3], name="image")
        kernel = tf.compat.v1.Variable(np.ones((3, 3, 3, 4), np.float32), use_resource=False, name="k")
        conv = tf.nn.conv2d(image, kernel, strides=1, padding="SAME")
        a = tf.reshape(tf.nn.relu(conv), [2, 36, 4])
        tf.linalg.matmul(a, a, transpose_b=True, name="bmm")

    conversion = convert(_graph(build))
    assert conversion.ops["k"].reason == "stateful op VariableV2"
    assert conversion.ops["k/read"].fate == "alias"
    assert conversion.ops["Conv2D"].reason == "compute-intensive"
    assert conversion.ops["bmm"].op_type == "BatchMatMulV2" and conversion.ops["bmm"].fate == "boundary"
    assert conversion.ops["Relu"].fate == "lowered"


def test_control_inputs_from_side_effects_make_a_boundary() -> None:
    def build() -> None:
        x = P(tf.float32, [4], name="x")
        v = tf.compat.v1.get_variable("v", [4])
        update = v.assign_add(x, read_value=False)
        with tf.control_dependencies([update]):
            tf.exp(tf.identity(x, name="after"), name="exp_after")
            tf.multiply(x, 2.0, name="scaled")
        tf.exp(x, name="free")

    conversion = convert(_graph(build))
    graph = conversion.graph
    assert conversion.ops["after"].reason == "control inputs"
    after = graph.node(conversion.node_of("after:0"))
    assert after.op is Op.OPAQUE and after.attrs["type"] == "Identity"
    # the constant created under the dependency carries it: it becomes a fed boundary, not a folded value
    assert conversion.ops["scaled/y"].reason == "control inputs"
    assert graph.node(conversion.node_of("scaled/y:0")).op is Op.PARAMETER
    assert conversion.ops["exp_after"].fate == conversion.ops["free"].fate == "lowered"


def test_control_flow_is_a_boundary_and_never_a_crash() -> None:
    def build() -> None:
        x = P(tf.float32, [4], name="x")
        tf.compat.v1.disable_control_flow_v2()
        try:
            out = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, tf.tanh(a)), [0, x])
        finally:
            tf.compat.v1.enable_control_flow_v2()
        tf.exp(out[1], name="after_loop")

    conversion = convert(_graph(build))
    for name in ("while/Enter", "while/Merge", "while/Switch", "while/Tanh", "while/add", "while/Exit"):
        assert conversion.ops[name].reason == "control flow", name
    assert conversion.ops["after_loop"].fate == "lowered"


def test_dynamic_shapes_are_left_out_with_the_reason() -> None:
    def build() -> None:
        x = P(tf.float32, [None, 8], name="x")
        s = P(tf.float32, [4, 8], name="s")
        y = tf.nn.softmax(tf.exp(x))
        tf.reduce_sum(y, axis=0, name="colsum")
        tf.tanh(tf.sigmoid(s) * 2.0, name="static")
        tf.exp(P(tf.float32, None, name="unranked"), name="unranked_exp")

    conversion = convert(_graph(build))
    assert conversion.ops["Exp"].reason == "dynamic shape"
    assert conversion.ops["colsum"].reason == "dynamic shape"
    assert conversion.ops["unranked_exp"].fate == "dropped"
    assert conversion.ops["static"].fate == "lowered"
    assert conversion.graph.node(conversion.node_of("Exp:0")).shape == (-1, 8)


def test_unsupported_ops_and_types_keep_their_reason() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        tf.math.cumsum(tf.exp(x), axis=1, name="cs")
        tf.strings.as_string(x, name="text")
        tf.math.real(tf.complex(x, x), name="re")
        tf.cast(x, tf.int32) // 3

    conversion = convert(_graph(build))
    assert conversion.ops["cs"].reason == "unsupported op Cumsum"
    assert conversion.ops["text"].fate == "dropped"
    assert conversion.ops["Complex"].fate == "dropped"
    assert conversion.ops["floordiv"].reason == "unsupported op FloorDiv"
    node = conversion.graph.node(conversion.node_of("cs:0"))
    assert node.op is Op.OPAQUE and node.attrs["reason"] == "unsupported op Cumsum"


def test_shape_arithmetic_is_folded_exactly_as_tf_computes_it() -> None:
    def build() -> None:
        x = P(tf.float32, [3, 1, 5], name="x")
        y = P(tf.float32, [4, 1], name="y")
        r0, r1 = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x), s1=tf.shape(y))
        stitched = tf.raw_ops.DynamicStitch(indices=[tf.range(3), [3, 4]], data=[tf.shape(x), [7, 9]])
        half = tf.math.floordiv(tf.shape(x), 2) + tf.reduce_prod(tf.shape(y))
        packed = tf.stack([tf.size(x), tf.rank(y), tf.shape(x)[-1]])
        tf.reshape(x * y, tf.concat([half[:1], [-1]], 0), name="flat")
        tf.group(r0, r1, stitched, packed)
        tf.gradients(tf.reduce_sum(tf.sigmoid(x * y)), [x, y])

    checked = check_graph(_graph(build))
    checked.assert_ok()
    folded = checked.conversion.folded
    assert folded["BroadcastGradientArgs:0"].tolist() == [1]
    assert folded["BroadcastGradientArgs:1"].tolist() == [0, 2]
    assert folded["DynamicStitch:0"].tolist() == [3, 1, 5, 7, 9]
    assert checked.folded.checked > 10
    assert checked.conversion.ops["flat"].fate == "lowered"


def test_gradient_tuples_group_pure_ops_and_stay_in_the_ir() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8])
        loss = tf.reduce_sum(tf.tanh(x * w + 1.0))
        # GATE_OP gradients wrap every multi-input gradient in a tuple of Identities behind a NoOp
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)

    checked = check_graph(_graph(build))
    checked.assert_ok()
    ops = checked.conversion.ops
    tuples = [n for n, d in ops.items() if "tuple/control_dependency" in n]
    assert tuples and all(ops[n].fate == "alias" for n in tuples)
    assert any(d.reason == "groups side-effect-free ops (ordering only)" for d in ops.values())


def test_multi_output_boundaries_get_one_node_per_output() -> None:
    def build() -> None:
        x = P(tf.float32, [4, 8], name="x")
        values, indices = tf.math.top_k(tf.exp(x), k=3, name="top")
        tf.tanh(values, name="after")
        tf.cast(indices, tf.float32, name="idx")

    conversion = convert(_graph(build))
    graph = conversion.graph
    values, indices = graph.node(conversion.node_of("top:0")), graph.node(conversion.node_of("top:1"))
    assert (values.op, values.attrs["output"], values.dtype.value, values.shape) == (Op.OPAQUE, 0, "f32", (4, 3))
    assert (indices.attrs["output"], indices.dtype.value) == (1, "i32")
    assert conversion.ops["top"].reason == "unsupported op TopKV2"
    assert conversion.origins[indices.id].output == 1


def test_constants_become_scalars_small_arrays_or_fed_parameters() -> None:
    def build() -> None:
        x = P(tf.float32, [64, 8], name="x")
        tf.multiply(x, tf.constant(np.full((64, 8), 3.0, np.float32)), name="splat")
        tf.add(x, tf.constant(np.arange(8, dtype=np.float32)), name="small")
        tf.subtract(x, tf.constant(np.arange(512, dtype=np.float32).reshape(64, 8)), name="large")

    checked = check_graph(_graph(build))
    checked.assert_ok()
    conversion, graph = checked.conversion, checked.conversion.graph
    splat = graph.node(graph.node(conversion.node_of("splat:0")).inputs[1])
    assert splat.op is Op.BROADCAST and graph.node(splat.inputs[0]).attrs["value"] == 3.0
    small = graph.node(conversion.node_of("Const_1:0"))
    assert small.op is Op.CONSTANT and len(small.attrs["value"]) == 8
    large = graph.node(conversion.node_of("Const_2:0"))
    assert large.op is Op.PARAMETER and large.attrs["name"] == "Const_2:0"
