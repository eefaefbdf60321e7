"""Vocabulary of the graph IR: element types, operations and their kinds.

Input: nothing (tables). Output: `DType`, `Op`, `Kind` enums and the lookups the
rest of the compiler uses to ask what an op is (light or heavy element-wise, a
reduction, free data movement...). One table per fact, so adding an op is one line.
"""

from __future__ import annotations

import enum

import numpy as np


class DType(enum.Enum):
    """Element types. bf16 has no numpy type: evaluate emulates it (see evaluate.py)."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def itemsize(self) -> int:
        """Bytes per element on the device (bf16 is 2 bytes even though numpy holds it as f32)."""
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype[np.generic]:
        """The numpy type that holds values of this dtype (f32 for bf16)."""
        return np.dtype(_NUMPY[self])

    @classmethod
    def parse(cls, text: str | DType) -> DType:
        """Accepts 'f32', DType.F32; raises ValueError naming the bad value."""
        if isinstance(text, DType):
            return text
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype {text!r} (known: {known})") from None


_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_ITEMSIZE = {DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8, DType.I32: 4, DType.I64: 8, DType.BOOL: 1}
_NUMPY = {
    DType.F16: "float16",
    DType.BF16: "float32",
    DType.F32: "float32",
    DType.F64: "float64",
    DType.I32: "int32",
    DType.I64: "int64",
    DType.BOOL: "bool",
}


class Kind(enum.Enum):
    """What an op is, as far as clustering and planning care."""

    ELEMENTWISE_LIGHT = "elementwise_light"
    ELEMENTWISE_HEAVY = "elementwise_heavy"
    BROADCAST = "broadcast"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    CONCAT = "concat"
    REDUCE = "reduce"
    CONSTANT = "constant"
    PARAMETER = "parameter"
    OPAQUE = "opaque"


class Op(enum.Enum):
    """Every IR operation. The value is the name used in JSON and in printed graphs."""

    # element-wise, light: cheap enough that fusers duplicate them freely
    ADD = "ADD"
    SUB = "SUB"
    MUL = "MUL"
    NEG = "NEG"
    ABS = "ABS"
    MAXIMUM = "MAXIMUM"
    MINIMUM = "MINIMUM"
    SQUARE = "SQUARE"
    RELU = "RELU"
    SELECT = "SELECT"
    CAST = "CAST"
    GREATER = "GREATER"
    GREATER_EQUAL = "GREATER_EQUAL"
    LESS = "LESS"
    LESS_EQUAL = "LESS_EQUAL"
    EQUAL = "EQUAL"
    NOT_EQUAL = "NOT_EQUAL"
    LOGICAL_AND = "LOGICAL_AND"
    LOGICAL_OR = "LOGICAL_OR"
    LOGICAL_NOT = "LOGICAL_NOT"
    SIGN = "SIGN"
    FLOOR = "FLOOR"
    CEIL = "CEIL"
    # element-wise, heavy: transcendental or division; never duplicated by fusers
    EXP = "EXP"
    LOG = "LOG"
    LOG1P = "LOG1P"
    TANH = "TANH"
    SIGMOID = "SIGMOID"
    ERF = "ERF"
    POW = "POW"
    DIV = "DIV"
    RSQRT = "RSQRT"
    SQRT = "SQRT"
    RECIPROCAL = "RECIPROCAL"
    # data movement
    BROADCAST = "BROADCAST"
    RESHAPE = "RESHAPE"
    TRANSPOSE = "TRANSPOSE"
    SLICE = "SLICE"
    CONCAT = "CONCAT"
    # reductions
    REDUCE_SUM = "REDUCE_SUM"
    REDUCE_MAX = "REDUCE_MAX"
    REDUCE_MIN = "REDUCE_MIN"
    REDUCE_MEAN = "REDUCE_MEAN"
    REDUCE_PROD = "REDUCE_PROD"
    # leaves and the rest
    CONSTANT = "CONSTANT"
    PARAMETER = "PARAMETER"
    OPAQUE = "OPAQUE"

    @property
    def kind(self) -> Kind:
        return _KIND[self]

    @property
    def is_elementwise(self) -> bool:
        return self.kind in (Kind.ELEMENTWISE_LIGHT, Kind.ELEMENTWISE_HEAVY)

    @property
    def is_reduction(self) -> bool:
        return self.kind is Kind.REDUCE

    @property
    def is_memory_intensive(self) -> bool:
        """Everything a stitch kernel may contain: all but graph inputs and opaque ops."""
        return self.kind not in (Kind.PARAMETER, Kind.OPAQUE)

    @property
    def arity(self) -> int | None:
        """Number of operands, or None when variable (CONCAT, OPAQUE)."""
        return _ARITY.get(self, 1 if self.kind is not Kind.CONCAT and self.kind is not Kind.OPAQUE else None)

    @classmethod
    def parse(cls, text: str | Op) -> Op:
        """Accepts 'ADD' or Op.ADD; raises ValueError naming the unknown op."""
        if isinstance(text, Op):
            return text
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown op {text!r}") from None


_LIGHT_UNARY = (Op.NEG, Op.ABS, Op.SQUARE, Op.RELU, Op.CAST, Op.LOGICAL_NOT, Op.SIGN, Op.FLOOR, Op.CEIL)
_LIGHT_BINARY = (Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM, Op.MINIMUM, Op.LOGICAL_AND, Op.LOGICAL_OR)
COMPARISONS = frozenset({Op.GREATER, Op.GREATER_EQUAL, Op.LESS, Op.LESS_EQUAL, Op.EQUAL, Op.NOT_EQUAL})
_HEAVY_UNARY = (Op.EXP, Op.LOG, Op.LOG1P, Op.TANH, Op.SIGMOID, Op.ERF, Op.RSQRT, Op.SQRT, Op.RECIPROCAL)
_HEAVY_BINARY = (Op.POW, Op.DIV)

UNARY_ELEMENTWISE = frozenset(_LIGHT_UNARY + _HEAVY_UNARY)
BINARY_ELEMENTWISE = frozenset(_LIGHT_BINARY + _HEAVY_BINARY) | COMPARISONS
LOGICAL = frozenset({Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_NOT})
# Ops defined on floating-point values only (the rest also accept integers).
FLOAT_ONLY = frozenset(_HEAVY_UNARY + _HEAVY_BINARY) | {Op.FLOOR, Op.CEIL, Op.REDUCE_MEAN}

_KIND: dict[Op, Kind] = {
    **dict.fromkeys((*_LIGHT_UNARY, *_LIGHT_BINARY, *COMPARISONS, Op.SELECT), Kind.ELEMENTWISE_LIGHT),
    **dict.fromkeys((*_HEAVY_UNARY, *_HEAVY_BINARY), Kind.ELEMENTWISE_HEAVY),
    **dict.fromkeys((Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_MEAN, Op.REDUCE_PROD), Kind.REDUCE),
    Op.BROADCAST: Kind.BROADCAST,
    Op.RESHAPE: Kind.RESHAPE,
    Op.TRANSPOSE: Kind.TRANSPOSE,
    Op.SLICE: Kind.SLICE,
    Op.CONCAT: Kind.CONCAT,
    Op.CONSTANT: Kind.CONSTANT,
    Op.PARAMETER: Kind.PARAMETER,
    Op.OPAQUE: Kind.OPAQUE,
}
_ARITY: dict[Op, int] = {
    **dict.fromkeys(BINARY_ELEMENTWISE, 2),
    Op.SELECT: 3,
    Op.CONSTANT: 0,
    Op.PARAMETER: 0,
}
