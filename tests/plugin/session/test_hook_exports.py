"""What a stitched job exports of its graph (the checkpoint's meta graph, graph.pbtxt, `Session.graph_def`) is
the graph as the user wrote it: a process without the plugin imports it and restores the checkpoint.

Regression: the checkpoints of a job run under the plugin carried the stitched copy, the dispatch ops and
the native `StitchfleetDispatch` op in their `.meta`; an eval, export or fine-tuning script without the
plugin failed in `import_meta_graph` ('Op type not registered'). With the Python bridge under TF1 control
flow, the bridge's conds were also in the COND_CONTEXT collection, which an export without their ops
could not import.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 8


@pytest.fixture(params=["native", "python", "python-v1-control-flow"])
def bridge(request: pytest.FixtureRequest) -> Iterator[str]:
    """The bridge; the third case builds TF1 control flow (tf.compat.v1.disable_v2_behavior jobs), restored after."""
    if request.param.endswith("v1-control-flow"):
        V1.disable_control_flow_v2()
    try:
        yield request.param.split("-")[0]
    finally:
        V1.enable_control_flow_v2()


def _bare(node: Any) -> Any:
    """The NodeDef without the attribute TF itself adds to a variable's initializer when the session starts."""
    copy = type(node).FromString(node.SerializeToString())
    copy.attr.pop("_has_manual_control_dependencies", None)
    return copy


def test_the_exported_graph_is_the_users(tmp_path: Path, bridge: str) -> None:
    graph = tf.Graph()
    hook, _ = hooked(tmp_path, f"exports-{bridge}", STITCHFLEET_BRIDGE=bridge)
    with graph.as_default():
        V1.set_random_seed(0)
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(32)(x)))
        logits = tf.keras.layers.Dense(4)(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_or_create_global_step())
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), y: rng.integers(0, 4, 8)}
        written = {node.name: node for node in graph.as_graph_def().node}
        checkpoints = str(tmp_path / "checkpoints")
        with V1.train.MonitoredTrainingSession(checkpoint_dir=checkpoints, hooks=[hook]) as session:
            for _ in range(STEPS):
                session.run([loss, train], feeds)
            final = session.run(loss, feeds)
        exported = graph.as_graph_def()
    assert hook.installed, "the graph was stitched"
    assert not [n.name for n in exported.node if n.name.startswith("stitchfleet") or n.op.startswith("Stitchfleet")]
    changed = [n.name for n in exported.node if n.name in written and _bare(n) != _bare(written[n.name])]
    assert set(written) <= {n.name for n in exported.node} and not changed, changed
    with tf.Graph().as_default(), V1.Session() as plain:  # what an eval script without the plugin does
        latest = tf.train.latest_checkpoint(checkpoints)
        saver = V1.train.import_meta_graph(f"{latest}.meta")
        meta = saver.export_meta_graph()
        saver.restore(plain, latest)
        restored = plain.run("loss:0", {"x:0": feeds[x], "y:0": feeds[y]})
    assert not [n.name for n in meta.graph_def.node if n.name.startswith("stitchfleet")]
    assert restored == pytest.approx(final, rel=1e-6)
