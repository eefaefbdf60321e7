"""Index simplification (`cpu.indexmath`): the division identity and nested remainders, checked
against C's truncating division on every value of the loop variables (negative offsets too)."""

from __future__ import annotations

import itertools

import pytest

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.targets.cpu import cexpr as c
from stitchfleet.compiler.targets.cpu.indexmath import simplify

R, S = k.Var("r", DType.I64), k.Var("s", DType.I64)


def c_value(e: k.Expr, env: dict[str, int]) -> int:
    """e with C's integer semantics (division truncates toward zero, the remainder has the dividend's sign)."""
    if isinstance(e, k.Var):
        return env[e.name]
    if isinstance(e, k.Const):
        return int(e.value)
    assert isinstance(e, k.Binary)
    a, b = c_value(e.a, env), c_value(e.b, env)
    if e.op is Op.DIV:
        return abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    if e.op is k.IndexOp.MOD:
        return a - b * c_value(k.div(k.i64(a), k.i64(b)), env)
    return {Op.ADD: a + b, Op.SUB: a - b, Op.MUL: a * b}[e.op]  # type: ignore[index]


def split(x: k.Expr, n: int) -> k.Expr:
    return k.add(k.mul(k.div(x, k.i64(n)), k.i64(n)), k.mod(x, k.i64(n)))


NESTED = k.add(  # ((r/128)*128 + ((r%128)/32)*32) + r%32: the demo softmax's row, as a reshape leaves it
    k.add(k.mul(k.div(R, k.i64(128)), k.i64(128)), k.mul(k.div(k.mod(R, k.i64(128)), k.i64(32)), k.i64(32))),
    k.mod(R, k.i64(32)),
)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (split(R, 32), R),
        (NESTED, R),
        (k.sub(NESTED, S), k.sub(R, S)),
        (k.add(k.mod(R, k.i64(8)), k.mul(k.div(R, k.i64(8)), k.i64(8))), R),  # either order
        (k.add(split(k.add(R, S), 6), k.i64(3)), k.add(k.add(R, S), k.i64(3))),
    ],
)
def test_a_split_index_is_put_back_together(expr: k.Expr, want: k.Expr) -> None:
    assert simplify(expr, {"r": 1024, "s": 7}) == want


def test_the_softmax_row_index_renders_as_the_row() -> None:
    assert c.render(k.sub(NESTED, S), {"r": 1024}) == "(r - s)"


@pytest.mark.parametrize(
    "expr",
    [
        k.add(k.mul(k.div(R, k.i64(32)), k.i64(32)), k.mod(R, k.i64(16))),  # different n: not the identity
        k.add(k.mul(k.div(R, k.i64(32)), k.i64(32)), k.mod(S, k.i64(32))),  # different x
        k.add(k.mul(k.div(R, k.i64(32)), k.i64(16)), k.mod(R, k.i64(32))),  # scaled by another n
        k.add(k.mul(k.div(k.mod(R, k.i64(48)), k.i64(32)), k.i64(32)), k.mod(R, k.i64(32))),  # 32 does not divide 48
    ],
)
def test_near_misses_are_left_alone_and_keep_their_value(expr: k.Expr) -> None:
    got = simplify(expr, {})
    assert got != R
    for r, s in itertools.product(range(-70, 300, 7), range(-3, 4)):
        assert c_value(got, {"r": r, "s": s}) == c_value(expr, {"r": r, "s": s})


def test_the_identities_hold_for_every_value_in_c_semantics() -> None:
    for expr in (split(R, 32), NESTED, split(k.sub(R, S), 5)):
        got = simplify(expr, {})
        for r, s in itertools.product(range(-300, 300), range(-4, 5)):
            assert c_value(got, {"r": r, "s": s}) == c_value(expr, {"r": r, "s": s}), (r, s)


def test_a_divisor_of_the_stride_reads_the_column_alone() -> None:
    """A transpose's gather: (r*128 + c) % 32 is c % 32 and / 32 is r*4 + c/32 (c in [0, 128), r >= 0)."""
    flat = k.add(k.mul(R, k.i64(128)), S)
    bounds = {"r": 64, "s": 128}
    assert simplify(k.mod(flat, k.i64(32)), bounds) == k.mod(S, k.i64(32))
    assert simplify(k.div(flat, k.i64(32)), bounds) == k.add(k.mul(R, k.i64(4)), k.div(S, k.i64(32)))
    for expr in (k.mod(flat, k.i64(32)), k.div(flat, k.i64(32)), k.div(flat, k.i64(128))):
        got = simplify(expr, bounds)
        for r, s in itertools.product(range(64), range(128)):
            assert c_value(got, {"r": r, "s": s}) == c_value(expr, {"r": r, "s": s}), (expr, r, s)
