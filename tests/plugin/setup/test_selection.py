"""candidates: clusters whose TF ops cannot run as a graph function here stay with TF.

Regression: on oneDNN builds of TF (the default on x86 CPUs) grappler fuses a FusedBatchNorm whose
output 0 feeds only a Relu, inside the dispatch op's fallback function, into one op that fails
every call ("Missing 0-th output from FusedBatchNormV3"): every Keras CNN job failed its first step
on the twin and reverted stitching for the whole job. And what a dumping job writes: every compiler
stage, and why the plugin changed a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.plugin.frontend.kernel_library import onednn
from stitchfleet.plugin.setup.selection import SITE_CHANGES, fallback_hazard
from tests.compiler.test_pipeline import DUMPS
from tests.plugin.hook_harness import hooked, train

pytestmark = pytest.mark.tf
v1 = tf.compat.v1


def _conv_bn(activation: str) -> tuple[Any, Any, Any, dict[Any, Any]]:
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        tf.keras.utils.set_random_seed(0)
        x = v1.placeholder(tf.float32, [2, 16, 16, 3], name="x")
        y = v1.placeholder(tf.int32, [2], name="y")
        h = tf.keras.layers.Conv2D(8, 3, padding="same")(x)
        h = tf.keras.layers.BatchNormalization(epsilon=1.001e-5)(h, training=True)
        h = tf.keras.layers.Activation(activation)(h)
        logits = tf.keras.layers.Dense(4)(tf.keras.layers.GlobalAveragePooling2D()(h))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=v1.train.get_or_create_global_step())
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((2, 16, 16, 3)).astype(np.float32), y: np.array([1, 2], np.int32)}
    return graph, loss, train, feeds


def _batch_norms(graph: Any) -> list[Any]:
    return [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]


def test_a_batch_norm_feeding_a_relu_is_a_hazard_on_onednn_only() -> None:
    graph, *_ = _conv_bn("relu")
    ops = graph.get_operations()
    assert "oneDNN remapper" in (fallback_hazard(ops, onednn=True) or "")
    assert fallback_hazard(ops, onednn=False) is None
    assert fallback_hazard(_batch_norms(graph), onednn=True) is None  # the Relu is not in that cluster
    other, *_ = _conv_bn("relu6")
    assert fallback_hazard(other.get_operations(), onednn=True) is None


def test_a_batch_norm_with_a_side_input_before_the_relu_is_a_hazard() -> None:
    """NASNetMobile's stem: the remapper also fuses FusedBatchNorm + Add(side input) + Relu."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [2, 4, 4, 3])
        scale, offset = tf.ones([3]), tf.zeros([3])
        y, *_ = tf.raw_ops.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=offset, variance=scale)
        tf.nn.relu(y + x)
    assert "oneDNN remapper" in (fallback_hazard(graph.get_operations(), onednn=True) or "")


def _train(graph: Any, loss: Any, train: Any, feeds: dict[Any, Any], hook: Any) -> list[float]:
    with graph.as_default(), v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
        return [float(session.run([loss, train], feeds)[0]) for _ in range(8)]


def test_a_keras_conv_batch_norm_relu_job_keeps_stitching(tmp_path: Path) -> None:
    plain = _train(*_conv_bn("relu"), None)
    hook, _ = hooked(tmp_path, "conv-bn-relu")
    stitched = _train(*_conv_bn("relu"), hook)
    assert hook.controller is not None and hook.controller.job_reverted is None, hook.controller.job_reverted
    assert hook.installed and sum(hook.backend_calls.values()) > 0
    hazards = [why for why in hook.off.values() if "oneDNN remapper" in why]
    assert bool(hazards) == onednn()
    assert stitched == pytest.approx(plain, rel=1e-5)


def test_a_dumping_job_dumps_every_stage_and_why_the_plugin_changed_a_cluster(tmp_path: Path) -> None:
    """One-way compile in a job: the compiler's stages, kernel IR and sources included, and the plugin's
    own changes (`sites.json`); a cluster the plugin left as the compiler drew it lists none."""
    dump = tmp_path / "dump"
    hook, _ = hooked(tmp_path, "dumping", STITCHFLEET_DUMP_DIR=str(dump))
    train(3, hook)
    names = sorted(p.name for p in dump.iterdir())
    assert names[:9] == list(DUMPS)
    assert {d["stage"] for d in json.loads((dump / "08_report.json").read_text())["decisions"]} >= {"op_clusters"}
    sites = json.loads((dump / SITE_CHANGES).read_text())
    assert sites and all(c["stage"] == "sites" and c["reason"] for s in sites for c in s["changes"])
    assert any(not s["changes"] for s in sites)  # planned once: the compiler's graph and plan kept
