"""Shape and dtype inference: the one place that says what every op produces.

Input: an op, its attributes and its operands' (shape, dtype). Output: the result's
`TensorType`, or `ShapeError` saying what is wrong (the verifier adds which node).
A dimension of -1 is dynamic (unknown until run time); rules carry it through and
the stitch scope leaves such ops out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from stitchfleet.compiler.ir.attrs import Attrs
from stitchfleet.compiler.ir.types import (
    BINARY_ELEMENTWISE,
    COMPARISONS,
    FLOAT_ONLY,
    LOGICAL,
    UNARY_ELEMENTWISE,
    DType,
    Kind,
    Op,
)

Shape = tuple[int, ...]
DYNAMIC = -1


class ShapeError(ValueError):
    """An op's operands or attributes do not fit together."""


class TensorType(NamedTuple):
    shape: Shape
    dtype: DType


def num_elements(shape: Shape) -> int:
    """Element count of a static shape (1 for a scalar)."""
    return math.prod(shape)


def is_static(shape: Shape) -> bool:
    return all(d >= 0 for d in shape)


def check_shape(shape: object, what: str = "shape") -> Shape:
    """Validates a shape given by a caller or a file: a sequence of ints >= -1."""
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ShapeError(f"{what} must be a list of integers, got {shape!r}")
    if any(d < DYNAMIC for d in shape):
        raise ShapeError(f"{what} {tuple(shape)} has a negative dimension (only -1, dynamic, is allowed)")
    return tuple(shape)


def _check_dtype(op: Op, dtype: DType) -> None:
    if op in LOGICAL and dtype is not DType.BOOL:
        raise ShapeError(f"{op.value} needs bool operands, got {dtype.value}")
    if op in FLOAT_ONLY and not dtype.is_float:
        raise ShapeError(f"{op.value} needs floating-point operands, got {dtype.value}")
    arithmetic = op not in LOGICAL and op not in (Op.CAST, Op.SELECT, Op.EQUAL, Op.NOT_EQUAL)
    if arithmetic and dtype is DType.BOOL:
        raise ShapeError(f"{op.value} is not defined on bool operands")


def _unary(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    _check_dtype(op, x.dtype)
    if op is Op.CAST:
        try:
            return TensorType(x.shape, DType.parse(attrs.get_str("to")))
        except ValueError as err:
            raise ShapeError(f"CAST: {err}") from None
    return x


def _binary(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    a, b = operands
    if a.shape != b.shape:
        raise ShapeError(f"{op.value} operands have different shapes {a.shape} and {b.shape} (insert a BROADCAST)")
    if a.dtype is not b.dtype:
        raise ShapeError(f"{op.value} operands have different dtypes {a.dtype.value} and {b.dtype.value}")
    _check_dtype(op, a.dtype)
    return TensorType(a.shape, DType.BOOL if op in COMPARISONS else a.dtype)


def _select(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    pred, a, b = operands
    if pred.dtype is not DType.BOOL:
        raise ShapeError(f"SELECT predicate must be bool, got {pred.dtype.value}")
    if not pred.shape == a.shape == b.shape:
        raise ShapeError(f"SELECT operands have different shapes {pred.shape}, {a.shape}, {b.shape}")
    if a.dtype is not b.dtype:
        raise ShapeError(f"SELECT branches have different dtypes {a.dtype.value} and {b.dtype.value}")
    return a


def _broadcast(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    out = check_shape(attrs.get("shape"), "BROADCAST shape")
    dims = attrs.get_ints("dims")
    if len(dims) != len(x.shape):
        raise ShapeError(f"BROADCAST dims {dims} must name one output dim per operand dim (rank {len(x.shape)})")
    if any(d < 0 or d >= len(out) for d in dims) or list(dims) != sorted(set(dims)):
        raise ShapeError(f"BROADCAST dims {dims} must be increasing output dims below rank {len(out)}")
    for i, d in enumerate(dims):
        if x.shape[i] not in (1, out[d], DYNAMIC):
            raise ShapeError(f"BROADCAST operand dim {i} (size {x.shape[i]}) cannot become output dim {d} ({out[d]})")
    return TensorType(out, x.dtype)


def _reshape(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    out = check_shape(attrs.get("shape"), "RESHAPE shape")
    if is_static(x.shape) and is_static(out) and num_elements(x.shape) != num_elements(out):
        raise ShapeError(f"RESHAPE from {x.shape} to {out} changes the element count")
    return TensorType(out, x.dtype)


def _transpose(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    perm = attrs.get_ints("perm")
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"TRANSPOSE perm {perm} is not a permutation of the operand's {len(x.shape)} dims")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _slice(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    begin, end, strides = attrs.get_ints("begin"), attrs.get_ints("end"), attrs.get_ints("strides")
    if not len(begin) == len(end) == len(strides) == len(x.shape):
        raise ShapeError(f"SLICE begin/end/strides must each have {len(x.shape)} entries")
    out = []
    for axis, (lo, hi, step, dim) in enumerate(zip(begin, end, strides, x.shape, strict=True)):
        if step < 1 or lo < 0 or hi < lo or (dim != DYNAMIC and hi > dim):
            raise ShapeError(f"SLICE axis {axis}: [{lo}:{hi}:{step}] is not a valid range of a dim of size {dim}")
        out.append(-(-(hi - lo) // step))
    return TensorType(tuple(out), x.dtype)


def _concat(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    if not operands:
        raise ShapeError("CONCAT needs at least one operand")
    first = operands[0]
    axis = attrs.get_int("axis")
    if not 0 <= axis < len(first.shape):
        raise ShapeError(f"CONCAT axis {axis} is out of range for rank {len(first.shape)}")
    for other in operands[1:]:
        rest_a = first.shape[:axis] + first.shape[axis + 1 :]
        rest_b = other.shape[:axis] + other.shape[axis + 1 :]
        if len(other.shape) != len(first.shape) or rest_a != rest_b or other.dtype is not first.dtype:
            raise ShapeError(f"CONCAT operands {first.shape} and {other.shape} do not match outside axis {axis}")
    sizes = [t.shape[axis] for t in operands]
    total = DYNAMIC if DYNAMIC in sizes else sum(sizes)
    return TensorType((*first.shape[:axis], total, *first.shape[axis + 1 :]), first.dtype)


def _reduce(op: Op, attrs: Attrs, operands: Sequence[TensorType]) -> TensorType:
    (x,) = operands
    axes = attrs.get_ints("axes")
    if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(x.shape):
        raise ShapeError(f"{op.value} axes {axes} must be non-empty, increasing and below rank {len(x.shape)}")
    _check_dtype(op, x.dtype)
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _declared_leaf(op: Op, attrs: Attrs, declared: TensorType) -> TensorType:
    if op is Op.PARAMETER and not attrs.get_str("name", ""):
        raise ShapeError("PARAMETER needs a non-empty 'name' attribute")
    if op is Op.OPAQUE:
        attrs.get_str("type")
    if op is Op.CONSTANT:
        _check_constant(attrs, declared)
    return declared


def _check_constant(attrs: Attrs, declared: TensorType) -> None:
    value = attrs.get("value")
    if not is_static(declared.shape):
        raise ShapeError("CONSTANT must have a static shape")
    flat = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(v, int | float) for v in flat):
        raise ShapeError(f"CONSTANT value must be a number or a flat list of numbers, got {value!r}")
    if isinstance(value, tuple) and len(value) != num_elements(declared.shape):
        raise ShapeError(f"CONSTANT has {len(value)} values for shape {declared.shape}")


_Rule = Callable[[Op, Attrs, Sequence[TensorType]], TensorType]
_RULES: dict[Kind, _Rule] = {
    Kind.BROADCAST: _broadcast,
    Kind.RESHAPE: _reshape,
    Kind.TRANSPOSE: _transpose,
    Kind.SLICE: _slice,
    Kind.CONCAT: _concat,
    Kind.REDUCE: _reduce,
}


def _rule(op: Op) -> _Rule:
    if op in UNARY_ELEMENTWISE:
        return _unary
    if op in BINARY_ELEMENTWISE:
        return _binary
    if op is Op.SELECT:
        return _select
    return _RULES[op.kind]


def infer(op: Op, attrs: Attrs, operands: Sequence[TensorType], declared: TensorType | None = None) -> TensorType:
    """The result type of `op`; leaves and OPAQUE ops return their `declared` type after checking attrs."""
    if op.arity is not None and len(operands) != op.arity:
        raise ShapeError(f"{op.value} takes {op.arity} operand(s), got {len(operands)}")
    if op.kind in (Kind.PARAMETER, Kind.CONSTANT, Kind.OPAQUE):
        if declared is None:
            raise ShapeError(f"{op.value} needs a declared shape and dtype")
        try:
            return _declared_leaf(op, attrs, declared)
        except ValueError as err:
            raise ShapeError(str(err)) from None
    try:
        return _rule(op)(op, attrs, operands)
    except ShapeError:
        raise
    except ValueError as err:  # attribute accessors raise ValueError naming the attribute
        raise ShapeError(f"{op.value}: {err}") from None
