"""How kernel IR operators are spelled in C-family text: one table for every text form.

Input: an `Op`/`IndexOp` of a kernel IR Binary expression. Output: its infix operator in C,
CUDA C and the kernel printer's pseudo code (they agree), or no entry when the op is a
function call in those languages.
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
