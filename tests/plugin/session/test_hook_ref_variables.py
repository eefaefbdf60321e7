"""TF1 (ref) variables, as `tf.compat.v1.disable_v2_behavior()` jobs make them, train stitched like resource ones.

Regression: a sparse embedding's Adam update reads its slots through their `read` Identity ops, which the
cluster holds; the cluster's input is then the slot's ref tensor (float_ref), and the dispatch op's TF
function declared its argument as float_ref. Every stitched step failed ('expected type float != float_ref'),
ran again as written, and stitching reverted for the job at its first stitched step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tests.plugin.hook_harness import events, hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 10


def test_ref_variables_with_a_sparse_update_stay_stitched(tmp_path: Path) -> None:
    graph = tf.Graph()
    hook, url = hooked(tmp_path, "ref-variables", STITCHFLEET_PROBE_STEPS="0")
    rng = np.random.default_rng(0)
    with graph.as_default():
        V1.set_random_seed(0)
        ids = V1.sparse_placeholder(tf.int64, name="ids")
        x = V1.placeholder(tf.float32, [8, 16], name="x")
        y = V1.placeholder(tf.int64, [8], name="y")
        init = V1.random_normal_initializer(seed=1)
        table = V1.get_variable("table", [20, 16], initializer=init, use_resource=False)
        w = V1.get_variable("w", [16, 4], initializer=init, use_resource=False)
        h = tf.nn.gelu(x + tf.nn.embedding_lookup_sparse(table, ids, None, combiner="mean"))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(h, w)))
        train = V1.train.AdamOptimizer(1e-3).minimize(loss, global_step=V1.train.get_or_create_global_step())
        indices = np.array([[i, j] for i in range(8) for j in range(2)], np.int64)
        feeds = {
            ids: V1.SparseTensorValue(indices, rng.integers(0, 20, 16), [8, 2]),
            x: rng.standard_normal((8, 16)).astype(np.float32),
            y: rng.integers(0, 4, 8),
        }
        with V1.train.MonitoredSession(hooks=[hook]) as session:
            for _ in range(STEPS):
                session.run([loss, train], feeds)
    assert hook.installed and any(c.kernel.calls for c, _ in hook.installed), "stitched steps ran"
    assert not [e.detail for e in events(url, "revert")]
