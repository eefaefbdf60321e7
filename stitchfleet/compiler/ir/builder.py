"""GraphBuilder: the Python way to write IR graphs (tests, the benchmark suite).

Input: calls like `b.parameter("x", (4096, 1024), "f32")`, `b.add(x, y)`,
`b.reduce_sum(x, axes=(1,))`. Output: a verified `Graph` from `b.build()`.
Binary ops broadcast numpy-style: the builder inserts explicit BROADCAST nodes, so
every one-to-many dependency is visible in the graph. Python numbers become scalar
constants of the other operand's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stitchfleet.compiler.ir.attrs import Attrs
from stitchfleet.compiler.ir.graph import Graph, Node
from stitchfleet.compiler.ir.shapes import Shape, ShapeError, TensorType, check_shape, infer
from stitchfleet.compiler.ir.types import DType, Op


@dataclass(frozen=True)
class Value:
    """A handle on a node being built; supports + - * / and unary minus."""

    builder: GraphBuilder
    id: int

    @property
    def shape(self) -> Shape:
        return self.builder.nodes[self.id].shape

    @property
    def dtype(self) -> DType:
        return self.builder.nodes[self.id].dtype

    def __add__(self, other: Value | float) -> Value:
        return self.builder.add(self, other)

    def __radd__(self, other: float) -> Value:
        return self.builder.add(other, self)

    def __sub__(self, other: Value | float) -> Value:
        return self.builder.sub(self, other)

    def __rsub__(self, other: float) -> Value:
        return self.builder.sub(other, self)

    def __mul__(self, other: Value | float) -> Value:
        return self.builder.mul(self, other)

    def __rmul__(self, other: float) -> Value:
        return self.builder.mul(other, self)

    def __truediv__(self, other: Value | float) -> Value:
        return self.builder.div(self, other)

    def __rtruediv__(self, other: float) -> Value:
        return self.builder.div(other, self)

    def __neg__(self) -> Value:
        return self.builder.unary(Op.NEG, self)


class GraphBuilder:
    """Appends nodes in topological order; every node's type is inferred on the spot."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._outputs: dict[str, int] = {}
        self._scalars: dict[tuple[float, DType], Value] = {}

    # -- core -----------------------------------------------------------------
    def op(
        self, op: Op, operands: Sequence[Value] = (), attrs: Mapping[str, object] | None = None, **kw: object
    ) -> Value:
        """Appends any op; `declared` (a TensorType) is required for leaves and OPAQUE."""
        declared = kw.pop("declared", None)
        name = str(kw.pop("name", ""))
        frozen = Attrs(attrs or {})
        ids = tuple(self._own(v).id for v in operands)
        operand_types = [self.nodes[i].type for i in ids]
        result = infer(op, frozen, operand_types, declared if isinstance(declared, TensorType) else None)
        node_id = len(self.nodes)
        self.nodes.append(
            Node(node_id, op, ids, result.shape, result.dtype, name or f"{op.value.lower()}.{node_id}", frozen)
        )
        return Value(self, node_id)

    def _own(self, value: Value) -> Value:
        if value.builder is not self:
            raise ValueError(f"value {value.id} belongs to another GraphBuilder")
        return value

    def output(self, name: str, value: Value) -> None:
        if name in self._outputs:
            raise ValueError(f"output {name!r} is already defined")
        self._outputs[name] = self._own(value).id

    def build(self, metadata: Mapping[str, object] | None = None) -> Graph:
        return Graph.create(self.nodes, self._outputs, metadata)

    # -- leaves ---------------------------------------------------------------
    def parameter(self, name: str, shape: Sequence[int], dtype: str | DType = "f32") -> Value:
        declared = TensorType(check_shape(tuple(shape), f"parameter {name!r} shape"), DType.parse(dtype))
        return self.op(Op.PARAMETER, (), {"name": name}, declared=declared, name=name)

    def constant(self, value: object, dtype: str | DType = "f32", name: str = "") -> Value:
        """A small constant: a Python number (scalar) or an array-like (stored flat)."""
        array = np.asarray(value)
        data: object = array.item() if array.ndim == 0 else array.ravel().tolist()
        declared = TensorType(tuple(array.shape), DType.parse(dtype))
        return self.op(Op.CONSTANT, (), {"value": data}, declared=declared, name=name)

    def scalar(self, value: float, dtype: str | DType) -> Value:
        """A cached rank-0 constant."""
        key = (float(value), DType.parse(dtype))
        if key not in self._scalars:
            self._scalars[key] = self.constant(value, key[1])
        return self._scalars[key]

    def splat(self, value: float, shape: Sequence[int], dtype: str | DType) -> Value:
        """A constant filling `shape`: a scalar broadcast to it."""
        return self.broadcast_to(self.scalar(value, dtype), tuple(shape))

    def opaque(
        self, op_type: str, operands: Sequence[Value], shape: Sequence[int], dtype: str | DType, reason: str
    ) -> Value:
        """A compute-intensive or unsupported op kept as a black box (`reason` says which)."""
        declared = TensorType(check_shape(tuple(shape)), DType.parse(dtype))
        return self.op(Op.OPAQUE, operands, {"type": op_type, "reason": reason}, declared=declared)

    # -- element-wise -----------------------------------------------------------
    def unary(self, op: Op, x: Value) -> Value:
        return self.op(op, (x,))

    def binary(self, op: Op, a: Value | float, b: Value | float) -> Value:
        left, right = self._promote(a, b)
        shape = _broadcast_shapes(left.shape, right.shape)
        return self.op(op, (self.broadcast_to(left, shape), self.broadcast_to(right, shape)))

    def _promote(self, a: Value | float, b: Value | float) -> tuple[Value, Value]:
        if isinstance(a, Value) and isinstance(b, Value):
            return a, b
        if isinstance(a, Value):
            return a, self.scalar(float(b), a.dtype)  # type: ignore[arg-type]
        if isinstance(b, Value):
            return self.scalar(float(a), b.dtype), b
        raise ValueError("at least one operand must be a graph value")

    def add(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.ADD, a, b)

    def sub(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.SUB, a, b)

    def mul(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.MUL, a, b)

    def div(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.DIV, a, b)

    def pow(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.POW, a, b)

    def maximum(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.MAXIMUM, a, b)

    def minimum(self, a: Value | float, b: Value | float) -> Value:
        return self.binary(Op.MINIMUM, a, b)

    def exp(self, x: Value) -> Value:
        return self.unary(Op.EXP, x)

    def log(self, x: Value) -> Value:
        return self.unary(Op.LOG, x)

    def tanh(self, x: Value) -> Value:
        return self.unary(Op.TANH, x)

    def erf(self, x: Value) -> Value:
        return self.unary(Op.ERF, x)

    def rsqrt(self, x: Value) -> Value:
        return self.unary(Op.RSQRT, x)

    def square(self, x: Value) -> Value:
        return self.unary(Op.SQUARE, x)

    def neg(self, x: Value) -> Value:
        return self.unary(Op.NEG, x)

    def sigmoid(self, x: Value) -> Value:
        return self.unary(Op.SIGMOID, x)

    def sqrt(self, x: Value) -> Value:
        return self.unary(Op.SQRT, x)

    def cast(self, x: Value, dtype: str | DType) -> Value:
        target = DType.parse(dtype)
        return x if target is x.dtype else self.op(Op.CAST, (x,), {"to": target.value})

    def select(self, pred: Value, a: Value | float, b: Value | float) -> Value:
        left, right = self._promote(a, b)
        shape = _broadcast_shapes(_broadcast_shapes(pred.shape, left.shape), right.shape)
        operands = (self.broadcast_to(v, shape) for v in (pred, left, right))
        return self.op(Op.SELECT, tuple(operands))

    # -- data movement and reductions -------------------------------------------
    def broadcast(self, x: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
        """XLA broadcast_in_dim: operand dim i becomes output dim dims[i]."""
        return self.op(Op.BROADCAST, (x,), {"shape": tuple(shape), "dims": tuple(dims)})

    def broadcast_to(self, x: Value, shape: Shape) -> Value:
        """numpy-style broadcast (trailing dims aligned); a no-op when the shape already matches."""
        if x.shape == tuple(shape):
            return x
        offset = len(shape) - len(x.shape)
        if offset < 0:
            raise ShapeError(f"cannot broadcast {x.shape} to the smaller rank of {tuple(shape)}")
        return self.broadcast(x, shape, tuple(range(offset, len(shape))))

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        return x if x.shape == tuple(shape) else self.op(Op.RESHAPE, (x,), {"shape": tuple(shape)})

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        return self.op(Op.TRANSPOSE, (x,), {"perm": tuple(perm)})

    def slice(self, x: Value, begin: Sequence[int], end: Sequence[int], strides: Sequence[int] | None = None) -> Value:
        steps = tuple(strides) if strides is not None else (1,) * len(begin)
        return self.op(Op.SLICE, (x,), {"begin": tuple(begin), "end": tuple(end), "strides": steps})

    def concat(self, values: Sequence[Value], axis: int) -> Value:
        return self.op(Op.CONCAT, tuple(values), {"axis": axis})

    def reduce(self, op: Op, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        rank = len(x.shape)
        normal = tuple(sorted({a % rank for a in axes})) if rank else tuple(axes)
        reduced = self.op(op, (x,), {"axes": normal})
        if not keepdims:
            return reduced
        return self.reshape(reduced, tuple(1 if i in normal else d for i, d in enumerate(x.shape)))

    def reduce_sum(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self.reduce(Op.REDUCE_SUM, x, axes, keepdims)

    def reduce_max(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self.reduce(Op.REDUCE_MAX, x, axes, keepdims)

    def reduce_mean(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self.reduce(Op.REDUCE_MEAN, x, axes, keepdims)


def _broadcast_shapes(a: Shape, b: Shape) -> Shape:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ShapeError(f"shapes {a} and {b} cannot be broadcast together") from None
