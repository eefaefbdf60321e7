"""What each kernel IR math op computes, on numpy vectors of per-thread values.

Input: an op (graph IR `Op` or `IndexOp`) and operand arrays. Output: the result
array in the expression's dtype, with the meanings of `evaluate` (the graph IR
reference) for element-wise ops and C semantics for integer DIV/MOD (truncation
toward zero). bf16 values are held in float32 and rounded after every op, as
bf16 storage does. Integer division by zero raises `ArithmeticError` (the
interpreter turns it into a SimError naming the statement).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.elementwise import BINARY, UNARY
from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir.types import DType, Op
from stitchfleet.compiler.kernel.ir import IndexOp

Array = npt.NDArray[Any]


def fit(values: Any, dtype: DType) -> Array:
    """Values as `dtype` holds them (bf16 rounded, kept in float32)."""
    array = np.asarray(values).astype(dtype.numpy, copy=False)
    return round_bf16(array) if dtype is DType.BF16 else array


def unary(op: Op, x: Array, dtype: DType) -> Array:
    return fit(UNARY[op](x), dtype)


def binary(op: Op | IndexOp, a: Array, b: Array, dtype: DType) -> Array:
    if a.dtype.kind in "iu" and op in (Op.DIV, IndexOp.MOD):
        return fit(_int_div_mod(op, a, b), dtype)
    if isinstance(op, IndexOp):
        raise TypeError(f"{op.value} needs integer operands")
    return fit(BINARY[op](a, b), dtype)


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
    result: Array = BINARY[op](a, b)
    return result
