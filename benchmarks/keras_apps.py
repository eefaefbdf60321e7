"""Keras training graphs for the coverage figure: Keras applications and Keras-layers transformers (text, ViT).

Input: a model name (`KERAS_MODELS`). Output: the GraphDef of one training step (forward,
backward, Adam update) built in TF1 graph mode with `weights=None`, at the smallest input
each application allows, batch 2, and Keras' learning phase set to training (a constant,
so the batch-norm conds resolve). Used by scripts/build_workloads.py --keras and the slow
workload tests; the graphs are regenerated, not stored (several MB of JSON each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

v1 = tf.compat.v1
BATCH, CLASSES = 2, 10
# the smallest input side each application accepts with weights=None
APPLICATIONS = {
    "ResNet50": 32,
    "DenseNet121": 32,
    "Xception": 71,
    "NASNetMobile": 32,
    "MobileNetV2": 32,
    "EfficientNetB0": 32,
    "ConvNeXtTiny": 32,
}
TRAIN_OP = "train"


def _application(name: str) -> Callable[[], Any]:
    def build() -> Any:
        side = APPLICATIONS[name]
        x = v1.placeholder(tf.float32, [BATCH, side, side, 3], name="images")
        model = getattr(tf.keras.applications, name)(weights=None, input_tensor=x, classes=CLASSES)
        return model.output

    return build


def _transformer() -> Any:
    """Two encoder blocks: MultiHeadAttention, LayerNormalization, Dense with GELU, softmax head."""
    tokens, width, heads = 16, 64, 4
    x = v1.placeholder(tf.float32, [BATCH, tokens, width], name="tokens")
    h = x
    for _ in range(2):
        attended = tf.keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
        h = tf.keras.layers.LayerNormalization()(h + attended)
        hidden = tf.keras.layers.Dense(width * 4, activation="gelu")(h)
        h = tf.keras.layers.LayerNormalization()(h + tf.keras.layers.Dense(width)(hidden))
    pooled = tf.reduce_mean(h, axis=1)
    return tf.keras.layers.Dense(CLASSES, activation="softmax")(pooled)


def _vision_transformer() -> Any:
    """ViT-style: 4x4 patches of a 32x32 image embedded by a strided convolution, a learned position
    embedding, two pre-norm encoder blocks (MultiHeadAttention, Dense with GELU), mean-pooled head."""
    side, patch, width, heads = 32, 4, 64, 4
    tokens = (side // patch) ** 2
    x = v1.placeholder(tf.float32, [BATCH, side, side, 3], name="images")
    h = tf.keras.layers.Conv2D(width, patch, strides=patch)(x)
    h = tf.keras.layers.Reshape((tokens, width))(h)
    h = h + tf.keras.layers.Embedding(tokens, width)(tf.range(tokens))
    for _ in range(2):
        n = tf.keras.layers.LayerNormalization(epsilon=1e-6)(h)
        h = h + tf.keras.layers.MultiHeadAttention(heads, width // heads)(n, n)
        n = tf.keras.layers.LayerNormalization(epsilon=1e-6)(h)
        h = h + tf.keras.layers.Dense(width)(tf.keras.layers.Dense(width * 2, activation="gelu")(n))
    pooled = tf.reduce_mean(tf.keras.layers.LayerNormalization(epsilon=1e-6)(h), axis=1)
    return tf.keras.layers.Dense(CLASSES, activation="softmax")(pooled)


KERAS_MODELS: dict[str, Callable[[], Any]] = {
    **{name: _application(name) for name in APPLICATIONS},
    "KerasTransformer": _transformer,
    "VisionTransformer": _vision_transformer,
}


def training_graph(name: str, *, as_job: bool = False) -> tuple[Any, Any, Any]:
    """(graph, loss, train op) of one Adam training step of model `name`. `as_job`: as a user's script
    builds it to run (Keras' seed too, a global step, the batch-norm moving averages in UPDATE_OPS
    before the update, the loss named `loss`), as scripts/keras_jobs.py trains it."""
    if name not in KERAS_MODELS:
        raise ValueError(f"unknown Keras model {name!r} (known: {', '.join(KERAS_MODELS)})")
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        if as_job:
            tf.keras.utils.set_random_seed(0)
        tf.keras.backend.set_learning_phase(1)
        probabilities = KERAS_MODELS[name]()
        labels = v1.placeholder(tf.int32, [BATCH], name="labels")
        loss = tf.reduce_mean(
            tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities), name="loss" if as_job else None
        )
        if not as_job:
            return graph, loss, v1.train.AdamOptimizer(1e-3).minimize(loss, name=TRAIN_OP)
        step = v1.train.get_or_create_global_step()
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)
    return graph, loss, train


def training_graph_def(name: str) -> Any:
    """The GraphDef of one Adam training step of model `name` (initialisers left out)."""
    graph, _, _ = training_graph(name)
    return v1.graph_util.extract_sub_graph(graph.as_graph_def(), [TRAIN_OP])
