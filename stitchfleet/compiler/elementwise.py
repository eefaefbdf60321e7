"""What each element-wise op computes, on numpy arrays: the one table every interpreter shares.

Input: an `Op` and operand arrays. Output: the raw numpy result (the caller converts
it to the node's dtype). `evaluate` (the graph reference) and the `sim` backend's
kernel math both use these tables, so an op cannot mean two things.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler import error_function
from stitchfleet.compiler.ir.types import Op

Array = npt.NDArray[Any]


def sigmoid(x: Array) -> Array:
    """1 / (1 + exp(-x)), without overflow and with full relative precision for negative x."""
    # exp(-|x|) never overflows; z / (1 + z) keeps full precision for negative x, where
    # 1 - 1 / (1 + z) would cancel (sigmoid(-10) lost ~10 bits in f32)
    z = np.exp(-np.abs(x))
    result: Array = np.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
    return result


def erf(x: Array) -> Array:
    """The error function, computed in float64 over the whole array (numpy has none: error_function.py)."""
    return error_function.erf(x)


UNARY: dict[Op, Callable[[Array], Any]] = {
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
    Op.SIGMOID: sigmoid,
    Op.ERF: erf,
    Op.RSQRT: lambda x: 1 / np.sqrt(x),
    Op.SQRT: np.sqrt,
    Op.RECIPROCAL: lambda x: 1 / x,
}
BINARY: dict[Op, Callable[[Array, Array], Any]] = {
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
