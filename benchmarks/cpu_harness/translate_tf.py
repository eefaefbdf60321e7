"""A cluster graph as a TensorFlow function: what a training step without stitching runs, op by op.

Input: an IR `Graph` (a memory-intensive cluster) and the `tensorflow` module. Output: a
`tf.function` (graph mode, no XLA) of the graph's parameters in `graph.parameters` order,
returning its outputs, and the TF tensors for given host inputs. TensorFlow is passed in,
never imported here, so the harness loads it only when a run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import DType, Graph, Node, Op

TF_DTYPES = {
    DType.F16: "float16",
    DType.BF16: "bfloat16",
    DType.F32: "float32",
    DType.F64: "float64",
    DType.I32: "int32",
    DType.I64: "int64",
    DType.BOOL: "bool",
}
UNARY = {
    Op.NEG: "negative",
    Op.ABS: "abs",
    Op.SQUARE: "square",
    Op.RELU: "nn.relu",
    Op.LOGICAL_NOT: "logical_not",
    Op.SIGN: "sign",
    Op.FLOOR: "floor",
    Op.CEIL: "math.ceil",
    Op.EXP: "exp",
    Op.LOG: "math.log",
    Op.LOG1P: "math.log1p",
    Op.TANH: "tanh",
    Op.SIGMOID: "sigmoid",
    Op.ERF: "math.erf",
    Op.RSQRT: "math.rsqrt",
    Op.SQRT: "sqrt",
    Op.RECIPROCAL: "math.reciprocal",
}
BINARY = {
    Op.ADD: "add",
    Op.SUB: "subtract",
    Op.MUL: "multiply",
    Op.DIV: "math.truediv",
    Op.POW: "pow",
    Op.MAXIMUM: "maximum",
    Op.MINIMUM: "minimum",
    Op.GREATER: "greater",
    Op.GREATER_EQUAL: "greater_equal",
    Op.LESS: "less",
    Op.LESS_EQUAL: "less_equal",
    Op.EQUAL: "equal",
    Op.NOT_EQUAL: "not_equal",
    Op.LOGICAL_AND: "logical_and",
    Op.LOGICAL_OR: "logical_or",
}
REDUCE = {
    Op.REDUCE_SUM: "reduce_sum",
    Op.REDUCE_MAX: "reduce_max",
    Op.REDUCE_MIN: "reduce_min",
    Op.REDUCE_MEAN: "reduce_mean",
    Op.REDUCE_PROD: "reduce_prod",
}


def _attr(tf: Any, dotted: str) -> Any:
    """`tf.math.log` from "math.log"."""
    target = tf
    for part in dotted.split("."):
        target = getattr(target, part)
    return target


def tf_dtype(tf: Any, dtype: DType) -> Any:
    return getattr(tf, TF_DTYPES[dtype])


def _broadcast(tf: Any, node: Node, operand: Any) -> Any:
    expanded = [1] * len(node.shape)
    for i, d in enumerate(node.attrs.get_ints("dims")):
        expanded[d] = operand.shape[i]
    return tf.broadcast_to(tf.reshape(operand, expanded), node.shape)


def _structural(tf: Any, node: Node, args: list[Any]) -> Any:
    """The ops that move, select or create data rather than compute element values."""
    a = node.attrs
    build: dict[Op, Callable[[], Any]] = {
        Op.BROADCAST: lambda: _broadcast(tf, node, args[0]),
        Op.CAST: lambda: tf.cast(args[0], tf_dtype(tf, node.dtype)),
        Op.SELECT: lambda: tf.where(args[0], args[1], args[2]),
        Op.RESHAPE: lambda: tf.reshape(args[0], node.shape),
        Op.TRANSPOSE: lambda: tf.transpose(args[0], a.get_ints("perm")),
        Op.SLICE: lambda: tf.strided_slice(args[0], a.get_ints("begin"), a.get_ints("end"), a.get_ints("strides")),
        Op.CONCAT: lambda: tf.concat(args, a.get_int("axis")),
        Op.CONSTANT: lambda: tf.constant(
            np.asarray(a["value"], dtype=np.float64).reshape(node.shape), tf_dtype(tf, node.dtype)
        ),
    }
    if node.op not in build:
        raise ValueError(f"node {node.id}: op {node.op.value} has no TensorFlow translation")
    return build[node.op]()


def tf_op(tf: Any, node: Node, args: list[Any]) -> Any:
    """One IR node as TF ops on its operands' TF values."""
    if node.op in UNARY:
        return _attr(tf, UNARY[node.op])(args[0])
    if node.op in BINARY:
        return _attr(tf, BINARY[node.op])(args[0], args[1])
    if node.op in REDUCE:
        return _attr(tf, REDUCE[node.op])(args[0], axis=list(node.attrs.get_ints("axes")))
    return _structural(tf, node, args)


def tf_function(tf: Any, graph: Graph) -> Callable[..., Any]:
    """The cluster as a tf.function of its parameters (in graph.parameters order)."""

    def body(*params: Any) -> list[Any]:
        values: list[Any] = []
        given = iter(params)
        for node in graph.nodes:
            values.append(next(given) if node.op is Op.PARAMETER else tf_op(tf, node, [values[i] for i in node.inputs]))
        return [values[n] for _, n in graph.outputs]

    return tf.function(body)  # type: ignore[no-any-return]


def tf_inputs(tf: Any, graph: Graph, inputs: Mapping[str, npt.NDArray[Any]]) -> list[Any]:
    """Host inputs as TF constants, in the order `tf_function` takes them."""
    return [tf.constant(inputs[str(p.attrs["name"])], tf_dtype(tf, p.dtype)) for p in graph.parameters]
