"""Training graphs of four models, built with plain TF ops in graph mode (tf.compat.v1).

Input: a model name and a size ("full" for the committed workload graphs, "small" for
tests: the same code with tiny dimensions). Output: a `tf.Graph` holding the forward
pass, the loss, its gradients (tf.gradients) and an optimizer written with plain ops
(Adam or SGD with momentum, so its element-wise update math is in the graph, as in
frameworks that do not use fused optimizer kernels). Recurrent parts are unrolled a
few steps statically: a tf.while_loop would be control flow, which the frontend keeps
as a boundary. Models: a BERT-base encoder layer, a pre-LN Transformer decoder block
with a softmax cross-entropy head, a DIEN-style interest extractor (GRU) with target
attention and an attention-updated GRU, and a CRNN-style conv + batch-norm +
bidirectional-LSTM head. They live in the package, not beside the benchmarks, because
`stitchfleet demo` trains one: an installed stitchfleet runs its demo from any directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

v1 = tf.compat.v1
SIZES = ("full", "small")


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    build: Callable[[dict[str, int]], None]
    full: dict[str, int]
    small: dict[str, int]


def _var(name: str, shape: Sequence[int], init: Any = None) -> Any:
    return v1.get_variable(name, list(shape), initializer=init or v1.glorot_uniform_initializer())


def dense(x: Any, units: int, name: str) -> Any:
    kernel = _var(f"{name}/kernel", (int(x.shape[-1]), units))
    bias = _var(f"{name}/bias", (units,), v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, kernel), bias)


def layer_norm(x: Any, name: str, eps: float = 1e-12) -> Any:
    width = int(x.shape[-1])
    gamma = _var(f"{name}/gamma", (width,), v1.ones_initializer())
    beta = _var(f"{name}/beta", (width,), v1.zeros_initializer())
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + eps) * gamma + beta


def gelu_erf(x: Any) -> Any:
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: Any) -> Any:
    return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3.0))))


def _heads(x: Any, batch: int, seq: int, heads: int) -> Any:
    return tf.transpose(tf.reshape(x, [batch, seq, heads, -1]), [0, 2, 1, 3])


def attention(x2d: Any, mask_add: Any, d: dict[str, int], name: str, dropout: float) -> Any:
    """Multi-head self-attention on [batch*seq, hidden]; mask_add broadcasts to [batch, heads, seq, seq]."""
    batch, seq, hidden, heads = d["batch"], d["seq"], d["hidden"], d["heads"]
    q, k, v = (_heads(dense(x2d, hidden, f"{name}/{n}"), batch, seq, heads) for n in "qkv")
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(hidden // heads)) + mask_add
    probs = tf.nn.softmax(scores)
    if dropout:
        probs = tf.nn.dropout(probs, rate=dropout)
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [batch * seq, hidden])
    return dense(context, hidden, f"{name}/out")


def adam(loss: Any, lr: float = 1e-4, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6) -> Any:
    params = v1.trainable_variables()
    grads = tf.gradients(loss, params)
    step = v1.get_variable("adam/step", [], initializer=v1.zeros_initializer(), trainable=False)
    t = step + 1.0
    lr_t = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
    updates = [step.assign(t, read_value=False)]
    for param, grad in zip(params, grads, strict=True):
        base = param.op.name
        m = v1.get_variable(f"{base}/adam_m", param.shape, initializer=v1.zeros_initializer(), trainable=False)
        v = v1.get_variable(f"{base}/adam_v", param.shape, initializer=v1.zeros_initializer(), trainable=False)
        m_new = b1 * m + (1.0 - b1) * grad
        v_new = b2 * v + (1.0 - b2) * tf.square(grad)
        updates += [m.assign(m_new, read_value=False), v.assign(v_new, read_value=False)]
        updates.append(param.assign_sub(lr_t * m_new / (tf.sqrt(v_new) + eps), read_value=False))
    return tf.group(*updates, name="train_op")


def momentum(loss: Any, lr: float = 0.01, mu: float = 0.9) -> Any:
    params = v1.trainable_variables()
    updates = []
    for param, grad in zip(params, tf.gradients(loss, params), strict=True):
        acc = v1.get_variable(f"{param.op.name}/momentum", param.shape, initializer=v1.zeros_initializer())
        acc_new = mu * acc + grad
        updates += [acc.assign(acc_new, read_value=False), param.assign_sub(lr * acc_new, read_value=False)]
    return tf.group(*updates, name="train_op")


def bert_encoder(d: dict[str, int]) -> None:
    batch, seq, hidden = d["batch"], d["seq"], d["hidden"]
    x = v1.placeholder(tf.float32, [batch, seq, hidden], name="input")
    mask = v1.placeholder(tf.float32, [batch, seq], name="attention_mask")
    target = v1.placeholder(tf.float32, [batch, seq, hidden], name="target")
    mask_add = tf.reshape((1.0 - mask) * -10000.0, [batch, 1, 1, seq])
    x2d = tf.reshape(x, [batch * seq, hidden])
    attended = tf.nn.dropout(attention(x2d, mask_add, d, "attention", 0.1), rate=0.1)
    h = layer_norm(attended + x2d, "attention/ln")
    ffn = dense(gelu_erf(dense(h, 4 * hidden, "ffn/in")), hidden, "ffn/out")
    out = layer_norm(tf.nn.dropout(ffn, rate=0.1) + h, "ffn/ln")
    loss = tf.reduce_mean(tf.square(tf.reshape(out, [batch, seq, hidden]) - target), name="loss")
    adam(loss)


def transformer_block(d: dict[str, int]) -> None:
    batch, seq, hidden, vocab = d["batch"], d["seq"], d["hidden"], d["vocab"]
    x = v1.placeholder(tf.float32, [batch * seq, hidden], name="input")
    labels = v1.placeholder(tf.float32, [batch * seq, vocab], name="labels")
    causal = np.triu(np.full((seq, seq), -1e9, np.float32), k=1)
    h = x + attention(layer_norm(x, "ln1", 1e-5), tf.constant(causal), d, "attention", 0.0)
    mlp = dense(gelu_tanh(dense(layer_norm(h, "ln2", 1e-5), 4 * hidden, "mlp/in")), hidden, "mlp/out")
    logits = dense(layer_norm(h + mlp, "ln_f", 1e-5), vocab, "head")
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits), name="loss")
    adam(loss)


def _gru(x: Any, h: Any, name: str, attn: Any = None) -> Any:
    """One GRU step; with `attn` ([batch, 1]) the update gate is scaled by it (DIEN's AUGRU)."""
    units = int(h.shape[-1])
    gates = tf.sigmoid(dense(tf.concat([x, h], axis=1), 2 * units, f"{name}/gates"))
    reset, update = tf.split(gates, 2, axis=1)
    candidate = tf.tanh(dense(tf.concat([x, reset * h], axis=1), units, f"{name}/candidate"))
    if attn is not None:
        update = attn * update
    return (1.0 - update) * h + update * candidate


def dien_attention_gru(d: dict[str, int]) -> None:
    batch, steps, emb = d["batch"], d["steps"], d["emb"]
    behaviour = v1.placeholder(tf.float32, [batch, steps, emb], name="behaviour")
    item = v1.placeholder(tf.float32, [batch, emb], name="target_item")
    clicked = v1.placeholder(tf.float32, [batch, 1], name="clicked")
    with v1.variable_scope("interest", reuse=v1.AUTO_REUSE):
        h, states = tf.zeros([batch, emb]), []
        for x in tf.unstack(behaviour, axis=1):
            h = _gru(x, h, "gru")
            states.append(h)
    with v1.variable_scope("attention", reuse=v1.AUTO_REUSE):
        feats = [tf.concat([s, item, s * item, s - item], axis=1) for s in states]
        scores = [dense(tf.sigmoid(dense(f, d["att"], "fc1")), 1, "fc2") for f in feats]
        weights = tf.unstack(tf.nn.softmax(tf.concat(scores, axis=1)), axis=1)
    with v1.variable_scope("evolution", reuse=v1.AUTO_REUSE):
        h = tf.zeros([batch, emb])
        for s, a in zip(states, weights, strict=True):
            h = _gru(s, h, "augru", tf.expand_dims(a, 1))
    mlp = tf.nn.relu(dense(tf.concat([h, item, h * item], axis=1), d["mlp"], "mlp/fc1"))
    logit = dense(mlp, 1, "mlp/fc2")
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logit), name="loss")
    momentum(loss)


def _conv_bn_relu(x: Any, channels: int, name: str) -> Any:
    kernel = _var(f"{name}/kernel", (3, 3, int(x.shape[-1]), channels))
    y = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
    mean, var = tf.nn.moments(y, axes=[0, 1, 2])
    gamma = _var(f"{name}/gamma", (channels,), v1.ones_initializer())
    beta = _var(f"{name}/beta", (channels,), v1.zeros_initializer())
    return tf.nn.relu(tf.nn.batch_normalization(y, mean, var, beta, gamma, 1e-3))


def _lstm(x: Any, h: Any, c: Any, name: str) -> tuple[Any, Any]:
    units = int(h.shape[-1])
    gates = dense(tf.concat([x, h], axis=1), 4 * units, name)
    i, f, g, o = tf.split(gates, 4, axis=1)
    c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(g)
    return tf.sigmoid(o) * tf.tanh(c), c


def crnn_head(d: dict[str, int]) -> None:
    batch, height, width, units, classes = d["batch"], d["height"], d["width"], d["units"], d["classes"]
    image = v1.placeholder(tf.float32, [batch, height, width, 1], name="image")
    labels = v1.placeholder(tf.float32, [batch, width // 4, classes], name="labels")
    y = tf.nn.max_pool2d(_conv_bn_relu(image, d["channels"], "conv1"), 2, 2, "VALID")
    y = tf.nn.max_pool2d(_conv_bn_relu(y, 2 * d["channels"], "conv2"), 2, 2, "VALID")
    steps = tf.unstack(tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [batch, width // 4, -1]), axis=1)
    outputs: dict[str, list[Any]] = {}
    for direction, seq in (("fw", steps), ("bw", steps[::-1])):
        with v1.variable_scope(f"lstm_{direction}", reuse=v1.AUTO_REUSE):
            h = c = tf.zeros([batch, units])
            outputs[direction] = []
            for x in seq:
                h, c = _lstm(x, h, c, "cell")
                outputs[direction].append(h)
    both = [tf.concat([f, b], axis=1) for f, b in zip(outputs["fw"], outputs["bw"][::-1], strict=True)]
    logits = tf.reshape(dense(tf.concat(both, axis=0), classes, "classifier"), [width // 4, batch, classes])
    xent = tf.nn.softmax_cross_entropy_with_logits(labels=tf.transpose(labels, [1, 0, 2]), logits=logits)
    momentum(tf.reduce_mean(xent, name="loss"))


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model(
            "bert_encoder",
            "BERT-base encoder layer (post-LN, erf GELU, dropout 0.1), MSE loss, Adam",
            bert_encoder,
            {"batch": 8, "seq": 128, "hidden": 768, "heads": 12},
            {"batch": 2, "seq": 8, "hidden": 32, "heads": 4},
        ),
        Model(
            "transformer_block",
            "pre-LN Transformer decoder block (causal mask, tanh GELU), softmax cross-entropy head, Adam",
            transformer_block,
            {"batch": 8, "seq": 128, "hidden": 512, "heads": 8, "vocab": 1024},
            {"batch": 2, "seq": 8, "hidden": 32, "heads": 4, "vocab": 16},
        ),
        Model(
            "dien_attention_gru",
            "DIEN-style GRU interest extractor, target attention, AUGRU, MLP, sigmoid cross-entropy, momentum",
            dien_attention_gru,
            {"batch": 128, "steps": 10, "emb": 36, "att": 80, "mlp": 200},
            {"batch": 4, "steps": 3, "emb": 8, "att": 6, "mlp": 10},
        ),
        Model(
            "crnn_head",
            "CRNN-style conv + batch-norm + max-pool, bidirectional LSTM, per-step softmax cross-entropy, momentum",
            crnn_head,
            {"batch": 8, "height": 32, "width": 48, "channels": 32, "units": 64, "classes": 37},
            {"batch": 2, "height": 8, "width": 16, "channels": 4, "units": 8, "classes": 5},
        ),
    )
}


TRAINING_STEP = ("train_op", "loss")


def training_step(graph: Any) -> Any:
    """The GraphDef of what one training step runs (loss, gradients, updates): initialisers left out."""
    return v1.graph_util.extract_sub_graph(graph.as_graph_def(), list(TRAINING_STEP))


def build(name: str, size: str = "full", seed: int = 0) -> Any:
    """A fresh `tf.Graph` holding the training graph of model `name` at `size`."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (known: {', '.join(SIZES)})")
    model = MODELS[name]
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        model.build(model.full if size == "full" else model.small)
    return graph
