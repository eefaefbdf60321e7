"""Sim atomics model the target: a bf16 atomicAdd (a CUDA compare-and-swap loop) rounds after every add."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import (
    BLOCK_DIM,
    BLOCK_IDX,
    THREAD_IDX,
    Atomic,
    Binary,
    Buffer,
    If,
    Kernel,
    Launch,
    Load,
    Role,
    i64,
    lt,
    mod,
)
from stitchfleet.compiler.targets.sim.interpreter import run

N = 1000
Array = npt.NDArray[Any]


def _sum_kernel(dtype: DType, targets: int) -> Kernel:
    """Every thread i < N does atomicAdd(&y[i % targets], x[i])."""
    x, y = Buffer("x", dtype, N, Role.INPUT), Buffer("y", dtype, targets, Role.OUTPUT)
    gid = Binary(Op.ADD, Binary(Op.MUL, BLOCK_IDX, BLOCK_DIM), THREAD_IDX)
    slot = mod(gid, i64(targets)) if targets > 1 else i64(0)
    body = (If(lt(gid, i64(N)), (Atomic(Op.ADD, y, slot, Load(x, gid)),)),)
    return Kernel("atomic_sum", (x, y), (), Launch(4, 256, 4), body)


def _sequential_bf16_sum(x: Array, targets: int) -> Array:
    """The CAS loop in thread-id order (one legal order): round to bf16 after each add."""
    out = np.zeros(targets, np.float32)
    for i, v in enumerate(x):
        out[i % targets] = round_bf16(np.array([out[i % targets] + v], np.float32))[0]
    return out


def test_bf16_atomic_add_rounds_after_every_add() -> None:
    # Regression (issue 17): the sim used ufunc.at on float32 storage, one unrounded f32 sum
    # (1000 N(0,1) values: -62.0 vs -59.26, which is not even a bf16 value).
    x = round_bf16(np.random.default_rng(5).standard_normal(N).astype(np.float32))
    got = run([_sum_kernel(DType.BF16, 1)], {"x": x})["y"]
    want = _sequential_bf16_sum(x, 1)
    assert got[0] == want[0]
    assert round_bf16(got)[0] == got[0]  # a bf16 value
    assert got[0] != np.float32(x.astype(np.float64).sum())  # the unrounded sum differs here


def test_bf16_atomic_add_to_several_elements_rounds_per_element() -> None:
    x = round_bf16(np.random.default_rng(6).standard_normal(N).astype(np.float32))
    got = run([_sum_kernel(DType.BF16, 7)], {"x": x})["y"]
    np.testing.assert_array_equal(got, _sequential_bf16_sum(x, 7))


def test_f32_atomic_add_stays_one_f32_sum() -> None:
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    got = run([_sum_kernel(DType.F32, 1)], {"x": x})["y"]
    want = np.zeros(1, np.float32)
    np.add.at(want, np.zeros(N, np.int64), x)
    np.testing.assert_array_equal(got, want)
