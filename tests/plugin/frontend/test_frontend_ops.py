"""Every supported TF op, forward and gradient: the converted IR evaluates to TF's own results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import tensorflow as tf

from tests.plugin.tf_harness import check

pytestmark = pytest.mark.tf

P = tf.compat.v1.placeholder


def _xy(fn: Callable[[Any, Any], Any], dtype: Any = tf.float32) -> Callable[[], tuple[list[Any], Any]]:
    def build() -> tuple[list[Any], Any]:
        x, y = P(dtype, [3, 5], name="x"), P(dtype, [3, 5], name="y")
        return [x, y], fn(x, y)

    return build


def _xr(fn: Callable[[Any, Any], Any]) -> Callable[[], tuple[list[Any], Any]]:
    """x is a matrix, r a row vector: TF broadcasts r implicitly."""

    def build() -> tuple[list[Any], Any]:
        x, r = P(tf.float32, [3, 5], name="x"), P(tf.float32, [5], name="r")
        return [x, r], fn(x, r)

    return build


def _pos(x: Any) -> Any:
    return tf.abs(x) + 0.25


# (case id, builder, TF op types that must all be lowered)
CASES: list[tuple[str, Callable[[], tuple[list[Any], Any]], set[str]]] = [
    ("AddV2", _xr(lambda x, r: x + r), {"AddV2"}),
    ("Add", _xy(lambda x, y: tf.raw_ops.Add(x=x, y=y)), {"Add"}),
    ("Sub", _xr(lambda x, r: x - r), {"Sub"}),
    ("Mul", _xy(lambda x, y: x * y), {"Mul"}),
    ("RealDiv", _xy(lambda x, y: x / _pos(y)), {"RealDiv"}),
    ("DivNoNan", _xy(lambda x, y: tf.math.divide_no_nan(x, tf.nn.relu(y))), {"DivNoNan"}),
    ("Neg", _xy(lambda x, y: -x * y), {"Neg"}),
    ("Square", _xy(lambda x, y: tf.square(x)), {"Square"}),
    ("SquaredDifference", _xr(tf.math.squared_difference), {"SquaredDifference"}),
    ("Sqrt", _xy(lambda x, y: tf.sqrt(_pos(x))), {"Sqrt", "SqrtGrad"}),
    ("Rsqrt", _xy(lambda x, y: tf.math.rsqrt(_pos(x))), {"Rsqrt", "RsqrtGrad"}),
    ("Exp", _xy(lambda x, y: tf.exp(x)), {"Exp"}),
    ("Log", _xy(lambda x, y: tf.math.log(_pos(x))), {"Log"}),
    ("Log1p", _xy(lambda x, y: tf.math.log1p(_pos(x))), {"Log1p"}),
    ("Tanh", _xy(lambda x, y: tf.tanh(x)), {"Tanh", "TanhGrad"}),
    ("Sigmoid", _xy(lambda x, y: tf.sigmoid(x)), {"Sigmoid", "SigmoidGrad"}),
    ("Relu", _xy(lambda x, y: tf.nn.relu(x)), {"Relu", "ReluGrad"}),
    ("Erf", _xy(lambda x, y: tf.math.erf(x)), {"Erf"}),
    ("Pow", _xy(lambda x, y: tf.pow(_pos(x), y)), {"Pow"}),
    ("Maximum", _xy(tf.maximum), {"Maximum"}),
    ("Minimum", _xr(tf.minimum), {"Minimum"}),
    ("Cast", _xy(lambda x, y: tf.cast(tf.cast(x, tf.float64) * 3.0, tf.float32)), {"Cast"}),
    ("Select", _xy(lambda x, y: tf.raw_ops.Select(condition=x > y, x=x, y=y * 2.0)), {"Select", "Greater"}),
    ("SelectV2", _xr(lambda x, r: tf.where(x > r, x, 0.5 * r)), {"SelectV2"}),
    ("Greater", _xy(lambda x, y: tf.cast(tf.greater(x, y), tf.float32) * x), {"Greater"}),
    ("GreaterEqual", _xy(lambda x, y: tf.cast(tf.greater_equal(x, y), tf.float32) * x), {"GreaterEqual"}),
    ("Less", _xy(lambda x, y: tf.cast(tf.less(x, y), tf.float32) * x), {"Less"}),
    ("LessEqual", _xy(lambda x, y: tf.cast(tf.less_equal(x, y), tf.float32) * x), {"LessEqual"}),
    ("Equal", _xy(lambda x, y: tf.cast(tf.equal(tf.sign(x), tf.sign(y)), tf.float32) * y), {"Equal", "Sign"}),
    ("NotEqual", _xy(lambda x, y: tf.cast(tf.not_equal(tf.floor(x), tf.math.ceil(y)), tf.float32) * y), {"NotEqual"}),
    (
        "Logical",
        _xy(lambda x, y: tf.cast(tf.logical_or(tf.logical_and(x > 0, y > 0), tf.logical_not(x > y)), tf.float32) * x),
        {"LogicalAnd", "LogicalOr", "LogicalNot"},
    ),
    ("Sum", _xy(lambda x, y: tf.reduce_sum(x * y, axis=1)), {"Sum"}),
    ("SumKeepDims", _xy(lambda x, y: tf.reduce_sum(x, axis=0, keepdims=True) * y), {"Sum"}),
    ("Mean", _xy(lambda x, y: tf.reduce_mean(x * y, axis=-1, keepdims=True)), {"Mean"}),
    ("Max", _xy(lambda x, y: tf.reduce_max(x, axis=1)), {"Max"}),
    ("Min", _xy(lambda x, y: tf.reduce_min(x + y, axis=0)), {"Min"}),
    ("Prod", _xy(lambda x, y: tf.reduce_prod(_pos(x), axis=1)), {"Prod"}),
    ("Reshape", _xy(lambda x, y: tf.reshape(x * y, [5, -1])), {"Reshape"}),
    ("ExpandDims", _xy(lambda x, y: tf.expand_dims(x, 1) * tf.expand_dims(y, 0)), {"ExpandDims"}),
    ("Squeeze", _xr(lambda x, r: tf.squeeze(tf.reshape(x, [3, 1, 5]), axis=1) * r), {"Squeeze"}),
    ("Tile", _xr(lambda x, r: tf.tile(x, [2, 3]) + tf.tile(tf.reshape(r, [1, 5]), [6, 3])), {"Tile"}),
    ("BroadcastTo", _xr(lambda x, r: tf.broadcast_to(r, [3, 5]) * x), {"BroadcastTo"}),
    ("Fill", _xy(lambda x, y: tf.fill([3, 5], tf.reduce_sum(x)) * y), {"Fill"}),
    (
        "ZerosLike",
        _xy(lambda x, y: x + tf.raw_ops.ZerosLike(x=y) * y + tf.raw_ops.OnesLike(x=y)),
        {"ZerosLike", "OnesLike"},
    ),
    ("Identity", _xy(lambda x, y: tf.identity(x) * tf.stop_gradient(y)), set()),
    ("AddN", _xy(lambda x, y: tf.add_n([x, y, x * y])), {"AddN"}),
    ("Transpose", _xr(lambda x, r: tf.transpose(x * r)), {"Transpose"}),
    ("StridedSlice", _xy(lambda x, y: x[1:, ::2] * y[:2, 1:4]), {"StridedSlice"}),
    ("StridedSliceShrink", _xy(lambda x, y: x[:, 1] * y[..., -1] + x[None, 0, 3]), {"StridedSlice"}),
    (
        "Slice",
        _xy(lambda x, y: tf.slice(x, [1, 0], [2, -1]) * tf.slice(y, [0, 1], [2, 5 - 1])[:, 0:1]),
        {"Slice", "Pad"},
    ),
    (
        "Pad",
        _xy(lambda x, y: tf.pad(x * y, [[1, 0], [2, 3]]) + tf.pad(x, [[0, 1], [0, 5]], constant_values=2.0)),
        {"Pad", "PadV2"},
    ),
    ("ConcatV2", _xr(lambda x, r: tf.concat([x, tf.reshape(r, [1, 5]), x * 2.0], axis=0)), {"ConcatV2"}),
    ("Pack", _xy(lambda x, y: tf.stack([x, y * x], axis=1)), {"Pack"}),
    ("Split", _xy(lambda x, y: sum(tf.split(x * y, [2, 3], axis=1)[i] for i in (1,)) * 1.0), {"SplitV"}),
    ("SplitEven", _xy(lambda x, y: tf.split(tf.concat([x, y], 1), 2, axis=1)[0] * 2.0), {"Split"}),
    ("Unpack", _xy(lambda x, y: tf.unstack(x, axis=0)[1] * tf.unstack(y, axis=1)[2][1]), {"Unpack"}),
    ("Softmax", _xy(lambda x, y: tf.nn.softmax(x * y)), {"Softmax"}),
    ("LogSoftmax", _xy(lambda x, y: tf.nn.log_softmax(x)), {"LogSoftmax"}),
    (
        "SoftmaxXent",
        _xy(lambda x, y: tf.nn.softmax_cross_entropy_with_logits(labels=tf.nn.softmax(y), logits=x)),
        {"SoftmaxCrossEntropyWithLogits"},
    ),
    ("L2Loss", _xy(lambda x, y: tf.nn.l2_loss(x * y) * tf.ones([2])), {"L2Loss"}),
    ("Softmax_f16", _xy(lambda x, y: tf.nn.softmax(x * y), tf.float16), {"Softmax"}),
    ("Mul_f64", _xy(lambda x, y: tf.tanh(x) * y, tf.float64), {"Mul", "Tanh"}),
    ("Mul_bf16", _xy(lambda x, y: tf.nn.relu(x) * y + x, tf.bfloat16), {"Mul", "Relu"}),
    ("Div", _xy(lambda x, y: tf.raw_ops.Div(x=x, y=_pos(y))), {"Div"}),
    ("Relu6", _xy(lambda x, y: tf.nn.relu6(x * 4.0)), {"Relu6", "Relu6Grad"}),
    ("Elu", _xy(lambda x, y: tf.nn.elu(x)), {"Elu", "EluGrad"}),
    ("Elu_small", _xy(lambda x, y: tf.nn.elu(x * 1e-4)), {"Elu", "EluGrad"}),
    ("LeakyRelu", _xy(lambda x, y: tf.nn.leaky_relu(x, alpha=0.3)), {"LeakyRelu", "LeakyReluGrad"}),
    ("Selu", _xy(lambda x, y: tf.nn.selu(x)), {"Selu", "SeluGrad"}),
    ("Softplus", _xy(lambda x, y: tf.nn.softplus(x * 20.0)), {"Softplus"}),
    ("Softplus_f64", _xy(lambda x, y: tf.nn.softplus(x * 40.0), tf.float64), {"Softplus"}),
    # TF differentiates Softplus with a Sigmoid; its grad op still appears in older graphs
    ("SoftplusGrad", _xy(lambda x, y: tf.raw_ops.SoftplusGrad(gradients=y, features=x * 5.0)), {"SoftplusGrad"}),
    ("IdentityN", _xy(lambda x, y: tf.identity_n([x * y, y])[0] * 2.0), set()),
]


def _bias(fmt: str) -> Callable[[], tuple[list[Any], Any]]:
    def build() -> tuple[list[Any], Any]:
        shape = [2, 4, 3, 3] if fmt == "NCHW" else [2, 3, 3, 4]
        x, bias = P(tf.float32, shape, name="x"), P(tf.float32, [4], name="bias")
        return [x, bias], tf.nn.bias_add(x, bias, data_format=fmt)

    return build


CASES += [("BiasAdd_NHWC", _bias("NHWC"), {"BiasAdd", "BiasAddGrad"}), ("BiasAdd_NCHW", _bias("NCHW"), {"BiasAdd"})]


# TF ops of a gradient that have no IR meaning (cumulative products) stay boundaries
ALLOWED = {"Prod": {"Cumprod"}}


@pytest.mark.parametrize(("case", "build", "lowered"), [pytest.param(n, b, t, id=n) for n, b, t in CASES])
def test_op_and_its_gradient_match_tensorflow(
    case: str, build: Callable[[], tuple[list[Any], Any]], lowered: set[str]
) -> None:
    checked = check(build)
    checked.assert_ok()
    for name, disposition in checked.conversion.ops.items():
        if disposition.op_type in lowered:
            assert disposition.fate in ("lowered", "folded"), (name, disposition)
    assert lowered <= checked.types("lowered")
    # the whole forward and backward graph is IR: only the inputs are boundaries
    boundaries = {n: d for n, d in checked.conversion.ops.items() if d.fate == "boundary"}
    assert {d.op_type for d in boundaries.values()} <= {"Placeholder", *ALLOWED.get(case, ())}, boundaries
    assert checked.values.checked >= 3
