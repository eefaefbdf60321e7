"""Kernel IR expressions and plain statements rendered as C99 (+ gcc's `_Float16`).

Input: kernel IR expressions and the statements the lowering's value emitter produces
(Assign, Store, For, If, Comment; SIMT statements have no meaning on a CPU and are
refused), plus the loop bounds of the index variables the caller created. Output: C
text. Meanings follow `evaluate`: f16 and bf16 values are computed in float and
rounded to their type after every op (each node's value is one Assign), so a CAST to
an integer sees the value numpy would; float exp/log/log1p/tanh/erf are the vectorisable
`vmath` versions (1-2 ulp), not glibc's scalar calls; NaN propagates through MAXIMUM, MINIMUM and
RELU as numpy's do, and SIGMOID is evaluate's cancellation-free form. Storage: f16 as
`_Float16`, bf16 in float holding bf16 values (the project's numpy representation, so
no conversion copies), bool as 1-byte `uint8_t` holding 0 or 1 (numpy's layout) and read as
`!= 0`. A float SELECT is a bit select (`sf_sel_*`): gcc 12 leaves a ternary whose condition
comes from a bool array scalar (measured: dropout+layernorm 4x slower, branch misses on random
masks), and the bit select is exactly the chosen value, NaN payloads included.

Index math is simplified before rendering (`indexmath`), which keeps per-element div/mod out
of inner loops (what remains depends on the row only and is hoisted by the C compiler).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from importlib.resources import files

import numpy as np

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.kernel.syntax import INFIX, LIBM
from stitchfleet.compiler.targets.cpu import finite, vmath
from stitchfleet.compiler.targets.cpu.indexmath import simplify


class CRenderError(ValueError):
    """Kernel IR that has no C meaning here (a SIMT statement, a special index)."""


COMPUTE = {
    DType.F16: "float",
    DType.BF16: "float",
    DType.F32: "float",
    DType.F64: "double",
    DType.I32: "int32_t",
    DType.I64: "int64_t",
    DType.BOOL: "bool",
}
STORAGE = {**COMPUTE, DType.F16: "_Float16", DType.BOOL: "uint8_t"}


def exact_storage(dtype: DType) -> bool:
    """Whether a buffer of `dtype` holds a computed value bit for bit (storage type = compute type: no f16
    rounding, no bool as a byte to widen again)."""
    return STORAGE[dtype] == COMPUTE[dtype]


_SMALL_POWERS = (2.0, 3.0, 4.0)
_BIT_SELECTED = frozenset({"float", "double"})  # sf_sel_* exists for these

_CSRC = files(__package__).joinpath("csrc")
# includes, then vmath's functions, then the scalar helpers (they call sf_expf)
PRELUDE = (
    _CSRC.joinpath("includes.h").read_text(encoding="utf-8")
    + vmath.PRELUDE
    + _CSRC.joinpath("helpers.h").read_text(encoding="utf-8")
)

_HELPER = {Op.RELU: "relu", Op.SIGN: "sign", Op.ABS: "abs", Op.SIGMOID: "sigmoid"}


def _suffix(dtype: DType) -> str:
    return "f" if COMPUTE[dtype] == "float" else ""


def _float_text(value: float, dtype: DType) -> str:
    if math.isnan(value):
        return "NAN" if dtype is not DType.F64 else "((double)NAN)"
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        return f"({sign}INFINITY)" if dtype is not DType.F64 else f"({sign}(double)INFINITY)"
    if dtype is DType.F64:
        return f"({value!r})"
    return f"((float){value!r})"


def _rounded(value: float, dtype: DType) -> float:
    """The constant as its dtype holds it (evaluate casts a double constant to the node's type)."""
    if dtype is DType.F16:
        return float(np.float16(value))
    if dtype is DType.BF16:
        return float(round_bf16(np.array([value], dtype=np.float32))[0])
    if dtype is DType.F32:
        return float(np.float32(value))
    return float(value)


def const_text(value: float | int | bool, dtype: DType) -> str:
    """A C literal of `dtype` (float dtypes rounded to the dtype first)."""
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if dtype.is_float:
        return _float_text(_rounded(float(value), dtype), dtype)
    number = int(value)
    low = -(2**63) if dtype is DType.I64 else -(2**31)
    if number == low:
        return f"({number + 1}{'L' if dtype is DType.I64 else ''} - 1)"
    text = f"{number}L" if dtype is DType.I64 else f"((int32_t){number})"
    return f"({text})" if number < 0 else text


_PREFIX = {
    Op.NEG: "(-{x})",
    Op.LOGICAL_NOT: "(!{x})",
    Op.SQUARE: "({x} * {x})",
    Op.RSQRT: "(({t})1 / sqrt{f}({x}))",
    Op.RECIPROCAL: "(({t})1 / {x})",
}


def unary_text(op: Op, x: str, dtype: DType) -> str:
    ctype = COMPUTE[dtype]
    if op in _PREFIX:
        return _PREFIX[op].format(x=x, t=ctype, f=_suffix(dtype))
    if op in vmath.FUNCTIONS and ctype == "float":
        return f"{vmath.FUNCTIONS[op]}({x})"
    if op in LIBM:
        return f"{LIBM[op]}{_suffix(dtype)}({x})"
    if op in _HELPER:
        return f"sf_{_HELPER[op]}_{ctype}({x})"
    raise CRenderError(f"unary op {op.value} has no C rendering")


def binary_text(op: Op | k.IndexOp, a: str, b: str, dtype: DType) -> str:
    """`a op b` where both operands have `dtype` (the result's, comparisons aside)."""
    if op in INFIX:
        return f"({a} {INFIX[op]} {b})"
    if op is Op.POW:
        return f"pow{_suffix(dtype)}({a}, {b})"
    if op in (Op.MAXIMUM, Op.MINIMUM):
        return f"sf_{'max' if op is Op.MAXIMUM else 'min'}_{COMPUTE[dtype]}({a}, {b})"
    raise CRenderError(f"binary op {op} has no C rendering")


def cast_text(x: str, source: DType, target: DType) -> str:
    if target is DType.BOOL:
        return f"({x} != 0)"
    if target is DType.F16:
        return f"((float)(_Float16)({x}))"
    if target is DType.BF16:
        return f"sf_bf16((float)({x}))"
    return f"(({COMPUTE[target]})({x}))"


# ---- rendering -----------------------------------------------------------------------------


def load_text(buffer: k.AnyBuffer, index: str) -> str:
    text = f"{buffer.name}[{index}]"
    if buffer.dtype is DType.BOOL:
        return f"({text} != 0)"
    return f"((float){text})" if buffer.dtype is DType.F16 else text


def render(e: k.Expr, bounds: Mapping[str, int]) -> str:
    """C text of an expression (index math simplified first)."""
    return _render(simplify(e, bounds), bounds)


def _binary(e: k.Binary, bounds: Mapping[str, int]) -> str:
    if e.op is Op.POW and isinstance(e.b, k.Const) and e.b.value in _SMALL_POWERS and e.a.dtype.is_float:
        # x**2, x**3 (tanh-GELU), x**4 as products: libm's pow is a scalar call gcc cannot vectorise
        # (transformer GELU cluster 55 ms vs 32 ms in TF); within an ulp or two of pow
        return "(" + " * ".join([_render(e.a, bounds)] * int(e.b.value)) + ")"
    return binary_text(e.op, _render(e.a, bounds), _render(e.b, bounds), e.a.dtype)


def _render(e: k.Expr, bounds: Mapping[str, int]) -> str:
    if isinstance(e, k.Const | k.Var):
        return const_text(e.value, e.dtype) if isinstance(e, k.Const) else e.name
    if isinstance(e, k.Unary):
        return unary_text(e.op, _render(e.x, bounds), e.dtype)
    if isinstance(e, k.Binary):
        return _binary(e, bounds)
    if isinstance(e, k.Select):
        return select_text(_render(e.cond, bounds), _render(e.a, bounds), _render(e.b, bounds), e.dtype)
    if isinstance(e, k.Cast):
        return cast_text(_render(e.x, bounds), e.x.dtype, e.dtype)
    if isinstance(e, k.Load):
        return load_text(e.buffer, render(e.index, bounds))
    raise CRenderError(f"{type(e).__name__} {e} has no meaning in CPU code")


def select_text(cond: str, a: str, b: str, dtype: DType) -> str:
    kind = COMPUTE[dtype]
    return f"sf_sel_{kind}({cond}, {a}, {b})" if kind in _BIT_SELECTED else f"({cond} ? {a} : {b})"


def rounded(value: str, dtype: DType) -> str:
    """A computed value as its dtype holds it (f16/bf16 rounding; the rest as is)."""
    if dtype is DType.F16:
        return f"sf_f16({value})"
    if dtype is DType.BF16:
        return f"sf_bf16({value})"
    return value


def store_text(buffer: k.AnyBuffer, index: str, value: str) -> str:
    """The store; for a float output, inside the guard's NaN/Inf test of the stored value (`finite`)."""
    target = f"{buffer.name}[{index}]"
    stored = f"(_Float16)({value})" if buffer.dtype is DType.F16 else rounded(value, buffer.dtype)
    return finite.checked(buffer, STORAGE[buffer.dtype], target, stored) or f"{target} = {stored};"


def assigned(stmts: Iterable[k.Stmt]) -> list[k.Var]:
    """Variables assigned in `stmts` or their If branches (For bodies declare their own)."""
    out: dict[str, k.Var] = {}
    for s in stmts:
        if isinstance(s, k.Assign):
            out.setdefault(s.var.name, s.var)
        elif isinstance(s, k.If):
            for v in assigned((*s.then, *s.orelse)):
                out.setdefault(v.name, v)
    return list(out.values())


def block(stmts: Sequence[k.Stmt], bounds: Mapping[str, int], declared: frozenset[str], pad: str) -> list[str]:
    """C lines of a statement list; undeclared variables are declared first."""
    fresh = [v for v in assigned(stmts) if v.name not in declared]
    lines = [f"{pad}{COMPUTE[v.dtype]} {v.name};" for v in fresh]
    inner = declared | {v.name for v in fresh}
    for s in stmts:
        lines += statement(s, bounds, inner, pad)
    return lines


def statement(s: k.Stmt, bounds: Mapping[str, int], declared: frozenset[str], pad: str) -> list[str]:
    if isinstance(s, k.Assign):
        return [f"{pad}{s.var.name} = {rounded(render(s.value, bounds), s.var.dtype)};"]
    if isinstance(s, k.Store):
        return [pad + store_text(s.buffer, render(s.index, bounds), render(s.value, bounds))]
    if isinstance(s, k.If):
        lines = [f"{pad}if ({render(s.cond, bounds)}) {{", *block(s.then, bounds, declared, pad + "    ")]
        if s.orelse:
            lines += [f"{pad}}} else {{", *block(s.orelse, bounds, declared, pad + "    ")]
        return [*lines, f"{pad}}}"]
    if isinstance(s, k.For):
        v = s.var.name
        head = f"for (int64_t {v} = {render(s.start, bounds)}; {v} < {render(s.stop, bounds)}; {v} += "
        body = block(s.body, bounds, declared | {v}, pad + "    ")
        return [f"{pad}{head}{render(s.step, bounds)}) {{", *body, f"{pad}}}"]
    if isinstance(s, k.Comment):
        return [f"{pad}/* {s.text.replace('*/', '* /')} */"]
    raise CRenderError(f"{type(s).__name__} is a SIMT statement with no meaning in CPU code")
