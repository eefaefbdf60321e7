"""A `MonitoredTrainingSession` job whose hook skips its setup (run by test_skipped_job in a subprocess).

Input: STITCHFLEET_* from the environment (enabled), the job as the boot shim runs it; argv[1] the job's steps
(300 by default: too short to repay a setup; the test's longer job skips on the fleet's slower verdict instead).
Output: printed lines: why its hook skipped the setup, and the stitchfleet compiler and graph modules imported.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

STEPS = 300  # hookoff's job (benchmarks/README.md): too short to repay a setup on the CPU backend


def job_graph() -> tf.Graph:
    """The job's graph (the test computes its key in the fleet's memory from it)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 64], name="x")
        w = tf.compat.v1.get_variable("w", [64, 64])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step, name="train")
    return graph


def main(steps: int) -> None:
    import stitchfleet.plugin.session.auto_attach  # noqa: F401  (what the boot shim does when enabled)

    graph = job_graph()
    with graph.as_default():
        feeds = {graph.get_tensor_by_name("x:0"): np.ones((64, 64), np.float32)}
        train = graph.get_operation_by_name("train")
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=steps)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[stop]) as session:
            runs = 0
            while not session.should_stop():
                session.run(train, feeds)
                runs += 1
        hooks = [h for h in session._hooks if type(h).__name__ == "StitchHook"]
    print("runs:", runs)
    print("hooks:", len(hooks))
    print("skipped:", hooks[0].length.skipped if hooks else "")
    print("key:", hooks[0].job_key if hooks else "")
    prefixes = ("stitchfleet.compiler", "stitchfleet.plugin.graph", "stitchfleet.plugin.control")
    print("loaded:", " ".join(sorted(name for name in sys.modules if name.startswith(prefixes))))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else STEPS)
