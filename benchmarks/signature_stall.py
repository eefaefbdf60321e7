"""How long a `None`-batch job's training steps wait for the kernels of the batch it feeds.

Input: argv[1] a fresh kernel cache directory, argv[2] a state directory (both made empty by the caller: the
clusters' C is compiled cold), argv[3] the batch size fed, argv[4] the training steps. Output: one line per
figure on stdout: the process's setup (`begin`) seconds, the first steps' seconds, the longest step, the
step after which the fed batch's kernels were bound (when the hook says), the median of the last 200 steps.

Why: the clusters of a graph with `None` dimensions are built at `begin` for a guessed batch; the
kernels for the batch the job really feeds are compiled once its steps show it. That compile used to
run inside the first training step (`rebinding`); `signature_kernels` runs it in a background thread
while TF's ops serve the steps. Run it from the repository root:

    PYTHONPATH=. python benchmarks/signature_stall.py "$(mktemp -d)" "$(mktemp -d)" 48 3000
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from stitchfleet import settings
from stitchfleet.plugin.session.hook import StitchHook


def graph() -> tf.Graph:
    """The MLP of tests/plugin/test_signatures.py: a matmul, Keras layer norm, GELU, a normalisation, Adam."""
    built = tf.Graph()
    with built.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.matmul(x, tf.compat.v1.get_variable("w", [16, 32]))))
        mean, var = tf.nn.moments(h, [1], keepdims=True)
        logits = tf.matmul((h - mean) * tf.math.rsqrt(var + 1e-5), tf.compat.v1.get_variable("v", [32, 4]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="train")
    return built


def main(cache: Path, state: Path, batch: int, steps: int) -> None:
    env = {
        "STITCHFLEET_CACHE_DIR": str(cache),
        "STITCHFLEET_STATE_DIR": str(state),
        "STITCHFLEET_WARMUP_STEPS": "2",
        "STITCHFLEET_BASELINE_STEPS": "3",
        "STITCHFLEET_PROBE_STEPS": "0",
    }
    hook = StitchHook(settings.load(env), backend="cpu")
    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal((batch, 16)).astype(np.float32), rng.integers(0, 4, batch).astype(np.int64)
    with graph().as_default() as g:
        loss, train = g.get_tensor_by_name("loss:0"), g.get_operation_by_name("train")
        started = time.perf_counter()
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            print(f"setup: {time.perf_counter() - started:.2f}")
            seconds, bound = [], None
            for step in range(steps):
                began = time.perf_counter()
                session.run([loss, train], {"x:0": xs, "y:0": ys})
                seconds.append(time.perf_counter() - began)
                kernels = getattr(hook, "signatures", None)  # None before signature_kernels
                if bound is None and kernels is not None and f"x={batch}x16,y={batch}" in kernels.bound():
                    bound = step
    print("first steps: " + " ".join(f"{s:.3f}" for s in seconds[:5]))
    print(f"longest step: {max(seconds):.3f}")
    print(f"bound after step: {bound}")
    print(f"median of the last 200 steps: {float(np.median(seconds[-200:])) * 1e3:.2f} ms")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
