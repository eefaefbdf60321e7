"""A hand-written `tf.compat.v1.Session` training loop that knows nothing of stitchfleet (word2vec's style).

Run by test_plain_session in a subprocess: `plain_session_job.py STEPS [finalize|supervisor]` (`supervisor`:
the session from `tf.train.Supervisor`, which finalizes the graph first, as the PTB tutorial trains). Prints the
losses, whether a StitchHook ran the session's steps and how many stitched kernel calls it made.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import stitchfleet.plugin.session.auto_attach  # noqa: F401  (what the boot shim does when enabled)

graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
    w = tf.compat.v1.get_variable("w", [16, 16], use_resource=False)
    h = tf.matmul(x, w)
    mean = tf.reduce_mean(h, axis=-1, keepdims=True)
    y = (h - mean) * tf.math.rsqrt(tf.reduce_mean(tf.square(h - mean), axis=-1, keepdims=True) + 1e-5)
    loss = tf.reduce_mean(tf.square(tf.tanh(tf.nn.dropout(y, rate=0.2, seed=3))), name="loss")
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    init = tf.compat.v1.global_variables_initializer()
    feeds = {x: np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)}
    if sys.argv[2:] == ["finalize"]:
        graph.finalize()
    if sys.argv[2:] == ["supervisor"]:
        supervisor = tf.compat.v1.train.Supervisor(graph=graph, logdir=None, init_op=init, summary_op=None)
        session = supervisor.prepare_or_wait_for_session()  # what managed_session() yields
    else:
        session = tf.compat.v1.Session(graph=graph)
        session.run(init)
    losses = []
    for step in range(int(sys.argv[1])):
        value, _ = session.run([loss, train], feeds)
        losses.append(value)
        if step % 5 == 0:
            session.run(loss, feeds)  # an eval run: not a training step
    runner = getattr(session, "_stitchfleet_plain", None)
    session.close()
began = type(runner).__name__ == "PlainRunner"  # its hook began (else: `Waiting` for its setup, or a reason)
hook = getattr(runner, "hook", None) if began else None
print("attached:", began)
print("waiting:", type(runner).__name__ == "Waiting")
print("reason:", runner if isinstance(runner, str) else "")
print("calls:", sum(hook.backend_calls.values()) if hook is not None else 0)
print("steps:", hook.step if hook is not None else 0)
print("losses:", " ".join(f"{v:.6f}" for v in losses))
# What the plugin made this process import: a job that waits for its setup must stay light (`Waiting`).
HEAVY = ("stitchfleet.plugin.session.hook", "stitchfleet.compiler.pipeline", "stitchfleet.telemetry.recorder")
print("imported:", " ".join(name for name in HEAVY if name in sys.modules))
