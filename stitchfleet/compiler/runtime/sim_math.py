"""What each kernel IR math op computes, on numpy vectors of per-thread values.

Input: an op (graph IR `Op` or `IndexOp`) and operand arrays. Output: the result
array in the expression's dtype, with the meanings of `evaluate` (the graph IR
reference) for element-wise ops and C semantics for integer DIV/MOD (truncation
toward zero). bf16 values are held in float32 and rounded after every op, as
bf16 storage does. Integer division by zero raises `ArithmeticError` (the
interpreter turns it into a SimError naming the statement).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir.types import DType, Op
from stitchfleet.compiler.kernel.ir import IndexOp

Array = npt.NDArray[Any]

_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: Array) -> Array:
    positive = 1.0 / (1.0 + np.exp(-np.abs(x)))
    result: Array = np.where(x >= 0, positive, 1.0 - positive)
    return result


_UNARY: dict[Op, Callable[[Array], Any]] = {
    Op.NEG: np.negative,
    Op.ABS: np.abs,
    Op.SQUARE: np.square,
    Op.RELU: lambda x: np.maximum(x, np.zeros((), x.dtype)),
    Op.LOGICAL_NOT: np.logical_not,
    Op.SIGN: np.sign,
    Op.FLOOR: np.floor,
    Op.CEIL: np.ceil,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.LOG1P: np.log1p,
    Op.TANH: np.tanh,
    Op.SIGMOID: _sigmoid,
    Op.ERF: _ERF,
    Op.RSQRT: lambda x: 1 / np.sqrt(x),
    Op.SQRT: np.sqrt,
    Op.RECIPROCAL: lambda x: 1 / x,
}
_BINARY: dict[Op, Callable[[Array, Array], Any]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.POW: np.power,
    Op.MAXIMUM: np.maximum,
    Op.MINIMUM: np.minimum,
    Op.GREATER: np.greater,
    Op.GREATER_EQUAL: np.greater_equal,
    Op.LESS: np.less,
    Op.LESS_EQUAL: np.less_equal,
    Op.EQUAL: np.equal,
    Op.NOT_EQUAL: np.not_equal,
    Op.LOGICAL_AND: np.logical_and,
    Op.LOGICAL_OR: np.logical_or,
}


def fit(values: Any, dtype: DType) -> Array:
    """Values as `dtype` holds them (bf16 rounded, kept in float32)."""
    array = np.asarray(values).astype(dtype.numpy, copy=False)
    return round_bf16(array) if dtype is DType.BF16 else array


def unary(op: Op, x: Array, dtype: DType) -> Array:
    return fit(_UNARY[op](x), dtype)


def binary(op: Op | IndexOp, a: Array, b: Array, dtype: DType) -> Array:
    if a.dtype.kind in "iu" and op in (Op.DIV, IndexOp.MOD):
        return fit(_int_div_mod(op, a, b), dtype)
    if isinstance(op, IndexOp):
        raise TypeError(f"{op.value} needs integer operands")
    return fit(_BINARY[op](a, b), dtype)


def _int_div_mod(op: Op | IndexOp, a: Array, b: Array) -> Array:
    if np.any(b == 0):
        raise ArithmeticError(f"integer {op.value} by zero")
    quotient: Array = np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)
    return quotient if op is Op.DIV else a - quotient * b


def cast(x: Array, dtype: DType) -> Array:
    """C conversion: float -> int truncates toward zero; anything -> bool is `!= 0`."""
    if dtype is DType.BOOL:
        return np.asarray(x != 0)
    return fit(x, dtype)


def combine(op: Op, a: Array, b: Array) -> Array:
    """The reduction step used by atomics: ADD, MAXIMUM or MINIMUM."""
    result: Array = _BINARY[op](a, b)
    return result
