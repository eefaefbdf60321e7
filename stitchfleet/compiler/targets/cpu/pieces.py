"""Index-set splitting of an inner loop at concat boundaries (one branch-free loop per piece), and into
runs where its index math divides the column (a transpose's gather: one contiguous run per loop).

Input: the statements of one element of an inner loop over `col` in [0, cols), and the
loop bounds. Output: the column ranges [lo, hi) between the constants `K` that the
statements compare the column with (`if (col < K)`: the lowering's CONCAT along the last
axis), each with the statements specialised to that range (every such `If` decided and
replaced by the branch it takes). A concat inside an element loop otherwise leaves an
if/else chain per element, which gcc does not vectorise and which evaluates every piece's
producers behind branches: measured 6 ns per element in a DIEN GRU cluster (128 x 144),
and 88 of the 145 workload clusters have a CONCAT.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.targets.cpu.indexmath import simplify
from stitchfleet.compiler.targets.cpu.invariant import hoisted_block

Piece = tuple[int, int, list[k.Stmt]]
# A column loop splits into runs no shorter than this: one AVX-512 vector of f32 (a shorter simd loop
# costs its loop overhead and remainder per run).
MIN_RUN = 16


def _boundary(cond: k.Expr, col: str, bounds: Mapping[str, int]) -> int | None:
    """K when `cond` is `col < K` once its index math is simplified."""
    if not (isinstance(cond, k.Binary) and cond.op is Op.LESS and isinstance(cond.b, k.Const)):
        return None
    left = simplify(cond.a, bounds)
    return int(cond.b.value) if isinstance(left, k.Var) and left.name == col else None


def boundaries(stmts: Sequence[k.Stmt], col: str, bounds: Mapping[str, int]) -> set[int]:
    """Every K the statements compare the column with (nested branches included)."""
    found: set[int] = set()
    for s in stmts:
        if isinstance(s, k.If):
            edge = _boundary(s.cond, col, bounds)
            found |= {edge} if edge is not None else set()
            found |= boundaries((*s.then, *s.orelse), col, bounds)
    return found


def specialise(stmts: Sequence[k.Stmt], col: str, span: tuple[int, int], bounds: Mapping[str, int]) -> list[k.Stmt]:
    """The statements for columns in [lo, hi): a branch on `col < K` decided by the span is inlined."""
    lo, hi = span
    out: list[k.Stmt] = []
    for s in stmts:
        if not isinstance(s, k.If):
            out.append(s)
            continue
        edge = _boundary(s.cond, col, bounds)
        then = specialise(s.then, col, span, bounds)
        orelse = specialise(s.orelse, col, span, bounds)
        if edge is not None and hi <= edge:
            out += then
        elif edge is not None and lo >= edge:
            out += orelse
        else:
            out.append(k.If(s.cond, tuple(then), tuple(orelse)))
    return out


def pieces(stmts: Sequence[k.Stmt], col: str, cols: int, bounds: Mapping[str, int]) -> list[Piece]:
    """The column ranges and their specialised statements; one range [0, cols) when nothing splits."""
    edges = sorted(e for e in boundaries(stmts, col, bounds) if 0 < e < cols)
    spans = list(zip([0, *edges], [*edges, cols], strict=True))
    return [(lo, hi, specialise(stmts, col, (lo, hi), bounds)) for lo, hi in spans]


_EXPRS = (k.Var, k.Const, k.Unary, k.Binary, k.Select, k.Cast, k.Load, k.SpecialIndex)


def replaced(e: k.Expr, col: str, value: k.Expr) -> k.Expr:
    """`e` with the column variable read as `value`."""
    if isinstance(e, k.Var):
        return value if e.name == col else e
    if isinstance(e, k.Const | k.SpecialIndex):
        return e
    parts: dict[str, Any] = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    changed: dict[str, Any] = {n: replaced(v, col, value) for n, v in parts.items() if isinstance(v, _EXPRS)}
    return dataclasses.replace(e, **changed)


def shifted(e: k.Expr, col: str, lo: int) -> k.Expr:
    """`e` with the column variable read as `col + lo`: a piece's loop counts from 0, so its index
    math (`(c + 72) - 72` folds to `c`) simplifies under the piece's own bound."""
    return replaced(e, col, k.add(k.Var(col, DType.I64), k.i64(lo))) if lo else e


def replaced_stmts(stmts: Sequence[k.Stmt], col: str, value: k.Expr) -> list[k.Stmt]:
    """`replaced` over plain statements (the element statements of a fused loop: Assign, Store, If)."""
    out: list[k.Stmt] = []
    for s in stmts:
        if isinstance(s, k.Assign):
            out.append(k.Assign(s.var, replaced(s.value, col, value)))
        elif isinstance(s, k.Store):
            out.append(k.Store(s.buffer, replaced(s.index, col, value), replaced(s.value, col, value)))
        elif isinstance(s, k.If):
            then, orelse = replaced_stmts(s.then, col, value), replaced_stmts(s.orelse, col, value)
            out.append(k.If(replaced(s.cond, col, value), tuple(then), tuple(orelse)))
        else:
            out.append(s)
    return out


def shifted_stmts(stmts: Sequence[k.Stmt], col: str, lo: int) -> list[k.Stmt]:
    """`shifted` over plain statements."""
    return replaced_stmts(stmts, col, k.add(k.Var(col, DType.I64), k.i64(lo))) if lo else list(stmts)


def _exprs(stmts: Sequence[k.Stmt]) -> Iterator[k.Expr]:
    for s in stmts:
        if isinstance(s, k.Assign):
            yield s.value
        elif isinstance(s, k.Store):
            yield from (s.index, s.value)
        elif isinstance(s, k.If):
            yield s.cond
            yield from _exprs((*s.then, *s.orelse))


def _mentions(e: k.Expr, col: str) -> bool:
    if isinstance(e, k.Var):
        return e.name == col
    return any(_mentions(v, col) for f in dataclasses.fields(e) if isinstance(v := getattr(e, f.name), _EXPRS))


def _divisors(e: k.Expr, col: str) -> Iterator[int]:
    """The constant divisors of the column in `e` (`c / 32`, `c % 32`: a transpose's column split)."""
    if (
        isinstance(e, k.Binary)
        and e.op in (Op.DIV, k.IndexOp.MOD)
        and isinstance(e.b, k.Const)
        and not e.dtype.is_float
        and _mentions(e.a, col)
    ):
        yield int(e.b.value)
    for f in dataclasses.fields(e):
        if isinstance(v := getattr(e, f.name), _EXPRS):
            yield from _divisors(v, col)


def run_length(stmts: Sequence[k.Stmt], col: str, cols: int, bounds: Mapping[str, int]) -> int | None:
    """The columns' run length when the index math divides the column (a transpose: `c / 32`, `c % 32`):
    the gcd of the divisors, when it divides `cols`, is shorter and at least MIN_RUN; else None."""
    found = {n for e in _exprs(stmts) for n in _divisors(simplify(e, bounds), col)}
    run = math.gcd(*found) if found else 0
    return run if MIN_RUN <= run < cols and cols % run == 0 else None


def column_loops(stmts: Sequence[k.Stmt], col: str, cols: int, bounds: Mapping[str, int], pad: str) -> list[str]:
    """C lines: per piece, its row-invariant values, then an `omp simd` loop counting the piece's columns
    from 0 (the column read as `col + lo`); each piece in its own block (they declare the same names)."""
    spans = pieces(stmts, col, cols, bounds)
    lines: list[str] = []
    for lo, hi, body in spans:
        inner = pad + ("    " if len(spans) > 1 else "")
        local = {**bounds, col: hi - lo}
        block = _runs(shifted_stmts(body, col, lo), col, local, inner)
        lines += [f"{pad}{{", *block, f"{pad}}}"] if len(spans) > 1 else block
    return lines


_RUN_LOOP = re.compile(r"^\s*for \(int64_t \w+_run = 0;")


def in_runs(lines: Sequence[str]) -> bool:
    """Whether C lines hold a loop over runs (`_runs`): their simd loops are one run long."""
    return any(_RUN_LOOP.match(line) for line in lines)


def _runs(stmts: Sequence[k.Stmt], col: str, bounds: Mapping[str, int], pad: str) -> list[str]:
    """The simd loop over [0, bounds[col]); where the index math divides the column (`run_length`), a loop
    over runs around a simd loop over one run, the column read as `run * length + col`: the per-element
    64-bit div/mod of a transpose's gather become the loop variables (`indexmath`'s split)."""
    cols = bounds[col]
    run = run_length(stmts, col, cols, bounds)
    if run is None:
        before, rest = hoisted_block(stmts, {col}, bounds, (pad, pad + "    "))
        loop = [f"{pad}#pragma omp simd", f"{pad}for (int64_t {col} = 0; {col} < {cols}L; ++{col}) {{"]
        return [*before, *loop, *rest, f"{pad}}}"]
    outer = k.Var(f"{col}_run", DType.I64)
    local = {**bounds, outer.name: cols // run, col: run}
    split = replaced_stmts(stmts, col, k.add(k.mul(outer, k.i64(run)), k.Var(col, DType.I64)))
    before, rest = hoisted_block(split, {outer.name, col}, local, (pad, pad + "        "))
    return [
        *before,
        f"{pad}for (int64_t {outer.name} = 0; {outer.name} < {cols // run}L; ++{outer.name}) {{",
        f"{pad}    #pragma omp simd",
        f"{pad}    for (int64_t {col} = 0; {col} < {run}L; ++{col}) {{",
        *rest,
        f"{pad}    }}",
        f"{pad}}}",
    ]
