"""The generated code's vectorised float functions (compiler/targets/cpu/vmath.py) against numpy in float64.

Each function runs as a one-op cluster through the real cpu backend over about two million
inputs: a dense sweep of its interesting range, random floats of every exponent, and the
special values (signed zeros, infinities, NaN, subnormals, overflow and underflow edges).
Error is measured in float32 ulps of the float64 reference rounded to float32; the bound
per function is the accuracy contract stated in vmath's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import GraphBuilder, Op
from stitchfleet.compiler.targets.cpu.executable import compile_cluster

Array = npt.NDArray[Any]

SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38, 1.0, -1.0]
EDGES = [88.72283, 88.72284, 89.0, -87.3, -103.97207, -103.97209, -104.5, 0.625, 0.875, 4.0, 0.5493]


def _inputs(low: float, high: float) -> Array:
    rng = np.random.default_rng(7)
    sweep = np.linspace(low, high, 1_500_000, dtype=np.float32)
    bits = rng.integers(0, 2**32, 500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([sweep, bits, np.asarray(SPECIALS + EDGES, np.float32)])
    return values.astype(np.float32)


def _reference(op: Op, x: Array) -> Array:
    with np.errstate(all="ignore"):
        wide = x.astype(np.float64)
        erf: Callable[[Array], Array] = np.vectorize(math.erf, otypes=[np.float64])
        table: dict[Op, Callable[[Array], Array]] = {Op.EXP: np.exp, Op.LOG: np.log, Op.LOG1P: np.log1p}
        table.update({Op.TANH: np.tanh, Op.SIGMOID: _sigmoid, Op.ERF: erf})
        result: Array = table[op](wide).astype(np.float32)
        return result


def _sigmoid(x: Array) -> Array:
    result: Array = 1.0 / (1.0 + np.exp(-x))  # float64: no cancellation at float32 precision
    return result


def _ulps(got: Array, want: Array) -> Array:
    """Distance in representable float32 values (0 where both are the same NaN/inf)."""
    a, b = got.view(np.int32).astype(np.int64), want.view(np.int32).astype(np.int64)
    a = np.where(a < 0, -(2**31) - a, a)  # monotone integer order across the sign
    b = np.where(b < 0, -(2**31) - b, b)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    distance: Array = np.where(same, 0, np.abs(a - b))
    return distance


CASES = [
    (Op.EXP, -110.0, 95.0, 1),
    (Op.LOG, 0.0, 100.0, 1),
    (Op.LOG1P, -1.0, 10.0, 2),
    (Op.TANH, -12.0, 12.0, 2),
    (Op.ERF, -5.0, 5.0, 2),
    (Op.SIGMOID, -120.0, 120.0, 2),
]


# native: -march=native, polynomial steps as fused multiply-adds where the CPU has FMA; portable: the
# x86-64 baseline, a multiply and an add (vmath's sf_fma). The bound is the same for both.
@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
@pytest.mark.parametrize(("op", "low", "high", "bound"), CASES, ids=[c[0].value for c in CASES])
def test_vectorised_function_is_within_its_ulp_bound(
    tmp_path: Path, op: Op, low: float, high: float, bound: int, *, portable: bool
) -> None:
    x = _inputs(low, high)
    b = GraphBuilder()
    b.output("y", b.unary(op, b.parameter("x", x.shape)))
    graph = b.build()
    got = compile_cluster(graph, tmp_path, portable=portable)({"x": x})["y"]
    want = _reference(op, x)
    assert np.array_equal(np.isnan(got), np.isnan(want)), x[np.isnan(got) != np.isnan(want)][:5]
    err = _ulps(got, want)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{op.value}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {err[worst]} ulp"


def test_the_generated_code_uses_the_vectorised_functions(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (64, 128))
    b.output("y", b.unary(Op.ERF, b.unary(Op.EXP, x)))
    text = compile_cluster(b.build(), tmp_path).source.text
    body = text.split("struct stitch_", 1)[1]
    assert "sf_erff(" in body and "sf_expf(" in body and "erff(" not in body.replace("sf_erff(", "")


# A GELU computes 0.5 x (1 + erf(x / sqrt 2)): at negative x the sum cancels, and erf's absolute error near -1
# becomes the output's relative error. A one-formula rational erf (6 ulp, as accurate as TF's own) failed the
# tolerance rule on a GELU forward at 9x numpy's error for exactly this (benchmarks/README.md, kernels,
# session 21); the erf kept holds 2.1 units. scripts/kernel_erf_check.py measures it on every float.
@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
def test_erf_keeps_one_plus_erf_accurate_where_a_gelu_cancels(tmp_path: Path, *, portable: bool) -> None:
    x = -np.linspace(0.0, 4.5, 1_000_000, dtype=np.float32)
    b = GraphBuilder()
    b.output("y", b.unary(Op.ERF, b.parameter("x", x.shape)))
    got = compile_cluster(b.build(), tmp_path, portable=portable)({"x": x})["y"]
    exact = np.vectorize(math.erfc, otypes=[np.float64])(-x.astype(np.float64))  # 1 + erf(x), x <= 0
    kept = (1.0 + got.astype(np.float64)) - exact  # 1 + got is exact in float64
    worst = int(np.argmax(np.abs(kept)))
    assert abs(kept[worst]) <= 4 * 2.0**-24, f"1 + erf({x[worst]!r}) is {kept[worst] / 2.0**-24:.2f} x 2^-24 off"
