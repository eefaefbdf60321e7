"""Where each thread-local variable of a kernel is declared in the rendered C.

Input: a kernel body. Output: `Declarations`: for each variable, the statement block
whose top declares it, or the `for` header that declares it. C needs a variable
declared before use and visible wherever it is used; the IR has no declarations,
only assignments. A variable goes to the innermost block holding all its uses,
except that a block inside a loop only qualifies when the variable is assigned
there before any other use, so a value carried from one iteration to the next
is never re-declared (and lost) per iteration.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.uniformity import sub_exprs

BlockId = tuple[tuple[int, str], ...]  # (statement index, "body" | "then" | "else") from the kernel body down


@dataclass(frozen=True)
class Declarations:
    blocks: dict[BlockId, tuple[ir.Var, ...]] = field(default_factory=dict)  # declared at the top of that block
    headers: frozenset[BlockId] = frozenset()  # For statements (as the id of their body) declaring their var

    def at(self, block: BlockId) -> tuple[ir.Var, ...]:
        return self.blocks.get(block, ())


def stmt_exprs(stmt: ir.Stmt) -> Iterator[ir.Expr]:
    """The expressions a statement evaluates itself (not those of nested statements)."""
    match stmt:
        case ir.Assign(value=value) | ir.Shuffle(value=value):
            yield value
        case ir.Store(index=index, value=value) | ir.Atomic(index=index, value=value):
            yield index
            yield value
        case ir.For(start=start, stop=stop, step=step):
            yield from (start, stop, step)
        case ir.If(cond=cond):
            yield cond


def children(stmt: ir.Stmt) -> Iterator[tuple[str, tuple[ir.Stmt, ...]]]:
    if isinstance(stmt, ir.For):
        yield "body", stmt.body
    elif isinstance(stmt, ir.If):
        yield "then", stmt.then
        yield "else", stmt.orelse


def defined_var(stmt: ir.Stmt) -> ir.Var | None:
    return stmt.var if isinstance(stmt, ir.Assign | ir.Shuffle | ir.For) else None


def reads(stmt: ir.Stmt, name: str) -> bool:
    """Whether the statement itself reads `name`."""
    return any(isinstance(e, ir.Var) and e.name == name for x in stmt_exprs(stmt) for e in sub_exprs(x))


def mentions(stmt: ir.Stmt, name: str) -> bool:
    """Whether the statement or anything nested in it reads or writes `name`."""
    var = defined_var(stmt)
    if (var is not None and var.name == name) or reads(stmt, name):
        return True
    return any(mentions(s, name) for _, body in children(stmt) for s in body)


def _occurrences(body: tuple[ir.Stmt, ...], where: BlockId, found: dict[str, list[BlockId]]) -> None:
    for i, stmt in enumerate(body):
        names = {e.name for x in stmt_exprs(stmt) for e in sub_exprs(x) if isinstance(e, ir.Var)}
        var = defined_var(stmt)
        if isinstance(stmt, ir.For) and not reads(ir.Assign(stmt.var, stmt.start), stmt.var.name):
            found.setdefault(stmt.var.name, []).append((*where, (i, "body")))  # the loop itself sets it
        elif var is not None:
            names.add(var.name)
        for name in names:
            found.setdefault(name, []).append(where)
        for branch, inner in children(stmt):
            _occurrences(inner, (*where, (i, branch)), found)


def _block(body: tuple[ir.Stmt, ...], block: BlockId) -> tuple[ir.Stmt, ...]:
    for i, branch in block:
        stmt = body[i]
        body = stmt.body if isinstance(stmt, ir.For) else stmt.then if branch == "then" else stmt.orelse  # type: ignore[union-attr]
    return body


def _common(ids: list[BlockId]) -> BlockId:
    first = ids[0]
    n = 0
    while n < len(first) and all(len(b) > n and b[n] == first[n] for b in ids):
        n += 1
    return first[:n]


def _fresh(body: tuple[ir.Stmt, ...], name: str) -> bool:
    """Whether the first statement of `body` touching `name` assigns it without reading it."""
    for stmt in body:
        if not mentions(stmt, name):
            continue
        var = defined_var(stmt)
        if isinstance(stmt, ir.For):
            return stmt.var.name == name and not reads(ir.Assign(stmt.var, stmt.start), name)
        return (
            isinstance(stmt, ir.Assign | ir.Shuffle) and var is not None and var.name == name and not reads(stmt, name)
        )
    return False


def _in_loop(block: BlockId) -> bool:
    return any(branch == "body" for _, branch in block)


def _header_for(body: tuple[ir.Stmt, ...], name: str, block: BlockId) -> bool:
    """`block` is the body of a For that defines `name` (all uses of `name` are in that loop)."""
    if not block or block[-1][1] != "body":
        return False
    loop = _block(body, block[:-1])[block[-1][0]]
    return isinstance(loop, ir.For) and loop.var.name == name


def declarations(body: tuple[ir.Stmt, ...]) -> Declarations:
    """Declaration sites of every variable of the kernel body."""
    found: dict[str, list[BlockId]] = {}
    _occurrences(body, (), found)
    types = _var_types(body)
    blocks: dict[BlockId, list[ir.Var]] = {}
    headers: set[BlockId] = set()
    for name, ids in found.items():
        site = _common(ids)
        if _header_for(body, name, site):
            headers.add(site)
            continue
        while site and _in_loop(site) and not _fresh(_block(body, site), name):
            site = site[:-1]
        blocks.setdefault(site, []).append(types[name])
    return Declarations({k: tuple(v) for k, v in blocks.items()}, frozenset(headers))


def _var_types(body: tuple[ir.Stmt, ...]) -> dict[str, ir.Var]:
    out: dict[str, ir.Var] = {}
    for stmt in body:
        var = defined_var(stmt)
        if var is not None:
            out.setdefault(var.name, var)
        for _, inner in children(stmt):
            for name, v in _var_types(inner).items():
                out.setdefault(name, v)
    return out
