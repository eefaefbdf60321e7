"""Lowering rules for TF's element-wise ops, forward and gradient.

Input: a `Site` (one TF op with its IR operands). Output: the IR values of its outputs. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

from functools import reduce

from stitchfleet.compiler.ir import DType, Op, Value
from stitchfleet.plugin.frontend.context import LoweringError, Rule, Site

UNARY: dict[str, Op] = {
    "Neg": Op.NEG,
    "Abs": Op.ABS,
    "Square": Op.SQUARE,
    "Sqrt": Op.SQRT,
    "Rsqrt": Op.RSQRT,
    "Exp": Op.EXP,
    "Log": Op.LOG,
    "Log1p": Op.LOG1P,
    "Tanh": Op.TANH,
    "Sigmoid": Op.SIGMOID,
    "Relu": Op.RELU,
    "Erf": Op.ERF,
    "Sign": Op.SIGN,
    "Floor": Op.FLOOR,
    "Ceil": Op.CEIL,
    "Reciprocal": Op.RECIPROCAL,
    "Inv": Op.RECIPROCAL,
    "LogicalNot": Op.LOGICAL_NOT,
}
BINARY: dict[str, Op] = {
    "Add": Op.ADD,
    "AddV2": Op.ADD,
    "Sub": Op.SUB,
    "Mul": Op.MUL,
    "RealDiv": Op.DIV,
    "Div": Op.DIV,
    "Pow": Op.POW,
    "Maximum": Op.MAXIMUM,
    "Minimum": Op.MINIMUM,
    "Greater": Op.GREATER,
    "GreaterEqual": Op.GREATER_EQUAL,
    "Less": Op.LESS,
    "LessEqual": Op.LESS_EQUAL,
    "Equal": Op.EQUAL,
    "NotEqual": Op.NOT_EQUAL,
    "LogicalAnd": Op.LOGICAL_AND,
    "LogicalOr": Op.LOGICAL_OR,
}


def _unary(site: Site) -> list[Value]:
    return [site.b.unary(UNARY[site.type], site.value(0))]


def _binary(site: Site) -> list[Value]:
    op = BINARY[site.type]
    x, y = site.value(0), site.value(1)
    if op is Op.DIV and not x.dtype.is_float:
        # TF's integer Div truncates; the IR's DIV is defined on floats only.
        raise LoweringError(f"integer division ({x.dtype.value})")
    return [site.b.binary(op, x, y)]


def _squared_difference(site: Site) -> list[Value]:
    b = site.b
    return [b.square(b.sub(site.value(0), site.value(1)))]


def _div_no_nan(site: Site) -> list[Value]:
    b = site.b
    x, y = site.value(0), site.value(1)
    quotient = b.div(x, y)
    y_full = b.broadcast_to(y, quotient.shape)
    return [b.select(b.binary(Op.EQUAL, y_full, 0.0), 0.0, quotient)]


def _relu_grad(site: Site) -> list[Value]:
    b = site.b
    grad, features = site.value(0), site.value(1)
    return [b.select(b.binary(Op.GREATER, features, 0.0), grad, 0.0)]


def _tanh_grad(site: Site) -> list[Value]:
    y, dy = site.value(0), site.value(1)
    return [dy * (1.0 - y * y)]


def _sigmoid_grad(site: Site) -> list[Value]:
    y, dy = site.value(0), site.value(1)
    return [dy * y * (1.0 - y)]


def _rsqrt_grad(site: Site) -> list[Value]:
    y, dy = site.value(0), site.value(1)
    return [(dy * (y * y * y)) * -0.5]


def _sqrt_grad(site: Site) -> list[Value]:
    y, dy = site.value(0), site.value(1)
    return [(dy * 0.5) / y]


def _reciprocal_grad(site: Site) -> list[Value]:
    y, dy = site.value(0), site.value(1)
    return [-(dy * (y * y))]


def _cast(site: Site) -> list[Value]:
    return [site.b.cast(site.value(0), site.out.dtype)]


def _select(site: Site) -> list[Value]:
    b = site.b
    cond, then, other = site.values()
    if site.type == "Select" and len(cond.shape) == 1 and len(then.shape) > 1:
        # v1 Select: a vector condition picks whole rows of the branches.
        cond = b.broadcast(cond, then.shape, (0,))
    return [b.select(cond, then, other)]


def _add_n(site: Site) -> list[Value]:
    return [reduce(site.b.add, site.values())]


def _bias_axis(site: Site, rank: int) -> int:
    fmt = site.attr("data_format", b"NHWC")
    text = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    return 1 if text.startswith("NC") and rank > 2 else rank - 1


def _bias_add(site: Site) -> list[Value]:
    x, bias = site.value(0), site.value(1)
    axis = _bias_axis(site, len(x.shape))
    return [site.b.add(x, site.b.broadcast(bias, x.shape, (axis,)))]


def _bias_add_grad(site: Site) -> list[Value]:
    grad = site.value(0)
    rank = len(grad.shape)
    axis = _bias_axis(site, rank)
    return [site.b.reduce_sum(grad, tuple(i for i in range(rank) if i != axis))]


def _l2_loss(site: Site) -> list[Value]:
    b = site.b
    squares = b.square(site.value(0))
    total = b.reduce_sum(squares, tuple(range(len(squares.shape)))) if squares.shape else squares
    return [total * 0.5]


def _bool_guard(rule: Rule) -> Rule:
    """Arithmetic on bool tensors has no IR meaning; say so instead of failing in the builder."""

    def guarded(site: Site) -> list[Value]:
        if any(a.dtype is DType.BOOL for a in site.args) and site.type not in _BOOL_OK:
            raise LoweringError(f"{site.type} on bool tensors")
        return rule(site)

    return guarded


_BOOL_OK = frozenset({"LogicalNot", "LogicalAnd", "LogicalOr", "Equal", "NotEqual", "Cast", "Select", "SelectV2"})

RULES: dict[str, Rule] = {
    **dict.fromkeys(UNARY, _unary),
    **dict.fromkeys(BINARY, _binary),
    "SquaredDifference": _squared_difference,
    "DivNoNan": _div_no_nan,
    "ReluGrad": _relu_grad,
    "TanhGrad": _tanh_grad,
    "SigmoidGrad": _sigmoid_grad,
    "RsqrtGrad": _rsqrt_grad,
    "SqrtGrad": _sqrt_grad,
    "ReciprocalGrad": _reciprocal_grad,
    "InvGrad": _reciprocal_grad,
    "Cast": _cast,
    "Select": _select,
    "SelectV2": _select,
    "AddN": _add_n,
    "BiasAdd": _bias_add,
    "BiasAddV1": _bias_add,
    "BiasAddGrad": _bias_add_grad,
    "L2Loss": _l2_loss,
}
RULES = {name: _bool_guard(rule) for name, rule in RULES.items()}
