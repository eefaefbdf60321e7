"""Integer index math simplified with the loop bounds: the div/mod chains of broadcasts and transposes.

Input: a kernel IR index expression and the exclusive upper bounds of its loop variables. Output:
an equal expression with fewer divisions: `(r*n + c) / n` is `r` and `% n` is `c` when `c` is
known to lie in [0, n); `(x/n)*n + x%n` is `x` (C's division identity, any sign), and
`(x%m)%n` is `x%n` when n divides m, so a row split by a reshape and put back together
(`((r/128)*128 + ((r%128)/32)*32) + r%32`, the demo softmax's row index) is `r` again; and
`(r*s + c) % n` is `c % n` when n divides s (a transpose's column, split into runs by `pieces`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import ir as k


def _const(e: k.Expr) -> int | None:
    if isinstance(e, k.Const) and not e.dtype.is_float and e.dtype is not DType.BOOL:
        return int(e.value)
    return None


def upper(e: k.Expr, bounds: Mapping[str, int]) -> int | None:
    """The largest value a non-negative index expression can take, when known."""
    if isinstance(e, k.Var):
        return bounds[e.name] - 1 if e.name in bounds else None
    if isinstance(e, k.Const):
        return _const(e)
    if isinstance(e, k.Binary):
        a, b = upper(e.a, bounds), upper(e.b, bounds)
        if e.op is k.IndexOp.MOD and _const(e.b):
            return int(_const(e.b) or 0) - 1
        if a is None or b is None:
            return None
        table: dict[Op | k.IndexOp, int] = {Op.ADD: a + b, Op.MUL: a * b, Op.DIV: a // max(_const(e.b) or 1, 1)}
        return table.get(e.op)
    return None


def _split(e: k.Expr, bounds: Mapping[str, int]) -> tuple[k.Expr, int, k.Expr] | None:
    """(r, n, c) when `e` is r*n + c with c in [0, n)."""
    if not (isinstance(e, k.Binary) and e.op is Op.ADD and isinstance(e.a, k.Binary) and e.a.op is Op.MUL):
        return None
    n = _const(e.a.b)
    high = upper(e.b, bounds)
    if n is None or n <= 0 or high is None or high >= n:
        return None
    return e.a.a, n, e.b


def _scaled(op: Op | k.IndexOp, x: k.Expr, n: int, bounds: Mapping[str, int]) -> k.Expr | None:
    """`(r*s) / n` is `r*(s/n)` and `(r*s) % n` is 0 when n divides s (unstacked rows: `(r*10) % 10`)."""
    if not (isinstance(x, k.Binary) and x.op is Op.MUL):
        return None
    scale = _const(x.b)
    if scale is None or scale <= 0 or scale % n:
        return None
    return simplify(k.mul(x.a, k.i64(scale // n)), bounds) if op is Op.DIV else k.i64(0)


def _trivial(op: Op | k.IndexOp, x: k.Expr, n: int, bounds: Mapping[str, int]) -> k.Expr | None:
    """x / n and x % n when n is 1, divides x's constant factor, or exceeds x."""
    if n == 1:
        return x if op is Op.DIV else k.i64(0)
    scaled = _scaled(op, x, n, bounds)
    if scaled is not None:
        return scaled
    high = upper(x, bounds)
    if high is not None and 0 <= high < n:
        return k.i64(0) if op is Op.DIV else x
    return None


def _divmod(op: Op | k.IndexOp, x: k.Expr, n: int, bounds: Mapping[str, int]) -> k.Expr | None:
    direct = _trivial(op, x, n, bounds)
    if direct is not None:
        return direct
    parts = _split(x, bounds)
    if parts is None:
        return None
    if parts[1] % n == 0 and upper(parts[0], bounds) is not None:
        return _strided(op, parts, n, bounds)
    return _nested(op, parts, n, bounds)


def _nested(op: Op | k.IndexOp, parts: tuple[k.Expr, int, k.Expr], n: int, bounds: Mapping[str, int]) -> k.Expr | None:
    """(r*s + c) / n as r / (n/s) and % n as (r % (n/s))*s + c, for s dividing n (c in [0, s))."""
    r, inner, c = parts
    if n % inner:
        return None
    if op is Op.DIV:
        return r if n == inner else simplify(k.div(r, k.i64(n // inner)), bounds)
    if n == inner:
        return c
    return k.add(k.mul(simplify(k.mod(r, k.i64(n // inner)), bounds), k.i64(inner)), c)


def _strided(op: Op | k.IndexOp, parts: tuple[k.Expr, int, k.Expr], n: int, bounds: Mapping[str, int]) -> k.Expr:
    """(r*s + c) / n as r*(s/n) + c/n and % n as c % n, for n dividing s (all terms non-negative): a
    transpose's `((r*128 + c) % 32)` depends on the column alone and splits with it (`pieces.run_length`)."""
    r, stride, c = parts
    if op is Op.DIV:
        return simplify(k.add(k.mul(r, k.i64(stride // n)), k.div(c, k.i64(n))), bounds)
    return simplify(k.mod(c, k.i64(n)), bounds)


def _fold_offsets(op: Op | k.IndexOp, a: k.Expr, cb: int | None) -> k.Expr | None:
    """`(x + p) + q` and `(x + p) - q` with constants p, q as `x + (p +/- q)` (a shifted loop's index)."""
    if cb is None or op not in (Op.ADD, Op.SUB) or not (isinstance(a, k.Binary) and a.op is Op.ADD):
        return None
    p = _const(a.b)
    if p is None:
        return None
    return k.add(a.a, k.i64(p + cb if op is Op.ADD else p - cb))


def _terms(e: k.Expr) -> list[k.Expr]:
    """The operands of a sum, nested additions flattened."""
    if isinstance(e, k.Binary) and e.op is Op.ADD:
        return [*_terms(e.a), *_terms(e.b)]
    return [e]


def _residue(x: k.Expr, n: int) -> tuple[k.Expr, int]:
    """(w, n) with x % n == w % n: `(w % m) % n` is `w % n` when n divides m (C's remainder too)."""
    m = _const(x.b) if isinstance(x, k.Binary) and x.op is k.IndexOp.MOD else None
    if isinstance(x, k.Binary) and m is not None and m > 0 and m % n == 0:
        return _residue(x.a, n)
    return x, n


def _whole(p: k.Expr, q: k.Expr) -> k.Expr | None:
    """x when p is `(x/n)*n` and q is `x % n` (up to `_residue`): C guarantees (x/n)*n + x%n == x."""
    if not (isinstance(p, k.Binary) and p.op is Op.MUL and isinstance(p.a, k.Binary) and p.a.op is Op.DIV):
        return None
    n = _const(p.b)
    if n is None or n <= 0 or _const(p.a.b) != n:
        return None
    if not (isinstance(q, k.Binary) and q.op is k.IndexOp.MOD and _const(q.b) == n):
        return None
    return p.a.a if _residue(p.a.a, n) == _residue(q.a, n) else None


def _merged(a: k.Expr, b: k.Expr) -> k.Expr | None:
    """The sum a + b with one pair of terms `(x/n)*n`, `x%n` replaced by x; None when no pair is."""
    terms = [*_terms(a), *_terms(b)]
    for i, j in ((i, j) for i in range(len(terms)) for j in range(len(terms)) if i != j):
        whole = _whole(terms[i], terms[j])
        if whole is not None:
            rest = [t for n, t in enumerate(terms) if n not in (i, j)]
            return functools.reduce(k.add, rest, whole)
    return None


def simplify(e: k.Expr, bounds: Mapping[str, int]) -> k.Expr:
    """Integer index math with the identities above (bounds: loop variable -> exclusive upper bound)."""
    if not isinstance(e, k.Binary) or e.dtype.is_float:
        return e
    a, b = simplify(e.a, bounds), simplify(e.b, bounds)
    ca, cb = _const(a), _const(b)
    if e.op is Op.ADD and ca == 0:
        return b
    if e.op in (Op.ADD, Op.SUB) and cb == 0:
        return a
    folded = _merged(a, b) if e.op is Op.ADD else None
    folded = folded if folded is not None else _fold_offsets(e.op, a, cb)
    if folded is None and e.op is Op.MUL and (ca == 1 or cb == 1):
        folded = b if ca == 1 else a
    if folded is not None:
        return simplify(folded, bounds)
    if e.op in (Op.DIV, k.IndexOp.MOD) and cb is not None and cb > 0 and not a.dtype.is_float:
        done = _divmod(e.op, a, cb, bounds)
        if done is not None:
            return done
    return k.Binary(e.op, a, b)
