"""Epilogues a target's TF library fuses with their matmul or conv stay with TF, each with its reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.compiler import targets
from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.plugin.frontend import kernel_library
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.frontend.library_fusions import held
from stitchfleet.plugin.graph.training_steps import data_path

pytestmark = pytest.mark.tf

v1 = tf.compat.v1


def _training_graph() -> Any:
    """MatMul+BiasAdd+Relu, Conv2D+BiasAdd, a BiasAdd of an Exp and BatchMatMul*scale+mask, with gradients:
    TF 2.15 with oneDNN runs it as `_MklNativeFusedMatMul` (act), `_MklNativeFusedConv2D` (conv_bias),
    `_MklFusedBatchMatMulV2` (scores), plain `BiasAdd` (plain_bias) and `BiasAddGrad` (step stats)."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [4, 8], name="x")
        w, b = v1.get_variable("w", [8, 16]), v1.get_variable("b", [16])
        act = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w), b, name="dense_bias"), name="act")
        images = v1.placeholder(tf.float32, [2, 6, 6, 3], name="images")
        k, c = v1.get_variable("k", [3, 3, 3, 4]), v1.get_variable("c", [4])
        conv = tf.nn.bias_add(tf.nn.conv2d(images, k, 1, "SAME"), c, name="conv_bias")
        plain = tf.nn.bias_add(tf.exp(x), tf.ones([8]), name="plain_bias")
        q = v1.placeholder(tf.float32, [2, 3, 5, 4], name="q")
        mask = v1.placeholder(tf.float32, [2, 1, 1, 5], name="mask")
        scores = tf.add(
            tf.multiply(tf.matmul(q * act[0, 0], q, transpose_b=True), 0.5, name="scaled"), mask, name="scores"
        )
        parts = [tf.reduce_sum(t * t) for t in (act, conv, plain, tf.nn.softmax(scores))]
        loss = tf.add_n(parts, name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return graph


def _ops_held(backend: str) -> tuple[dict[str, str], set[str]]:
    """TF op -> reason for the held epilogue ops, and the TF ops inside the compiler's clusters."""
    graph = _training_graph()
    conversion = convert(graph, name="t")
    kept = held(conversion, targets.profile(backend).library_fusions, data_path(graph))
    art = compile_graph(conversion.graph, Options(origins=frozenset(conversion.origins), held=kept))
    scope = art.need_clusters()
    inside = {conversion.origins[n].op for c in scope.clusters for n in c.nodes if n in conversion.origins}
    reasons = {e.name: e.reason for e in scope.excluded}
    by_op = {conversion.origins[n].op: reasons[conversion.graph.node(n).name] for n in kept if n in conversion.origins}
    return by_op, inside


def test_cpu_keeps_matmul_and_conv_epilogues_with_onednn() -> None:
    if not kernel_library.onednn():
        pytest.skip("oneDNN is off in this process: test_kernel_libraries runs this test with it on")
    by_op, inside = _ops_held("cpu")
    onednn = "for oneDNN's fused epilogue (grappler remapper)"
    assert by_op == {
        "dense_bias": f"kept with MatMul {onednn}",
        "act": f"kept with MatMul {onednn}",
        "conv_bias": f"kept with Conv2D {onednn}",
        "scaled": f"kept with BatchMatMulV2 {onednn}",
        "scores": f"kept with BatchMatMulV2 {onednn}",
        # the scale's gradient: dead (grappler prunes it), but a cluster would make it a second live reader
        "gradients/scaled_grad/Mul_1": f"kept with BatchMatMulV2 {onednn}: a dead reader grappler prunes",
        # and what only it feeds: a cluster holding its Sum read it, and the dispatch op made it live (the demo's
        # cluster 10 cut `_MklFusedBatchMatMulV2` so)
        "gradients/scaled_grad/Sum": f"kept with BatchMatMulV2 {onednn}: a dead reader grappler prunes",
        "gradients/scaled_grad/Reshape": f"kept with BatchMatMulV2 {onednn}: a dead reader grappler prunes",
    }
    assert not inside & set(by_op)
    # a BiasAdd of a non-matmul input, and the backward's column reductions, are still stitched
    assert {"plain_bias", "gradients/dense_bias_grad/BiasAddGrad", "gradients/conv_bias_grad/BiasAddGrad"} <= inside


def _fused_by_tf() -> set[str]:
    """The ops of `_training_graph` that TF in this process runs fused into the op before them: a fused node
    (`fused_ops`, named after its last epilogue op) stands for that op and the epilogue ops above it."""
    graph = _training_graph()
    rng = np.random.default_rng(0)
    feeds = {
        f"{p.name}:0": rng.standard_normal(p.outputs[0].shape)
        for p in graph.get_operations()
        if p.type == "Placeholder"
    }
    options, metadata = v1.RunOptions(output_partition_graphs=True), v1.RunMetadata()
    with graph.as_default(), v1.Session() as session:
        session.run(v1.global_variables_initializer())
        session.run("train", feeds, options=options, run_metadata=metadata)
    fused: set[str] = set()
    for node in (n for g in metadata.partition_graphs for n in g.node if n.attr["fused_ops"].list.s):
        op = graph.get_operation_by_name(node.name)
        for _ in node.attr["fused_ops"].list.s:
            fused.add(op.name)
            op = op.inputs[0].op
    return fused


def test_cpu_keeps_what_the_kernel_library_in_use_fuses() -> None:
    """Regression (oneDNN off, an EPYC without AVX-512): the cpu profile held oneDNN's epilogues whatever TF
    ran, so BatchMatMul x scale + mask, which TF's Eigen kernels never fuse, stayed out of every cluster. The
    epilogues held are TF's own fusions in this process (and the dead readers that would cut them)."""
    by_op, inside = _ops_held("cpu")
    fused = _fused_by_tf()
    library = "oneDNN" if kernel_library.onednn() else "Eigen"
    assert {op for op, why in by_op.items() if "dead reader" not in why} == fused, (by_op, fused)
    assert all(f"for {library}'s fused epilogue" in why for why in by_op.values())
    assert not inside & set(by_op)
    if not kernel_library.onednn():
        assert {"scaled", "scores"} <= inside  # BatchMatMul+Mul+Add is a oneDNN-only fusion


def test_cuda_keeps_only_what_tf_gpu_kernels_fuse() -> None:
    by_op, inside = _ops_held("cuda")
    assert set(by_op) == {"dense_bias", "act", "conv_bias"}  # BatchMatMul+Mul+Add is a oneDNN-only fusion
    assert {"scaled", "scores", "plain_bias"} <= inside


def test_a_backend_without_library_fusions_stitches_every_epilogue() -> None:
    by_op, inside = _ops_held("sim")
    assert by_op == {}
    assert {"dense_bias", "act", "conv_bias", "plain_bias"} <= inside
