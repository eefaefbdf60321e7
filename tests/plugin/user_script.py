"""An ordinary TF1 training script, written as users write them, knowing nothing of stitchfleet.

Run by test_user_script in a subprocess, started the way an opted-in pod starts it (the shim on
PYTHONPATH, STITCHFLEET_ENABLED=1): `None` batch dimensions, Keras Dense + LayerNormalization
blocks, GELU, sparse softmax cross-entropy, Adam, MonitoredTrainingSession, the global step read
every step, an eval with other feeds every 10 steps, and a summary-style side fetch. Prints
'trained: N', 'evals: N', 'final-step: N' and the losses.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
tf.keras.utils.set_random_seed(0)  # Keras initializers draw from their own seeds
steps = int(sys.argv[1])
rng = np.random.default_rng(0)
train_x = rng.standard_normal((32, 64)).astype(np.float32)
train_y = rng.integers(0, 10, 32).astype(np.int64)
eval_x = rng.standard_normal((8, 64)).astype(np.float32)
eval_y = rng.integers(0, 10, 8).astype(np.int64)

graph = tf.Graph()
with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    h = x
    for width in (128, 64):
        h = tf.keras.layers.Dense(width)(h)
        h = tf.keras.layers.LayerNormalization()(h)
        h = tf.nn.gelu(h)
    logits = tf.keras.layers.Dense(10)(h)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1), y), tf.float32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
    losses, evals = [], 0
    with tf.compat.v1.train.MonitoredTrainingSession() as session:
        for step in range(steps):
            value, _ = session.run([loss, train_op], {x: train_x, y: train_y})
            losses.append(value)
            session.run(global_step)  # logging, as scripts do every step
            if step % 10 == 0:
                session.run([accuracy, loss], {x: eval_x, y: eval_y})  # an eval with other feeds
                evals += 1
        final = session.run(global_step)
print("trained:", steps)
print("evals:", evals)
print("final-step:", final)
print("losses:", " ".join(f"{v:.6f}" for v in losses))
