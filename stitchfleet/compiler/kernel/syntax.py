"""How kernel IR operators are spelled in C-family text: one table for every text form.

Input: an `Op`/`IndexOp` of a kernel IR expression. Output: its infix operator in C, CUDA C
and the kernel printer's pseudo code (they agree; `INFIX`), or the C math library function
both C and CUDA C call for it (`LIBM`: the float version takes an `f` suffix). A renderer
adds only what its own language has beyond these (CUDA's rsqrt, pow).
"""

from __future__ import annotations

from stitchfleet.compiler.ir.types import Op
from stitchfleet.compiler.kernel.ir import IndexOp

INFIX: dict[Op | IndexOp, str] = {
    Op.ADD: "+",
    Op.SUB: "-",
    Op.MUL: "*",
    Op.DIV: "/",
    IndexOp.MOD: "%",
    Op.GREATER: ">",
    Op.GREATER_EQUAL: ">=",
    Op.LESS: "<",
    Op.LESS_EQUAL: "<=",
    Op.EQUAL: "==",
    Op.NOT_EQUAL: "!=",
    Op.LOGICAL_AND: "&&",
    Op.LOGICAL_OR: "||",
}

LIBM: dict[Op, str] = {
    Op.FLOOR: "floor",
    Op.CEIL: "ceil",
    Op.EXP: "exp",
    Op.LOG: "log",
    Op.LOG1P: "log1p",
    Op.TANH: "tanh",
    Op.ERF: "erf",
    Op.SQRT: "sqrt",
}
