"""Fused batch norm in float64 for the translation check: TF's formulas, written with ops that have float64
kernels, giving what the CPU kernel TF runs here returns (oneDNN's or Eigen's: `kernel_library`).

Input: a promoted GraphDef. Output: the same graph with each fused batch norm as float64 ops; `scratch`
names the outputs TF leaves uninitialised (not comparable). The rules in full: docs/plugin/guard.md.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from stitchfleet.plugin.frontend import kernel_library

if TYPE_CHECKING:
    import tensorflow as tf

FORWARD = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
GRADIENT = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
# Where the channel sits, by data format: vectors broadcast along it.
CHANNEL_SHAPES = {"NHWC": None, "NDHWC": None, "NCHW": [1, -1, 1, 1], "NCDHW": [1, -1, 1, 1, 1]}
PREFIX = "stitchfleet_f64"


def scratch(op: str, training: bool) -> frozenset[int]:
    """The outputs of a fused batch norm `op` whose values TF's kernel here never writes (uninitialised memory
    of the right shape): nothing but the gradient op reads them, and it ignores them in that form. TF's Eigen
    CPU kernel leaves the inference form's reserve spaces 1 and 2 and V3's reserve space 3 (a scalar) so;
    oneDNN's copies the given statistics and returns an empty reserve space 3. The formulas give the values
    of oneDNN (and of the IR) there, which no comparison may rely on."""
    if op not in FORWARD or kernel_library.onednn():
        return frozenset()
    third = {5} if op == "FusedBatchNormV3" else set()
    return frozenset(third if training else {3, 4} | third)


def decomposable(node: tf.compat.v1.NodeDef) -> bool:
    """Whether `node` is a fused batch norm (forward or gradient) in a data format this module writes."""
    if node.op not in FORWARD | GRADIENT:
        return False
    data_format = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    return data_format in CHANNEL_SHAPES


def widened(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
    """A copy of the promoted `graph_def` with every decomposable fused batch norm computed in float64 ops."""
    import tensorflow as tf

    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if decomposable(node):
            out.node.extend(_replacement(node))
        else:
            out.node.add().CopyFrom(node)
    return out


def _replacement(node: Any) -> list[Any]:
    """The float64 nodes standing for `node`: its formulas under `node.name/stitchfleet_f64/`, fed by the
    node's own inputs, and an IdentityN named `node.name` holding its outputs in order."""
    import tensorflow as tf

    data = [name for name in node.input if not name.startswith("^")]
    attrs = tuple(sorted((key, value.SerializeToString()) for key, value in node.attr.items()))
    scratch = tf.compat.v1.GraphDef.FromString(_template(node.op, attrs, len(data)))
    fed = {f"input{k}": name for k, name in enumerate(data)}
    nodes = []
    for made in scratch.node:
        if made.name in fed:
            continue
        copy = type(node)()
        copy.CopyFrom(made)
        copy.name = node.name if made.name == "outputs" else f"{node.name}/{PREFIX}/{made.name}"
        copy.ClearField("device")
        del copy.input[:]
        copy.input.extend(_renamed(name, node.name, fed) for name in made.input)
        if made.name == "outputs":  # the node's own control inputs still order what stands for it
            copy.input.extend(name for name in node.input if name.startswith("^"))
        nodes.append(copy)
    return nodes


@functools.lru_cache(maxsize=64)
def _template(op: str, attrs: tuple[tuple[str, bytes], ...], inputs: int) -> bytes:
    """The formulas of one kind of node (op, attributes, input count) as a serialized GraphDef over
    placeholders `input0`...: a network's batch norms share a few kinds, and building the ops in Python
    costs ~30 ms each (ResNet50's 159 nodes took 4.5 s before they were shared)."""
    import tensorflow as tf

    node = tf.compat.v1.NodeDef(name="template", op=op)
    for key, value in attrs:
        node.attr[key].ParseFromString(value)
    scratch = tf.Graph()
    with scratch.as_default():
        placeholders = [tf.compat.v1.placeholder(tf.float64, name=f"input{k}") for k in range(inputs)]
        outputs = _gradient(node, placeholders) if op in GRADIENT else _forward(node, placeholders)
        tf.raw_ops.IdentityN(input=outputs, name="outputs")
    return bytes(scratch.as_graph_def().SerializeToString())


def _renamed(reference: str, owner: str, fed: dict[str, str]) -> str:
    """An input reference of a scratch node, in the owner's graph: a placeholder becomes the owner's input."""
    control, name = reference.startswith("^"), reference.lstrip("^")
    base, colon, index = name.partition(":")
    if base in fed:
        return fed[base] if not colon or index == "0" else f"{fed[base]}:{index}"
    return f"{'^' if control else ''}{owner}/{PREFIX}/{base}{colon}{index}"


def _attrs(node: Any) -> tuple[float, str, bool]:
    epsilon = node.attr["epsilon"].f if "epsilon" in node.attr else 1e-4
    data_format = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    training = node.attr["is_training"].b if "is_training" in node.attr else True
    return float(epsilon), data_format, training


def _axes(data_format: str) -> list[int]:
    """The reduced axes: every axis but the channel's."""
    channel = data_format.index("C")
    return [axis for axis in range(len(data_format)) if axis != channel]


def _per_channel(vector: Any, data_format: str) -> Any:
    """A channel vector shaped to broadcast against the data (it already does when the channel is last)."""
    import tensorflow as tf

    shape = CHANNEL_SHAPES[data_format]
    return vector if shape is None else tf.reshape(vector, shape)


def _count(x: Any, statistic: Any) -> Any:
    """Values per channel, n, as float64 (the data's size over the channel count)."""
    import tensorflow as tf

    return tf.cast(tf.size(x), tf.float64) / tf.cast(tf.size(statistic), tf.float64)


def _forward(node: Any, inputs: list[Any]) -> list[Any]:
    import tensorflow as tf

    x, scale, offset, given_mean, given_variance = inputs[:5]
    epsilon, data_format, training = _attrs(node)
    if training:
        axes = _axes(data_format)
        mean = tf.reduce_mean(x, axes)
        centred = x - _per_channel(mean, data_format)
        variance = tf.reduce_mean(tf.square(centred), axes)  # biased: the normalisation's and reserve space 2's
        n = _count(x, mean)
        corrected = variance * tf.where(n > 1.0, n / tf.maximum(n - 1.0, 1.0), tf.ones_like(n))
        factor = node.attr["exponential_avg_factor"].f if "exponential_avg_factor" in node.attr else 1.0
        if factor == 1.0:
            batch_mean, batch_variance = mean, corrected
        else:  # the running statistics blended in, as the V3 kernel does for Keras' momentum
            batch_mean = (1.0 - factor) * given_mean + factor * mean
            batch_variance = (1.0 - factor) * given_variance + factor * corrected
    else:
        mean, variance = given_mean, given_variance
        centred = x - _per_channel(mean, data_format)
        batch_mean, batch_variance = given_mean, given_variance
    inverse = tf.math.rsqrt(variance + epsilon)
    y = centred * _per_channel(inverse * scale, data_format) + _per_channel(offset, data_format)
    outputs = [y, batch_mean, batch_variance, mean, variance]  # 3, 4 in inference: `scratch` under Eigen
    if node.op == "FusedBatchNormV3":  # reserve space 3: oneDNN's is empty, Eigen's an unwritten scalar
        outputs.append(tf.zeros([0] if kernel_library.onednn() else [], tf.float64))
    return outputs


def _gradient(node: Any, inputs: list[Any]) -> list[Any]:
    import tensorflow as tf

    dy, x, scale, mean, variance = inputs[:5]  # reserve spaces 1 and 2: the batch's mean and biased variance
    epsilon, data_format, training = _attrs(node)
    axes = _axes(data_format)
    inverse = tf.math.rsqrt(variance + epsilon)
    normalised = (x - _per_channel(mean, data_format)) * _per_channel(inverse, data_format)
    dy_sum = tf.reduce_sum(dy, axes)
    dy_normalised_sum = tf.reduce_sum(dy * normalised, axes)
    if training:
        n = _count(x, mean)
        inner = (
            dy - _per_channel(dy_sum / n, data_format) - normalised * _per_channel(dy_normalised_sum / n, data_format)
        )
        dx = _per_channel(scale * inverse, data_format) * inner
    else:
        dx = dy * _per_channel(scale * inverse, data_format)
    # the two placeholder outputs: a scalar 0 from oneDNN's kernel, an empty [0] from Eigen's
    placeholder = [] if kernel_library.onednn() else [0]
    return [dx, dy_normalised_sum, dy_sum, tf.zeros(placeholder, tf.float64), tf.zeros(placeholder, tf.float64)]
