"""A user's training script that knows nothing of stitchfleet (run by test_boot in a subprocess).

Prints 'tf-loaded-before-session: <bool>', then the hooks of the session and the losses.
"""

from __future__ import annotations

import sys

import numpy as np

import stitchfleet.plugin.session.auto_attach  # noqa: F401  (what the boot shim does when enabled)

print("tf-imported-by-boot:", "tensorflow" in sys.modules)
import tensorflow as tf  # noqa: E402

graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
    w = tf.compat.v1.get_variable("w", [16, 16])
    h = tf.matmul(x, w)
    mean = tf.reduce_mean(h, axis=-1, keepdims=True)
    y = (h - mean) * tf.math.rsqrt(tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True) + 1e-5)
    loss = tf.reduce_mean(tf.square(tf.tanh(y)), name="loss")
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step()
    )
    feeds = {x: np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)}
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[]) as session:
        hooks = [type(h).__name__ for h in session._hooks]
        losses = [session.run([loss, train], feeds)[0] for _ in range(int(sys.argv[1]))]
print("hooks:", ",".join(hooks))
stitch = [h for h in session._hooks if type(h).__name__ == "StitchHook"]
print("calls:", sum(stitch[0].backend_calls.values()) if stitch else 0)
print("losses:", " ".join(f"{v:.6f}" for v in losses))
