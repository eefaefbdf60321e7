"""Kernel IR expressions as CUDA C expressions, with the IR's (numpy's) semantics.

Input: an `Expr`. Output: C text whose C type is the expression's dtype (`c_type`).
f16 and bf16 values are stored as `__half` / `__nv_bfloat16`; every op on them is
computed in float and rounded back (`sf_h`, `sf_b`), exactly what the sim does.
Constants of those types are written as bit patterns computed here with numpy, so
their rounding is numpy's. Index math stays `long long`. The helpers named `sf_*`
are defined in cuda_prelude.PRELUDE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir.types import COMPARISONS, DType, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.syntax import INFIX, LIBM


class RenderError(ValueError):
    """The kernel uses something the CUDA renderer cannot express; the message says what."""


C_TYPE = {
    DType.F16: "__half",
    DType.BF16: "__nv_bfloat16",
    DType.F32: "float",
    DType.F64: "double",
    DType.I32: "int",
    DType.I64: "long long",
    DType.BOOL: "bool",
}
HALVES = frozenset({DType.F16, DType.BF16})
_ROUND = {DType.F16: "sf_h", DType.BF16: "sf_b"}
SPECIAL_NAME = {
    ir.Special.THREAD_IDX: "sf_tid",
    ir.Special.BLOCK_IDX: "sf_bid",
    ir.Special.BLOCK_DIM: "sf_bdim",
    ir.Special.GRID_DIM: "sf_gdim",
    ir.Special.LANE: "sf_lane",
    ir.Special.WARP: "sf_warp",
}
SPECIAL_VALUE = {
    ir.Special.THREAD_IDX: "threadIdx.x",
    ir.Special.BLOCK_IDX: "blockIdx.x",
    ir.Special.BLOCK_DIM: "blockDim.x",
    ir.Special.GRID_DIM: "gridDim.x",
    ir.Special.LANE: "threadIdx.x & 31u",
    ir.Special.WARP: "threadIdx.x >> 5",
}
_LIBM = {**LIBM, Op.RSQRT: "rsqrt", Op.POW: "pow"}  # CUDA C adds these to C's math library
_HELPER = {
    Op.SQUARE: "sf_square",
    Op.SIGN: "sf_sign",
    Op.SIGMOID: "sf_sigmoid",
    Op.MAXIMUM: "sf_max",
    Op.MINIMUM: "sf_min",
}
_INF_BITS = {DType.F32: ("__int_as_float", "0x7f800000", "0xff800000", "0x7fffffff")}
_INF_BITS[DType.F64] = ("__longlong_as_double", "0x7ff0000000000000LL", "0xfff0000000000000LL", "0x7ff8000000000000LL")

LoadOverride = Mapping[tuple[str, ir.Var], str]


def math_type(dtype: DType) -> DType:
    """The type C arithmetic on `dtype` happens in (float for the 16-bit floats)."""
    return DType.F32 if dtype in HALVES else dtype


def float_literal(value: float, dtype: DType) -> str:
    """A float/double literal (inf and nan as bit patterns: they have no literal)."""
    if math.isfinite(value):
        return f"{value!r}f" if dtype is DType.F32 else repr(value)
    fn, pos, neg, nan = _INF_BITS[dtype]
    return f"{fn}({nan if math.isnan(value) else pos if value > 0 else neg})"


def _half_value(value: float, dtype: DType) -> float:
    """The value a 16-bit float constant really holds, rounded as numpy rounds it."""
    if dtype is DType.F16:
        return float(np.float16(value))
    return float(round_bf16(np.asarray([value], np.float32))[0])


def const_text(c: ir.Const) -> str:
    if c.dtype is DType.BOOL:
        return "true" if c.value else "false"
    if c.dtype in (DType.I32, DType.I64):
        return f"{int(c.value)}{'LL' if c.dtype is DType.I64 else ''}"
    if c.dtype in HALVES:
        held = _half_value(float(c.value), c.dtype)
        if c.dtype is DType.F16:
            bits = int(np.asarray([held], np.float16).view(np.uint16)[0])
            return f"__ushort_as_half((unsigned short){bits:#06x})"
        bits = int(np.asarray([held], np.float32).view(np.uint32)[0]) >> 16
        return f"__ushort_as_bfloat16((unsigned short){bits:#06x})"
    return float_literal(float(c.value), c.dtype)


class ExprRenderer:
    """Renders expressions; `overrides` replace `buffer[var]` loads (vector lanes) with given text."""

    def __init__(self, overrides: LoadOverride | None = None) -> None:
        self.overrides: LoadOverride = overrides or {}

    def text(self, e: ir.Expr) -> str:
        """`e` in its own C type."""
        return _TEXT[type(e)](self, e)

    def math(self, e: ir.Expr) -> str:
        """`e` in its math type (16-bit floats widened to float; their constants folded to literals)."""
        if e.dtype not in HALVES:
            return self.text(e)
        if isinstance(e, ir.Const):
            return float_literal(_half_value(float(e.value), e.dtype), DType.F32)
        return f"sf_f({self.text(e)})"

    def _rounded(self, dtype: DType, text: str) -> str:
        return f"{_ROUND[dtype]}({text})" if dtype in HALVES else text

    def _unary(self, e: ir.Unary) -> str:
        return self._rounded(e.dtype, unary_text(e.op, self.math(e.x), math_type(e.dtype)))

    def _binary(self, e: ir.Binary) -> str:
        a, b = self.math(e.a), self.math(e.b)
        text = binary_text(e.op, a, b, math_type(e.a.dtype))
        return text if e.op in COMPARISONS else self._rounded(e.dtype, text)

    def _load(self, e: ir.Load) -> str:
        if isinstance(e.index, ir.Var):
            lane = self.overrides.get((e.buffer.name, e.index))
            if lane is not None:
                return lane
        return f"{e.buffer.name}[{self.text(e.index)}]"

    def _cast(self, e: ir.Cast) -> str:
        source = e.x.dtype
        if e.dtype is source:
            return self.text(e.x)
        if e.dtype is DType.BOOL:
            return f"({self.math(e.x)} != 0)"
        if e.dtype in HALVES:
            if e.dtype is DType.F16 and source is DType.F64:
                return f"__double2half({self.text(e.x)})"
            return self._rounded(e.dtype, f"static_cast<float>({self.math(e.x)})")
        return f"static_cast<{C_TYPE[e.dtype]}>({self.math(e.x)})"


def _select(r: ExprRenderer, e: ir.Select) -> str:
    return f"({r.text(e.cond)} ? {r.text(e.a)} : {r.text(e.b)})"


_TEXT: dict[type, Callable[[ExprRenderer, Any], str]] = {
    ir.Const: lambda r, e: const_text(e),
    ir.SpecialIndex: lambda r, e: SPECIAL_NAME[e.which],
    ir.Var: lambda r, e: str(e.name),
    ir.Unary: ExprRenderer._unary,
    ir.Binary: ExprRenderer._binary,
    ir.Select: _select,
    ir.Cast: ExprRenderer._cast,
    ir.Load: ExprRenderer._load,
}


def _libm(op: Op, dtype: DType) -> str:
    return _LIBM[op] + ("f" if dtype is DType.F32 else "")


def _abs_name(dtype: DType) -> str:
    if dtype.is_float:
        return "fabsf" if dtype is DType.F32 else "fabs"
    return "llabs" if dtype is DType.I64 else "abs"


def unary_text(op: Op, x: str, dtype: DType) -> str:  # noqa: PLR0911 (one case per op family)
    """`op(x)` where x is C text of math type `dtype`."""
    if op in _LIBM:
        if not dtype.is_float:
            raise RenderError(f"{op.value} needs a float operand, got {dtype.value}")
        return f"{_libm(op, dtype)}({x})"
    if op in _HELPER:
        return f"{_HELPER[op]}({x})"
    if op is Op.NEG:
        return f"(-{x})"
    if op is Op.LOGICAL_NOT:
        return f"(!{x})"
    if op is Op.ABS:
        return f"{_abs_name(dtype)}({x})"
    if op is Op.RELU:
        return f"sf_max({x}, static_cast<{C_TYPE[dtype]}>(0))"
    if op is Op.RECIPROCAL:
        return f"({float_literal(1.0, dtype)} / {x})"
    raise RenderError(f"unary op {op.value} has no CUDA rendering")


def binary_text(op: Op | ir.IndexOp, a: str, b: str, dtype: DType) -> str:
    """`a op b` where a and b are C text of math type `dtype`."""
    if op in INFIX:
        return f"({a} {INFIX[op]} {b})"
    if op in _HELPER:
        return f"{_HELPER[op]}({a}, {b})"
    if op is Op.POW:
        return f"{_libm(op, dtype)}({a}, {b})"
    raise RenderError(f"binary op {op.value} has no CUDA rendering")
