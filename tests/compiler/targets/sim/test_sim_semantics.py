"""Sim math means what the graph IR means (checked against `evaluate`), plus C integer and cast rules."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.evaluate import Precision, evaluate, round_bf16
from stitchfleet.compiler.ir import DType, GraphBuilder, Op
from stitchfleet.compiler.ir.types import BINARY_ELEMENTWISE, LOGICAL, UNARY_ELEMENTWISE
from stitchfleet.compiler.kernel import (
    Binary,
    Buffer,
    Cast,
    Expr,
    Kernel,
    Launch,
    Load,
    Role,
    Select,
    Store,
    Unary,
    Var,
    blocks,
    const,
    i64,
    lt,
    mod,
)
from stitchfleet.compiler.targets.sim.interpreter import run
from stitchfleet.compiler.tolerance import check

N = 300
Array = npt.NDArray[Any]
IDX = Var("i", DType.I64)


def _map(expr_of: Any, inputs: dict[str, Array], out_dtype: DType, in_dtype: DType = DType.F32) -> Array:
    """Runs y[i] = expr_of(x[i], z[i]) over N elements with a grid-stride loop."""
    x, z = Buffer("x", in_dtype, N, Role.INPUT), Buffer("z", in_dtype, N, Role.INPUT)
    y = Buffer("y", out_dtype, N, Role.OUTPUT)
    body = (Store(y, IDX, expr_of(Load(x, IDX), Load(z, IDX))),)
    kernel = Kernel("map", (x, z, y), (), Launch(2, 64, 4), (blocks.grid_stride_loop(IDX, i64(N), body),))
    return run([kernel], inputs)["y"]


def _graph_result(op: Op, arrays: list[Array], precision: Precision = "native") -> Array:
    """What the graph IR reference says `op` gives on these f32 arrays."""
    b = GraphBuilder()
    params = [b.parameter(name, (N,), "f32") for name in ("x", "z")[: len(arrays)]]
    b.output("out", b.op(op, tuple(params)))
    return evaluate(b.build(), dict(zip(("x", "z"), arrays, strict=False)), precision)["out"]


RNG = np.random.default_rng(11)
X = RNG.uniform(0.2, 3.0, N).astype(np.float32)
Z = RNG.uniform(-2.0, 2.0, N).astype(np.float32)
FLOAT_UNARY = sorted((UNARY_ELEMENTWISE - LOGICAL) - {Op.CAST}, key=lambda o: o.value)
FLOAT_BINARY = sorted(BINARY_ELEMENTWISE - LOGICAL, key=lambda o: o.value)


@pytest.mark.parametrize("op", FLOAT_UNARY, ids=lambda o: o.value)
def test_unary_matches_evaluate(op: Op) -> None:
    got = _map(lambda a, b: Unary(op, a), {"x": X, "z": Z}, DType.F32)
    output_check = check(got, _graph_result(op, [X]), _graph_result(op, [X], "float64"))
    assert output_check.ok, output_check.reason


@pytest.mark.parametrize("op", FLOAT_BINARY, ids=lambda o: o.value)
def test_binary_matches_evaluate(op: Op) -> None:
    out_dtype = (
        DType.BOOL
        if op.value in {"GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOT_EQUAL"}
        else DType.F32
    )
    got = _map(lambda a, b: Binary(op, a, b), {"x": X, "z": Z}, out_dtype)
    output_check = check(got, _graph_result(op, [X, Z]), _graph_result(op, [X, Z], "float64"))
    assert output_check.ok, output_check.reason


def test_integer_div_and_mod_truncate_toward_zero_like_c() -> None:
    a = np.resize(np.arange(-7, 8, dtype=np.int64), N)
    d = np.resize(np.array([3, -3, 2, 5], dtype=np.int64), N)
    inputs = {"x": a, "z": d}
    quotient = _map(lambda p, q: Binary(Op.DIV, p, q), inputs, DType.I64, DType.I64)
    remainder = _map(mod, inputs, DType.I64, DType.I64)
    assert np.array_equal(quotient, np.fix(a / d).astype(np.int64))
    assert np.array_equal(remainder, a - np.fix(a / d).astype(np.int64) * d)


def test_casts_follow_c_and_bf16_storage() -> None:
    values = np.resize(np.array([-2.7, -0.5, 0.0, 0.4, 1.9, 3.2e38], dtype=np.float32), N)
    inputs = {"x": values, "z": values}
    assert np.array_equal(_map(lambda a, b: Cast(a, DType.I32), inputs, DType.I32)[:5], [-2, 0, 0, 0, 1])
    assert np.array_equal(_map(lambda a, b: Cast(a, DType.BOOL), inputs, DType.BOOL), values != 0)
    bf16 = _map(lambda a, b: Cast(Cast(a, DType.BF16), DType.F32), inputs, DType.F32)
    assert np.array_equal(bf16, round_bf16(values))


def test_f16_buffers_round_trip_through_f32_math() -> None:
    values = RNG.standard_normal(N).astype(np.float16)

    def doubled(a: Expr, b: Expr) -> Expr:
        return Cast(Binary(Op.MUL, Cast(a, DType.F32), const(2, DType.F32)), DType.F16)

    got = _map(doubled, {"x": values, "z": values}, DType.F16, DType.F16)
    assert got.dtype == np.float16 and np.array_equal(got, values * np.float16(2))


def test_select_evaluates_only_the_chosen_side() -> None:
    """A guarded load past the end is never executed, as with C's `?:`."""
    shifted = _map(
        lambda a, b: Select(
            lt(IDX, i64(N - 1)),
            Load(Buffer("x", DType.F32, N, Role.INPUT), Binary(Op.ADD, IDX, i64(1))),
            const(-1, DType.F32),
        ),
        {"x": X, "z": Z},
        DType.F32,
    )
    assert np.array_equal(shifted[:-1], X[1:]) and shifted[-1] == -1
