"""evaluate: every op against numpy written by hand, precision modes, bf16/f16, input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stitchfleet.compiler.evaluate import (
    EvaluationError,
    InputError,
    evaluate,
    evaluate_nodes,
    random_inputs,
    round_bf16,
)
from stitchfleet.compiler.ir import GraphBuilder, Op
from stitchfleet.compiler.tolerance import DRAWS, LINEAR_SCALE, check

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 5)).astype(np.float32)
Y = RNG.standard_normal((3, 5)).astype(np.float32)
POS = np.abs(X) + 0.5

UNARY = {
    Op.NEG: lambda a: -a,
    Op.ABS: np.abs,
    Op.SQUARE: lambda a: a * a,
    Op.RELU: lambda a: np.where(a > 0, a, 0),
    Op.SIGN: np.sign,
    Op.FLOOR: np.floor,
    Op.CEIL: np.ceil,
    Op.EXP: np.exp,
    Op.TANH: np.tanh,
    Op.SIGMOID: lambda a: 1 / (1 + np.exp(-a.astype(np.float64))),
    Op.ERF: np.vectorize(math.erf),
}
POSITIVE_UNARY = {
    Op.LOG: np.log,
    Op.LOG1P: np.log1p,
    Op.SQRT: np.sqrt,
    Op.RSQRT: lambda a: 1 / np.sqrt(a),
    Op.RECIPROCAL: lambda a: 1 / a,
}
BINARY = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MAXIMUM: np.maximum,
    Op.MINIMUM: np.minimum,
    Op.GREATER: np.greater,
    Op.GREATER_EQUAL: np.greater_equal,
    Op.LESS: np.less,
    Op.LESS_EQUAL: np.less_equal,
    Op.EQUAL: np.equal,
    Op.NOT_EQUAL: np.not_equal,
}


def _run_unary(op: Op, data: np.ndarray, dtype: str = "f32", precision: str = "native") -> np.ndarray:
    b = GraphBuilder()
    b.output("out", b.unary(op, b.parameter("x", data.shape, dtype)))
    return evaluate(b.build(), {"x": data}, precision)["out"]  # type: ignore[arg-type]


@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op: Op) -> None:
    np.testing.assert_allclose(_run_unary(op, X), UNARY[op](X), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", list(POSITIVE_UNARY))
def test_unary_positive_domain(op: Op) -> None:
    np.testing.assert_allclose(_run_unary(op, POS), POSITIVE_UNARY[op](POS), rtol=1e-6)


@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op: Op) -> None:
    b = GraphBuilder()
    b.output("out", b.op(op, (b.parameter("x", X.shape), b.parameter("y", Y.shape))))
    same = Y.copy()
    same[0] = X[0]  # equal elements exercise EQUAL/GREATER_EQUAL ties
    got = evaluate(b.build(), {"x": X, "y": same})["out"]
    np.testing.assert_allclose(got, BINARY[op](X, same), rtol=1e-6)


def test_pow_select_logical_cast() -> None:
    b = GraphBuilder()
    x = b.parameter("x", POS.shape)
    y = b.parameter("y", Y.shape)
    gt = b.op(Op.GREATER, (x, y))
    b.output("pow", b.pow(x, y))
    b.output("select", b.select(gt, x, y))
    b.output("and", b.op(Op.LOGICAL_AND, (gt, b.op(Op.LOGICAL_NOT, (gt,)))))
    b.output("or", b.op(Op.LOGICAL_OR, (gt, b.op(Op.LOGICAL_NOT, (gt,)))))
    b.output("int", b.cast(b.mul(x, 3.0), "i32"))
    out = evaluate(b.build(), {"x": POS, "y": Y})
    np.testing.assert_allclose(out["pow"], POS**Y, rtol=1e-6)
    np.testing.assert_array_equal(out["select"], np.where(POS > Y, POS, Y))
    assert not out["and"].any()
    assert out["or"].all()
    np.testing.assert_array_equal(out["int"], np.trunc(POS * np.float32(3)).astype(np.int32))
    assert out["int"].dtype == np.int32


def test_data_movement_and_reductions() -> None:
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = GraphBuilder()
    x = b.parameter("x", data.shape)
    b.output("t", b.transpose(x, (2, 0, 1)))
    b.output("s", b.slice(x, (0, 1, 0), (2, 3, 4), (1, 1, 2)))
    b.output("c", b.concat([x, x], 2))
    b.output("r", b.reshape(x, (6, 4)))
    b.output("bc", b.broadcast(b.reduce_sum(x, (1,)), (2, 3, 4), (0, 2)))
    for op in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_MEAN, Op.REDUCE_PROD):
        b.output(op.value, b.reduce(op, x, (0, 2)))
    out = evaluate(b.build(), {"x": data})
    np.testing.assert_array_equal(out["t"], data.transpose(2, 0, 1))
    np.testing.assert_array_equal(out["s"], data[0:2, 1:3, 0:4:2])
    np.testing.assert_array_equal(out["c"], np.concatenate([data, data], 2))
    np.testing.assert_array_equal(out["r"], data.reshape(6, 4))
    np.testing.assert_array_equal(out["bc"], np.broadcast_to(data.sum(1, keepdims=True), data.shape))
    np.testing.assert_allclose(out["REDUCE_SUM"], data.sum((0, 2)))
    np.testing.assert_allclose(out["REDUCE_MAX"], data.max((0, 2)))
    np.testing.assert_allclose(out["REDUCE_MIN"], data.min((0, 2)))
    np.testing.assert_allclose(out["REDUCE_MEAN"], data.mean((0, 2)))
    np.testing.assert_allclose(out["REDUCE_PROD"], data.prod((0, 2)), rtol=1e-6)


def test_constants_and_integers() -> None:
    b = GraphBuilder()
    i = b.parameter("i", (2, 2), "i64")
    c = b.constant([[1, 2], [3, 4]], "i64")
    b.output("sum", b.add(i, c))
    b.output("splat", b.splat(2.5, (2, 3), "f32"))
    out = evaluate(b.build(), {"i": np.ones((2, 2), np.int64)})
    np.testing.assert_array_equal(out["sum"], [[2, 3], [4, 5]])
    assert out["sum"].dtype == np.int64
    np.testing.assert_array_equal(out["splat"], np.full((2, 3), 2.5, np.float32))


def test_float64_mode_computes_in_f64() -> None:
    data = (RNG.standard_normal(1000) * 100).astype(np.float32)
    b = GraphBuilder()
    b.output("y", b.reduce_sum(b.exp(b.mul(b.parameter("x", data.shape), 0.01)), (0,)))
    native = evaluate(b.build(), {"x": data})["y"]
    ref = evaluate(b.build(), {"x": data}, "float64")["y"]
    assert native.dtype == np.float32
    assert ref.dtype == np.float64
    expected = np.exp(data.astype(np.float64) * 0.01).sum()
    assert abs(ref - expected) < 1e-9 * abs(expected)
    assert abs(native - expected) < 1e-4 * abs(expected)


def test_f16_native_rounds_but_accumulates_in_f32() -> None:
    data = np.full(4096, 1.0, np.float16)
    b = GraphBuilder()
    x = b.parameter("x", data.shape, "f16")
    b.output("sum", b.reduce_sum(x, (0,)))
    b.output("third", b.div(x, 3.0))
    out = evaluate(b.build(), {"x": data})
    assert out["sum"].dtype == np.float16
    assert out["sum"] == 4096  # an f16 running sum would stall at 2048
    assert out["third"][0] == np.float16(1 / 3)
    ref = evaluate(b.build(), {"x": data}, "float64")
    assert ref["third"][0] == pytest.approx(1 / 3, abs=1e-15)


def test_bf16_is_rounded_after_every_op() -> None:
    assert round_bf16(np.array([1.0 + 2**-9], np.float32))[0] == 1.0  # ties to even
    assert round_bf16(np.array([1.0 + 3 * 2**-9], np.float32))[0] == 1.0 + 2**-7
    assert np.isnan(round_bf16(np.array([np.nan], np.float32))[0])
    assert np.isinf(round_bf16(np.array([3.4e38], np.float32))[0])
    data = np.array([1.0, 3.0], np.float32)
    b = GraphBuilder()
    b.output("y", b.div(b.parameter("x", (2,), "bf16"), 3.0))
    native = evaluate(b.build(), {"x": data})["y"]
    assert native.dtype == np.float32
    assert native[0] == round_bf16(np.array([1 / 3], np.float32))[0]
    assert native[0] != np.float32(1 / 3)
    assert evaluate(b.build(), {"x": data}, "float64")["y"][0] == pytest.approx(1 / 3, abs=1e-15)


def test_input_errors_name_the_input() -> None:
    b = GraphBuilder()
    b.output("y", b.exp(b.parameter("x", (2, 3), "f32")))
    graph = b.build()
    with pytest.raises(InputError, match=r"missing input.*x"):
        evaluate(graph, {})
    with pytest.raises(InputError, match=r"unexpected input.*zz"):
        evaluate(graph, {"x": np.zeros((2, 3), np.float32), "zz": 1})
    with pytest.raises(InputError, match=r"input .x.: shape \[3, 2\]"):
        evaluate(graph, {"x": np.zeros((3, 2), np.float32)})
    with pytest.raises(InputError, match="input 'x': dtype float64"):
        evaluate(graph, {"x": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="precision"):
        evaluate(graph, {"x": np.zeros((2, 3), np.float32)}, "f8")  # type: ignore[arg-type]


def test_opaque_ops() -> None:
    b = GraphBuilder()
    a = b.parameter("a", (2, 3))
    w = b.parameter("w", (3, 4))
    b.output("mm", b.opaque("MatMul", (a, w), (2, 4), "f32", "compute-intensive"))
    b.output("odd", b.opaque("Frob", (a,), (2, 3), "f32", "unsupported"))
    inputs = random_inputs(b.build())
    with pytest.raises(EvaluationError, match="'Frob' has no reference meaning"):
        evaluate(b.build(), inputs)
    b2 = GraphBuilder()
    a2, w2 = b2.parameter("a", (2, 3)), b2.parameter("w", (3, 4))
    b2.output("mm", b2.opaque("MatMul", (a2, w2), (2, 4), "f32", "compute-intensive"))
    out = evaluate(b2.build(), inputs)
    np.testing.assert_allclose(out["mm"], inputs["a"] @ inputs["w"], rtol=1e-6)


def test_evaluate_nodes_gives_every_value() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (2,))
    b.output("y", b.neg(x))
    values = evaluate_nodes(b.build(), {"x": np.array([1.0, 2.0], np.float32)})
    assert len(values) == 2
    np.testing.assert_array_equal(values[1], [-1.0, -2.0])


_CHAIN = [Op.EXP, Op.TANH, Op.SIGMOID, Op.SQUARE, Op.NEG, Op.ABS, Op.ADD, Op.MUL, Op.SUB]


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.sampled_from(_CHAIN), min_size=1, max_size=10), seed=st.integers(0, 1000))
def test_random_chains_native_close_to_f64(ops: list[Op], seed: int) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 6))
    y = b.parameter("y", (6,))
    value = b.tanh(x)
    for op in ops:
        value = b.binary(op, value, b.tanh(y)) if op in (Op.ADD, Op.MUL, Op.SUB) else b.unary(op, value)
        value = b.tanh(value) if op in (Op.EXP, Op.SQUARE) else value  # keep magnitudes bounded
    b.output("out", value)
    graph = b.build()
    inputs = random_inputs(graph, seed)
    native = evaluate(graph, inputs)["out"]
    ref = evaluate(graph, inputs, "float64")["out"]
    assert native.dtype == np.float32
    np.testing.assert_allclose(native, ref, rtol=1e-4, atol=1e-5)
    assert check(native, native, ref).ok


def test_sigmoid_keeps_relative_precision_for_negative_inputs() -> None:
    # regression: 1 - sigmoid(|x|) cancelled for negative x (found by the TF frontend check on an LSTM)
    b = GraphBuilder()
    b.output("y", b.sigmoid(b.parameter("x", (6,), "f32")))
    graph = b.build()
    x = np.array([-30.0, -17.0, -10.0, -4.5, 0.0, 12.0], np.float32)
    native, exact = evaluate(graph, {"x": x})["y"], evaluate(graph, {"x": x}, "float64")["y"]
    assert np.all(np.abs(native - exact) <= 8 * 2**-24 * np.abs(exact))  # a few roundings, no cancellation


def test_noise_perturbs_floating_inputs_by_one_roundoff_reproducibly() -> None:
    """The reference on inputs one rounding away (tolerance.py's backward-stability allowance)."""
    b = GraphBuilder()
    x, k, h = b.parameter("x", (3, 5)), b.parameter("k", (3, 5), "i32"), b.parameter("h", (3, 5), "f16")
    b.output("x", b.mul(x, 1.0))
    b.output("k", b.mul(k, 1))
    b.output("h", b.mul(h, 1.0))
    graph = b.build()
    inputs = {"x": X, "k": np.arange(15, dtype=np.int32).reshape(3, 5), "h": POS.astype(np.float16)}
    exact = evaluate(graph, inputs, "float64")
    noisy = evaluate(graph, inputs, "float64", noise=0)
    assert noisy["x"].dtype == np.float64
    relative = np.abs(noisy["x"] / exact["x"] - 1)
    assert 0 < relative.max() <= 2.0**-24 and np.count_nonzero(relative) == X.size
    assert 2.0**-24 < np.abs(noisy["h"] / exact["h"] - 1).max() <= 2.0**-11  # f16 inputs: f16's roundoff
    np.testing.assert_array_equal(noisy["k"], exact["k"])  # integers are never perturbed
    np.testing.assert_array_equal(evaluate(graph, inputs, "float64", noise=0)["x"], noisy["x"])
    assert not np.array_equal(evaluate(graph, inputs, "float64", noise=1)["x"], noisy["x"])
    with pytest.raises(ValueError, match="float64 reference only"):
        evaluate(graph, inputs, noise=0)


def test_a_twin_draw_has_its_draws_direction_at_a_fraction_of_the_amplitude() -> None:
    """tolerance.noise_of: draw DRAWS + k moves every input LINEAR_SCALE as far as draw k, the same way."""
    b = GraphBuilder()
    b.output("x", b.mul(b.parameter("x", (3, 5)), 1.0))
    graph = b.build()
    exact = evaluate(graph, {"x": X}, "float64")["x"]
    for draw in range(DRAWS):
        moved = evaluate(graph, {"x": X}, "float64", noise=draw)["x"] - exact
        twin = evaluate(graph, {"x": X}, "float64", noise=DRAWS + draw)["x"] - exact
        np.testing.assert_allclose(twin, LINEAR_SCALE * moved, rtol=1e-6)
    with pytest.raises(ValueError, match="not one of the"):
        evaluate(graph, {"x": X}, "float64", noise=2 * DRAWS)


def test_float32_precision_holds_every_float_in_float32() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (3, 4), "f64")
    b.output("s", b.reduce_sum(b.mul(x, x), (0,)))
    values = np.arange(12, dtype=np.float64).reshape(3, 4) / 3.0
    low = evaluate(b.build(), {"x": values}, "float32")["s"]
    assert low.dtype == np.float32
    np.testing.assert_array_equal(low, np.sum(np.square(values.astype(np.float32)), axis=0, dtype=np.float32))


def test_storage_precision_sums_float16_in_float16() -> None:
    b = GraphBuilder()
    b.output("s", b.reduce_sum(b.parameter("x", (64, 8), "f16"), (0,)))
    values = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float16)
    graph = b.build()
    stored = evaluate(graph, {"x": values}, "storage")["s"]
    assert stored.dtype == np.float16
    np.testing.assert_array_equal(stored, np.sum(values, axis=0, dtype=np.float16))
    native = evaluate(graph, {"x": values})["s"]  # float32 accumulation, rounded once
    np.testing.assert_array_equal(native, np.sum(values, axis=0, dtype=np.float32).astype(np.float16))
