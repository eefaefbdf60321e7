"""A TF1 Transformer written with Keras layers (MultiHeadAttention with attention dropout, dropout, LayerNorm,
GELU Dense) and a `None` batch trains under the hook with every cluster installed, as plain TF computes it.

Regressions (issue 34): the attention dropout draws `Shape(softmax)`, whose batch dimension Grappler loses through
the `Einsum`s: the twin could not share its random stream ("draws a shape no tensor outside the clusters has") and
no cluster of the job was stitched (`random_streams`, now the signature's oracle relates it). Past that, five
clusters recomputing a gradient's `Shape` of a tensor no held tensor has the shape of (the Dense's input, whose
`[batch * tokens, width]` Tensordot is all a cluster holds) were declined at rewrite ("the shape of 'x:0' depends
on the job's shape signature and no tensor at hand has it"); their TF paths now compute that shape from the held
tensors' dimensions (`recompute.rebuilt`). The job's first steps feed another batch than `begin`'s guess, so the
dispatch ops' TF paths (the rebuilt shapes) run for another batch than the one `begin` built for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph import graph_identity  # noqa: E402
from stitchfleet.plugin.session.hook import StitchHook  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from tests.plugin.hook_harness import assert_tf_paths_match, events, hooked  # noqa: E402
from tests.plugin.session.test_hook_signatures import SETTLE_S  # noqa: E402

pytestmark = pytest.mark.tf
BATCH, TOKENS, WIDTH, HEADS, STEPS = 8, 16, 64, 4, 8


def transformer() -> Any:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [None, TOKENS, WIDTH], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, TOKENS, WIDTH], name="y")
        seeded = tf.keras.initializers.GlorotUniform  # Keras draws unseeded initial values per graph
        h = x
        for block in range(2):
            attention = tf.keras.layers.MultiHeadAttention(
                HEADS, WIDTH // HEADS, dropout=0.1, kernel_initializer=seeded(seed=10 + block)
            )
            attended = attention(h, h, training=True)
            h = tf.keras.layers.LayerNormalization()(h + tf.keras.layers.Dropout(0.1)(attended, training=True))
            inner = tf.keras.layers.Dense(2 * WIDTH, activation=tf.nn.gelu, kernel_initializer=seeded(seed=20 + block))
            outer = tf.keras.layers.Dense(WIDTH, kernel_initializer=seeded(seed=30 + block))
            h = tf.keras.layers.LayerNormalization()(h + outer(inner(h)))
        loss = tf.reduce_mean(tf.square(h - y), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-4).minimize(loss, name="train")
    return graph


def train(hook: StitchHook | None) -> list[float]:
    graph, rng = transformer(), np.random.default_rng(0)
    xs = rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)
    ys = rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)
    losses = []
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
        for step in range(STEPS):
            losses.append(float(session.run(["loss:0", "train"], {"x:0": xs, "y:0": ys})[0]))
            if step == 2 and hook is not None and hook.signatures is not None:
                assert hook.signatures.wait(SETTLE_S)
        if hook is not None:  # every cluster's TF path against the user's graph at a batch no step fed
            other = {name: rng.standard_normal((5, TOKENS, WIDTH)).astype(np.float32) for name in ("x:0", "y:0")}
            assert assert_tf_paths_match(session, hook, {graph.get_tensor_by_name(k): v for k, v in other.items()})
    return losses


@pytest.fixture(scope="module")
def plain() -> list[float]:
    """Plain TF's losses, the same for both bridges (seeded graph, same feeds): trained once for the module."""
    return train(None)


@pytest.mark.parametrize("bridge", ["native", "python"])
def test_a_keras_transformer_with_a_none_batch_installs_every_cluster(
    tmp_path: Path, bridge: str, plain: list[float]
) -> None:
    """The native bridge's TF path is the fallback function; the Python bridge's a clone of the TF ops in a cond:
    both hold the rebuilt shapes."""
    hook, url = hooked(tmp_path, f"attention-{bridge}", STITCHFLEET_SIGNATURE_STEPS="2", STITCHFLEET_BRIDGE=bridge)
    # The kernel cache is shared between test runs: begin guesses the batch (32), so the dispatch ops' TF paths,
    # which the warm-up and baseline steps run, compute the job's shapes for the batch fed (8), not begin's.
    signatures.SignatureBook(hook.settings.cache_dir, graph_identity.graph_key(transformer())).path.unlink(
        missing_ok=True
    )
    losses = train(hook)
    declined = [(e.reason, e.detail[:200]) for e in events(url, "compile_failure")]
    assert declined == [], declined
    assert [(e.reason, e.detail[:200]) for e in events(url, "revert")] == []
    assert len(hook.installed) >= 15, "the job's clusters (19 on TF 2.15) are stitched"
    if bridge == "native":
        assert all(c.kernel.bridged() > 0 for c, _ in hook.installed)
    # the guard's rule holds each cluster's outputs; the losses after 8 Adam steps stay plain TF's
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
