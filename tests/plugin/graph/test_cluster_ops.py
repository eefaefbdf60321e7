"""plugin.interior: the TF ops of a mapped cluster, and the outside values its TF ops read and its IR does not.

Keras' BatchNormalization in training mode, forward and gradient, mapped alone: the moving statistics
(variable reads the forward's lowering ignores) and the forward's reserve spaces (which the gradient's
lowering recomputes from x) become unread inputs, PARAMETERs nothing reads; the translation check
derives the reserve spaces from a copy of the forward, so TF's gradient and the IR see values that
belong together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import DType, GraphBuilder
from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.compiler.plan import plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.plugin.frontend import kernel_library
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.cluster_ops import (
    UNREAD_KEY,
    UnmappableError,
    check_device_specific,
    input_shape,
    with_unread,
)
from stitchfleet.plugin.graph.mapping import Site, StepOps, map_cluster
from stitchfleet.plugin.guard.translation import CONTEXT, check_sites, isolated
from tests.plugin.site_harness import CACHE

pytestmark = pytest.mark.tf

P = tf.compat.v1.placeholder


def test_the_shape_of_an_unread_input() -> None:
    graph = tf.Graph()
    with graph.as_default():
        static, partial, unknown = P(tf.float32, [4, 8]), P(tf.float32, [None, 8]), P(tf.float32, None)
        x, vectors = P(tf.float32, [2, 3, 3, 4]), [P(tf.float32, [4]) for _ in range(4)]
        outputs = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=vectors[0], offset=vectors[1], mean=vectors[2], variance=vectors[3], is_training=True
        )
    assert input_shape(static) == (4, 8) and input_shape(partial) == (-1, 8)
    assert input_shape(unknown) is None  # no rank: it cannot be a PARAMETER
    reserve = outputs[5]
    # V3's flat buffer: TF gives no rank; the declared one is the rank of what the kernel in use returns
    # (oneDNN's: empty, (0,); Eigen's: a scalar), which the dispatch op matches the input against
    feeds = {x: np.ones((2, 3, 3, 4), np.float32), **{v: np.ones(4, np.float32) for v in vectors}}
    with tf.compat.v1.Session(graph=graph) as session:
        ran = session.run(reserve, feeds)
    assert reserve.shape.rank is None and input_shape(reserve) == (-1,) * np.ndim(ran)


def test_unread_inputs_are_trailing_parameters_nothing_reads() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8), DType.F32)
    b.output("y", b.reduce_sum(b.exp(x), (1,)))
    graph = b.build()
    tf_graph = tf.Graph()
    with tf_graph.as_default():
        moving, buffer = P(tf.float32, [8], name="moving"), P(tf.float32, [None], name="buffer")
    grown = with_unread(graph, [moving, buffer])
    assert [p.shape for p in grown.parameters] == [(4, 8), (8,), (-1,)] and grown.metadata.get(UNREAD_KEY) == 2
    assert not grown.consumers[grown.parameters[1].id] and grown.output_map == graph.output_map
    values = {
        "x": np.ones((4, 8), np.float32),
        "moving:0": np.zeros(8, np.float32),
        "buffer:0": np.zeros(0, np.float32),
    }
    executable = compile_cluster(grown, CACHE, plan_cluster(grown, 0))
    (got,), _ = executable.run(list(values.values()))
    np.testing.assert_allclose(got, evaluate(grown, values)["y"], rtol=1e-6)
    assert with_unread(graph, []) is graph
    with tf_graph.as_default():
        text = tf.constant("text")
    with pytest.raises(UnmappableError, match="cannot be a cluster input"):
        with_unread(graph, [text])


def _keras_norm() -> tuple[Any, list[Any]]:
    graph = tf.Graph()
    with graph.as_default():
        tf.keras.utils.set_random_seed(0)
        x = P(tf.float32, [4, 6, 6, 3], name="x")
        norm = tf.keras.layers.BatchNormalization()
        h = tf.nn.relu6(norm(tf.keras.layers.Conv2D(8, 3, use_bias=False)(x), training=True))
        loss = tf.reduce_sum(tf.square(tf.keras.layers.Conv2D(4, 3)(h)), name="loss")
        updates = list(norm.updates)
        with tf.control_dependencies(updates):
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return graph, updates


def _sites(graph: Any) -> list[Site]:
    with graph.as_default():
        conversion = convert(StepOps(graph))
        art = compile_graph(conversion.graph, Options(baselines=("per_op",)))
        pairs = enumerate(zip(art.cluster_graphs, art.stitch, strict=True))
        return [map_cluster(graph, conversion, k, g, p) for k, (g, p) in pairs]


def _holding(sites: list[Site], kind: str) -> Site:
    (site,) = [s for s in sites if any(op.type == kind for op in s.internal)]
    return site


def test_keras_batch_norm_maps_with_its_variable_reads_and_reserve_spaces_as_unread_inputs() -> None:
    graph, updates = _keras_norm()
    sites = _sites(graph)  # before: both refused, "reaches ReadVariableOp op ... outside its inputs"
    forward, backward = _holding(sites, "FusedBatchNormV3"), _holding(sites, "FusedBatchNormGradV3")
    fused = graph.get_operation_by_name("batch_normalization/FusedBatchNormV3")
    unread = forward.inputs[len(forward.inputs) - forward.graph.metadata.get(UNREAD_KEY) :]
    assert [t.name for t in unread] == [t.name for t in fused.inputs[3:5]]  # the moving mean and variance reads
    assert all(t.op.type == "ReadVariableOp" for t in unread)
    assert not any(op.op_def.is_stateful for op in forward.internal)  # the reads stay outside, as inputs
    unread = backward.inputs[len(backward.inputs) - backward.graph.metadata.get(UNREAD_KEY) :]
    assert [t.name for t in unread] == [t.name for t in fused.outputs[3:6]]  # the reserve spaces
    assert fused.name not in backward.internal_names  # the forward is not computed again
    # reserve_space_3: a flat buffer from oneDNN's kernel, an unwritten scalar from Eigen's (oneDNN off)
    assert [p.shape for p in backward.graph.parameters][-1] == ((-1,) if kernel_library.onednn() else ())
    # the moving-average updates read what the stitched op outputs (their arithmetic is in the cluster):
    # rerouted onto it, they run after it, as they ran after FusedBatchNormV3
    outputs = {t.name for t in forward.outputs}
    assert len(updates) == 2 and all(op.inputs[1].name in outputs for op in updates)


def test_the_translation_check_passes_batch_norm_clusters_with_reserve_spaces_derived() -> None:
    graph, _ = _keras_norm()
    sites = _sites(graph)
    backward = _holding(sites, "FusedBatchNormGradV3")
    alone = isolated(graph, backward)
    copies = [n for n in alone.node if n.name.startswith(f"{CONTEXT}/") and n.op == "FusedBatchNormV3"]
    assert len(copies) == 1  # the reserve spaces come from a copy of the forward, fed the same x
    assert check_sites(graph, sites, 8.0) == {}


def test_reserve_spaces_fed_at_random_would_fail_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why they are derived: fed independent random values, TF's gradient reads a 'variance' that is not
    x's (negative, even) while the IR recomputes it from x, and a faithful cluster is refused."""
    from stitchfleet.plugin.guard import translation

    graph, _ = _keras_norm()
    backward = _holding(_sites(graph), "FusedBatchNormGradV3")
    monkeypatch.setattr(translation, "_derived", lambda site: {})
    refused = check_sites(graph, [backward], 8.0)
    assert list(refused) == [backward.index] and "translation differs from TF" in refused[backward.index]


@pytest.mark.parametrize(
    ("device", "gpu", "refused"),
    [("/device:GPU:0", False, True), ("", True, True), ("", False, False), ("/cpu:0", True, False)],
)
def test_a_reserve_space_output_is_refused_where_tf_runs_batch_norm_on_a_gpu(
    device: str, gpu: bool, refused: bool
) -> None:
    """On a GPU TF's reserve space 2 is cuDNN's inverse standard deviation, which TF's gradient reads: a
    stitched variance there would be silently wrong (no GPU here: the op's device string decides)."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        fused = tf.raw_ops.FusedBatchNormV3(
            x=P(tf.float32, [2, 3, 3, 4]),
            scale=P(tf.float32, [4]),
            offset=P(tf.float32, [4]),
            mean=P(tf.float32, [4]),
            variance=P(tf.float32, [4]),
            is_training=True,
        )
    check_device_specific([fused[0], fused[1]], lambda: gpu)  # y and the running mean: the same everywhere
    if refused:
        with pytest.raises(UnmappableError, match="batch-norm reserve space"):
            check_device_specific([fused[0], fused[4]], lambda: gpu)
    else:
        check_device_specific([fused[0], fused[4]], lambda: gpu)
