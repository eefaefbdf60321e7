"""A 300-step `MonitoredTrainingSession` job whose setup cannot pay back (run by test_skipped_job in a subprocess).

Input: STITCHFLEET_* from the environment (enabled), the job as the boot shim runs it. Output: printed lines:
why its hook skipped the setup, and the stitchfleet compiler and graph modules the process imported.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import stitchfleet.plugin.session.auto_attach  # noqa: F401  (what the boot shim does when enabled)

STEPS = 300  # hookoff's job (benchmarks/README.md): too short to repay a setup on the CPU backend

graph = tf.Graph()
with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
    w = tf.compat.v1.get_variable("w", [64, 64])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
    feeds = {x: np.ones((64, 64), np.float32)}
    stop = tf.compat.v1.train.StopAtStepHook(num_steps=STEPS)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[stop]) as session:
        runs = 0
        while not session.should_stop():
            session.run(train, feeds)
            runs += 1
    hooks = [h for h in session._hooks if type(h).__name__ == "StitchHook"]
print("runs:", runs)
print("hooks:", len(hooks))
print("skipped:", hooks[0].length.skipped if hooks else "")
loaded = sorted(name for name in sys.modules if name.startswith(("stitchfleet.compiler", "stitchfleet.plugin.graph")))
print("loaded:", " ".join(loaded))
