"""Lowering rules for TF's piecewise activations (Relu6, Elu, LeakyRelu, Selu, Softplus) and their grads.

Input: a `Site` (one TF op with its IR operands). Output: the IR values of its outputs. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

import math

from stitchfleet.compiler.ir import DType, Op, Value
from stitchfleet.plugin.frontend.context import Rule, Site

# TF's constants for SELU (selu_op_functor in relu_op_functor.h)
SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717
# machine epsilon per type, as Eigen's NumTraits<T>::epsilon() that softplus' threshold uses
EPSILON = {DType.F16: 2.0**-10, DType.BF16: 2.0**-7, DType.F32: 2.0**-23, DType.F64: 2.0**-52}


def _expm1(site: Site, x: Value) -> Value:
    """exp(x) - 1 without the cancellation near 0 (Kahan: (u - 1) * x / log(u), u = exp(x)); TF uses expm1."""
    b = site.b
    u = b.exp(x)
    near_zero = b.binary(Op.EQUAL, u, 1.0)
    # where u == 1 the quotient is 0/0; select keeps x there, the IR's select is element-wise
    return b.select(near_zero, x, (u - 1.0) * x / b.log(u))


def _relu6(site: Site) -> list[Value]:
    b = site.b
    return [b.minimum(b.maximum(site.value(0), 0.0), 6.0)]


def _relu6_grad(site: Site) -> list[Value]:
    b = site.b
    grad, features = site.value(0), site.value(1)
    inside = b.binary(Op.LOGICAL_AND, b.binary(Op.GREATER, features, 0.0), b.binary(Op.LESS, features, 6.0))
    return [b.select(inside, grad, 0.0)]


def _elu(site: Site) -> list[Value]:
    b = site.b
    x = site.value(0)
    return [b.select(b.binary(Op.LESS, x, 0.0), _expm1(site, x), x)]


def _elu_grad(site: Site) -> list[Value]:
    b = site.b
    grad, outputs = site.value(0), site.value(1)
    return [b.select(b.binary(Op.LESS, outputs, 0.0), grad * (outputs + 1.0), grad)]


def _alpha(site: Site) -> float:
    return site.number("alpha", 0.2)


def _leaky_relu(site: Site) -> list[Value]:
    b = site.b
    x = site.value(0)
    return [b.select(b.binary(Op.GREATER, x, 0.0), x, x * _alpha(site))]


def _leaky_relu_grad(site: Site) -> list[Value]:
    b = site.b
    grad, features = site.value(0), site.value(1)
    return [b.select(b.binary(Op.GREATER, features, 0.0), grad, grad * _alpha(site))]


def _selu(site: Site) -> list[Value]:
    b = site.b
    x = site.value(0)
    return [b.select(b.binary(Op.LESS, x, 0.0), _expm1(site, x) * (SELU_SCALE * SELU_ALPHA), x * SELU_SCALE)]


def _selu_grad(site: Site) -> list[Value]:
    b = site.b
    grad, outputs = site.value(0), site.value(1)
    negative = grad * (outputs + SELU_SCALE * SELU_ALPHA)
    return [b.select(b.binary(Op.LESS, outputs, 0.0), negative, grad * SELU_SCALE)]


def _softplus(site: Site) -> list[Value]:
    """TF's softplus: x where exp(x) would overflow the log1p, exp(x) where 1 + exp(x) rounds to 1."""
    b = site.b
    x = site.value(0)
    threshold = math.log(EPSILON[x.dtype]) + 2.0
    x_exp = b.exp(x)
    small = b.select(b.binary(Op.LESS, x, threshold), x_exp, b.unary(Op.LOG1P, x_exp))
    return [b.select(b.binary(Op.GREATER, x, -threshold), x, small)]


def _softplus_grad(site: Site) -> list[Value]:
    b = site.b
    grad, features = site.value(0), site.value(1)
    return [grad * b.sigmoid(features)]


RULES: dict[str, Rule] = {
    "Relu6": _relu6,
    "Relu6Grad": _relu6_grad,
    "Elu": _elu,
    "EluGrad": _elu_grad,
    "LeakyRelu": _leaky_relu,
    "LeakyReluGrad": _leaky_relu_grad,
    "Selu": _selu,
    "SeluGrad": _selu_grad,
    "Softplus": _softplus,
    "SoftplusGrad": _softplus_grad,
}
