"""IR graph -> a jax.numpy function, so XLA (`jax.jit`) compiles the same subgraph we stitch.

Input: a `Graph` with no OPAQUE op, and a precision: "native" keeps every value in its
IR dtype (what a framework runs), "float64" computes floats in float64 (needs
`jax_enable_x64`; tests use it to compare with `evaluate`). Output: a function from a
dict parameter name -> array to a dict output name -> array. Meanings follow
`stitchfleet.compiler.evaluate`: after every op the result is cast to the node's
dtype; f16/bf16 sums and means accumulate in float32 and round once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from stitchfleet.compiler.ir import DType, Graph, Node, Op

Fn = Callable[[Mapping[str, Any]], dict[str, Any]]

_DTYPES = {
    DType.F16: jnp.float16,
    DType.BF16: jnp.bfloat16,
    DType.F32: jnp.float32,
    DType.F64: jnp.float64,
    DType.I32: jnp.int32,
    DType.I64: jnp.int64,
    DType.BOOL: jnp.bool_,
}
_UNARY: dict[Op, Callable[[Any], Any]] = {
    Op.NEG: jnp.negative,
    Op.ABS: jnp.abs,
    Op.SQUARE: jnp.square,
    Op.RELU: lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    Op.LOGICAL_NOT: jnp.logical_not,
    Op.SIGN: jnp.sign,
    Op.FLOOR: jnp.floor,
    Op.CEIL: jnp.ceil,
    Op.EXP: jnp.exp,
    Op.LOG: jnp.log,
    Op.LOG1P: jnp.log1p,
    Op.TANH: jnp.tanh,
    Op.SIGMOID: jax.nn.sigmoid,
    Op.ERF: jax.lax.erf,
    Op.RSQRT: jax.lax.rsqrt,
    Op.SQRT: jnp.sqrt,
    Op.RECIPROCAL: jnp.reciprocal,
    Op.CAST: lambda x: x,  # the cast to the node's dtype happens for every node
}
_BINARY: dict[Op, Callable[[Any, Any], Any]] = {
    Op.ADD: jnp.add,
    Op.SUB: jnp.subtract,
    Op.MUL: jnp.multiply,
    Op.DIV: jnp.divide,
    Op.POW: jnp.power,
    Op.MAXIMUM: jnp.maximum,
    Op.MINIMUM: jnp.minimum,
    Op.GREATER: jnp.greater,
    Op.GREATER_EQUAL: jnp.greater_equal,
    Op.LESS: jnp.less,
    Op.LESS_EQUAL: jnp.less_equal,
    Op.EQUAL: jnp.equal,
    Op.NOT_EQUAL: jnp.not_equal,
    Op.LOGICAL_AND: jnp.logical_and,
    Op.LOGICAL_OR: jnp.logical_or,
}
_REDUCE: dict[Op, Callable[..., Any]] = {
    Op.REDUCE_SUM: jnp.sum,
    Op.REDUCE_MEAN: jnp.mean,
    Op.REDUCE_PROD: jnp.prod,
    Op.REDUCE_MAX: jnp.max,
    Op.REDUCE_MIN: jnp.min,
}


class TranslationError(ValueError):
    """The graph holds an op this translator has no meaning for."""


def dtype_of(dtype: DType, precision: str = "native") -> Any:
    """The jax dtype that holds values of `dtype` (float64 for every float in float64 precision)."""
    return jnp.float64 if precision == "float64" and dtype.is_float else _DTYPES[dtype]


def _reduce(node: Node, x: Any) -> Any:
    axes = node.attrs.get_ints("axes")
    if node.op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        return _REDUCE[node.op](x, axis=axes)
    wide = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else None
    return _REDUCE[node.op](x, axis=axes, dtype=wide)


def _broadcast(node: Node, x: Any) -> Any:
    expanded = [1] * len(node.shape)
    for i, d in enumerate(node.attrs.get_ints("dims")):
        expanded[d] = x.shape[i]
    return jnp.broadcast_to(x.reshape(expanded), node.shape)


def _slice(node: Node, x: Any) -> Any:
    a = node.attrs
    ranges = zip(a.get_ints("begin"), a.get_ints("end"), a.get_ints("strides"), strict=True)
    return x[tuple(slice(b, e, s) for b, e, s in ranges)]


def _constant(node: Node, precision: str) -> Any:
    value = node.attrs.get("value")
    dtype = dtype_of(node.dtype, precision)
    if isinstance(value, tuple):
        return jnp.asarray(value, dtype=jnp.float64 if precision == "float64" else None).reshape(node.shape)
    return jnp.full(node.shape, value, dtype=dtype)


def _compute(node: Node, args: Sequence[Any], precision: str) -> Any:
    op = node.op
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op.is_reduction:
        return _reduce(node, args[0])
    handlers: dict[Op, Callable[[], Any]] = {
        Op.SELECT: lambda: jnp.where(args[0], args[1], args[2]),
        Op.BROADCAST: lambda: _broadcast(node, args[0]),
        Op.RESHAPE: lambda: args[0].reshape(node.shape),
        Op.TRANSPOSE: lambda: jnp.transpose(args[0], node.attrs.get_ints("perm")),
        Op.SLICE: lambda: _slice(node, args[0]),
        Op.CONCAT: lambda: jnp.concatenate(list(args), axis=node.attrs.get_int("axis")),
        Op.CONSTANT: lambda: _constant(node, precision),
    }
    if op not in handlers:
        raise TranslationError(f"{node.label}: no jax translation for {op.value}")
    return handlers[op]()


def check_translatable(graph: Graph) -> None:
    """Raises TranslationError naming the first node this translator cannot express."""
    for node in graph.nodes:
        if node.op is Op.OPAQUE:
            raise TranslationError(f"{node.label}: OPAQUE ops have no jax translation")


def to_jax(graph: Graph, precision: str = "native") -> Fn:
    """The graph as a function of jax arrays (wrap it in `jax.jit` to let XLA fuse it)."""
    check_translatable(graph)
    if precision not in ("native", "float64"):
        raise ValueError(f"precision must be 'native' or 'float64', got {precision!r}")

    def run(inputs: Mapping[str, Any]) -> dict[str, Any]:
        values: list[Any] = []
        for node in graph.nodes:
            if node.op is Op.PARAMETER:
                result = jnp.asarray(inputs[str(node.attrs["name"])])
            else:
                result = _compute(node, [values[i] for i in node.inputs], precision)
            values.append(result.astype(dtype_of(node.dtype, precision)))
        return {name: values[node_id] for name, node_id in graph.outputs}

    return run
