"""Loop-invariant code motion (`cpu/invariant.py`): what moves before a loop, what stays, and why."""

from __future__ import annotations

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.targets.cpu.invariant import branchy, hoist

F32 = DType.F32
ROW, COL = k.Var("row", DType.I64), k.Var("c", DType.I64)
BOUNDS = {"row": 64, "c": 128}
X = k.Buffer("in0_x", F32, 64 * 128, k.Role.INPUT)
SUMS = k.Buffer("in1_sums", F32, 64, k.Role.INPUT)
OUT = k.Buffer("out0_y", F32, 64 * 128, k.Role.OUTPUT)


def var(name: str) -> k.Var:
    return k.Var(name, F32)


def element() -> k.Expr:
    return k.add(k.mul(ROW, k.i64(128)), COL)


def softmax_like() -> list[k.Stmt]:
    """x[row, c] - log(sums[(row*128 + c) / 128]): the log depends on the row alone."""
    return [
        k.Assign(var("x"), k.Load(X, element())),
        k.Assign(var("s"), k.Load(SUMS, k.div(element(), k.i64(128)))),
        k.Assign(var("l"), k.Unary(Op.LOG, var("s"))),
        k.Assign(var("y"), k.Binary(Op.SUB, var("x"), var("l"))),
    ]


def names(stmts: list[k.Stmt]) -> list[str]:
    return [s.var.name for s in stmts if isinstance(s, k.Assign)]


def test_a_row_function_moves_before_the_column_loop() -> None:
    outside, inside = hoist(softmax_like(), {"c"}, BOUNDS)
    assert names(outside) == ["s", "l"]  # the index simplifies to `row`, so the load moves with it
    assert names(inside) == ["x", "y"]


def test_plain_loads_and_arithmetic_stay_where_gcc_hoists_them_itself() -> None:
    stmts = [k.Assign(var("s"), k.Load(SUMS, ROW)), k.Assign(var("y"), k.mul(var("s"), k.const(2.0, F32)))]
    outside, inside = hoist(stmts, {"c"}, BOUNDS)
    assert outside == [] and inside == stmts


def test_a_load_from_a_buffer_written_in_the_loop_stays() -> None:
    stmts = [*softmax_like(), k.Store(k.Buffer("in1_sums", F32, 64, k.Role.INPUT), ROW, var("y"))]
    outside, _ = hoist(stmts, {"c"}, BOUNDS)
    assert outside == []  # "s" could see this loop's own stores


def test_a_value_that_depends_on_the_column_stays_and_so_do_its_users() -> None:
    stmts = [
        k.Assign(var("x"), k.Load(X, element())),
        k.Assign(var("e"), k.Unary(Op.EXP, var("x"))),
        k.Assign(var("t"), k.Unary(Op.TANH, var("e"))),
    ]
    outside, inside = hoist(stmts, {"c"}, BOUNDS)
    assert outside == [] and inside == stmts


def test_a_variable_assigned_twice_is_not_one_value() -> None:
    stmts = [
        k.Assign(var("s"), k.Unary(Op.LOG, k.Load(SUMS, ROW))),
        k.Assign(var("s"), k.Binary(Op.ADD, var("s"), k.Load(X, element()))),
    ]
    outside, inside = hoist(stmts, {"c"}, BOUNDS)
    assert outside == [] and inside == stmts


def test_branchy_names_what_gcc_leaves_scalar() -> None:
    assert branchy([k.Assign(var("l"), k.Unary(Op.LOG, var("s")))])
    assert branchy([k.Assign(var("m"), k.Binary(Op.MAXIMUM, var("a"), var("b")))])
    flag = k.Buffer("in2_keep", DType.BOOL, 64, k.Role.INPUT)
    assert branchy([k.Assign(k.Var("f", DType.BOOL), k.Load(flag, ROW))])
    assert not branchy([k.Assign(var("y"), k.mul(k.Load(X, element()), var("s")))])
