"""Which values and branches may differ between threads: the static divergence analysis.

Input: a kernel body and the special indices that vary at the level asked about
(threads of a block, or blocks of a grid). Output: the variables that may differ and
a predicate for expressions. A barrier is divergent when it sits under a branch or
loop whose condition or bounds may differ; the verifier uses this to reject what it
can see statically (the sim catches the rest at run time).
"""

from __future__ import annotations

from collections.abc import Iterator

from stitchfleet.compiler.kernel import ir

BLOCK_VARIANT = frozenset({ir.Special.THREAD_IDX, ir.Special.LANE, ir.Special.WARP})
GRID_VARIANT = BLOCK_VARIANT | {ir.Special.BLOCK_IDX}


def sub_exprs(expr: ir.Expr) -> Iterator[ir.Expr]:
    """The expression and everything it contains, depth first."""
    yield expr
    match expr:
        case ir.Unary(x=x) | ir.Cast(x=x):
            yield from sub_exprs(x)
        case ir.Binary(a=a, b=b):
            yield from sub_exprs(a)
            yield from sub_exprs(b)
        case ir.Select(cond=c, a=a, b=b):
            for part in (c, a, b):
                yield from sub_exprs(part)
        case ir.Load(index=index):
            yield from sub_exprs(index)


def is_variant(expr: ir.Expr, specials: frozenset[ir.Special], variant_vars: set[str]) -> bool:
    for part in sub_exprs(expr):
        if isinstance(part, ir.SpecialIndex) and part.which in specials:
            return True
        if isinstance(part, ir.Var) and part.name in variant_vars:
            return True
    return False


def variant_vars(body: tuple[ir.Stmt, ...], specials: frozenset[ir.Special]) -> set[str]:
    """Variables that may hold different values in different threads (blocks), to a fixed point."""
    found: set[str] = set()
    while True:
        before = len(found)
        _mark(body, False, specials, found)
        if len(found) == before:
            return found


def _mark(body: tuple[ir.Stmt, ...], divergent: bool, specials: frozenset[ir.Special], found: set[str]) -> None:
    for stmt in body:
        match stmt:
            case ir.Assign(var=var, value=value):
                if divergent or is_variant(value, specials, found):
                    found.add(var.name)
            case ir.Shuffle(var=var):
                found.add(var.name)  # lanes read other lanes: never uniform in general
            case ir.For(var=var, start=start, stop=stop, step=step, body=inner):
                inner_div = divergent or any(is_variant(e, specials, found) for e in (start, stop, step))
                if inner_div:
                    found.add(var.name)
                _mark(inner, inner_div, specials, found)
            case ir.If(cond=cond, then=then, orelse=orelse):
                inner_div = divergent or is_variant(cond, specials, found)
                _mark(then, inner_div, specials, found)
                _mark(orelse, inner_div, specials, found)
