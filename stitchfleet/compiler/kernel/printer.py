"""A stable text form of kernels: CUDA-like pseudo code for dumps, diffs and error messages.

Input: a `Kernel`, a statement or an expression. Output: text. The same kernel
always prints the same text; `format_stmt` gives the one-line form that verifier
and sim errors use to name a statement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stitchfleet.compiler.ir.types import Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.syntax import INFIX

_ATOMIC_NAME = {Op.ADD: "atomicAdd", Op.MAXIMUM: "atomicMax", Op.MINIMUM: "atomicMin"}
_INDENT = "  "


def format_expr(expr: ir.Expr) -> str:
    """One expression, fully parenthesised where it nests."""
    return _EXPR_TEXT[type(expr)](expr)


def _binary_text(e: ir.Binary) -> str:
    if e.op in INFIX:
        return f"({format_expr(e.a)} {INFIX[e.op]} {format_expr(e.b)})"
    return f"{e.op.value}({format_expr(e.a)}, {format_expr(e.b)})"


_EXPR_TEXT: dict[type, Callable[[Any], str]] = {
    ir.Const: lambda e: _const_text(e.value, e.dtype.value),
    ir.SpecialIndex: lambda e: str(e.which.value),
    ir.Var: lambda e: str(e.name),
    ir.Unary: lambda e: f"{e.op.value}({format_expr(e.x)})",
    ir.Binary: _binary_text,
    ir.Select: lambda e: f"({format_expr(e.cond)} ? {format_expr(e.a)} : {format_expr(e.b)})",
    ir.Cast: lambda e: f"({e.dtype.value})({format_expr(e.x)})",
    ir.Load: lambda e: f"{e.buffer.name}[{format_expr(e.index)}]",
}


def _const_text(value: object, dtype: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value!r}{'f' if dtype == 'f32' else ''}" if dtype != "f16" else f"half({value!r})"
    return str(value) if dtype == "i64" else f"{dtype}({value})"


def format_stmt(stmt: ir.Stmt) -> str:
    """The statement's first line (a loop or branch header, or the whole simple statement)."""
    return _STMT_TEXT[type(stmt)](stmt)


def _for_text(s: ir.For) -> str:
    v = s.var.name
    start, stop, step = (format_expr(e) for e in (s.start, s.stop, s.step))
    return f"for ({s.var.dtype.value} {v} = {start}; {v} < {stop}; {v} += {step})"


def _shuffle_text(s: ir.Shuffle) -> str:
    return f"{s.var.name} = __shfl_{s.mode.value}_sync(active, {format_expr(s.value)}, {s.offset}, {s.width});"


def _atomic_text(s: ir.Atomic) -> str:
    return f"{_ATOMIC_NAME.get(s.op, s.op.value)}(&{s.buffer.name}[{format_expr(s.index)}], {format_expr(s.value)});"


_STMT_TEXT: dict[type, Callable[[Any], str]] = {
    ir.Assign: lambda s: f"{s.var.name} = {format_expr(s.value)};",
    ir.Store: lambda s: f"{s.buffer.name}[{format_expr(s.index)}] = {format_expr(s.value)};",
    ir.For: _for_text,
    ir.If: lambda s: f"if ({format_expr(s.cond)})",
    ir.SyncThreads: lambda s: "__syncthreads();",
    ir.GridSync: lambda s: "grid.sync();",
    ir.Shuffle: _shuffle_text,
    ir.Atomic: _atomic_text,
    ir.Comment: lambda s: f"// {s.text}",
}


def _block_lines(body: tuple[ir.Stmt, ...], depth: int, declared: set[str]) -> list[str]:
    lines: list[str] = []
    for stmt in body:
        lines.extend(_stmt_lines(stmt, depth, declared))
    return lines


def _stmt_lines(stmt: ir.Stmt, depth: int, declared: set[str]) -> list[str]:
    pad = _INDENT * depth
    if isinstance(stmt, ir.For):
        declared.add(stmt.var.name)
        inner = _block_lines(stmt.body, depth + 1, declared)
        return [f"{pad}{format_stmt(stmt)} {{", *inner, f"{pad}}}"]
    if isinstance(stmt, ir.If):
        lines = [f"{pad}{format_stmt(stmt)} {{", *_block_lines(stmt.then, depth + 1, declared)]
        if stmt.orelse:
            lines += [f"{pad}}} else {{", *_block_lines(stmt.orelse, depth + 1, declared)]
        return [*lines, f"{pad}}}"]
    text = format_stmt(stmt)
    if isinstance(stmt, ir.Assign | ir.Shuffle) and stmt.var.name not in declared:
        declared.add(stmt.var.name)
        text = f"{stmt.var.dtype.value} {text}"
    return [pad + text]


def _param_text(buf: ir.Buffer) -> str:
    return f"{buf.role.value} {buf.dtype.value} {buf.name}[{buf.size}]"


def _shared_text(buf: ir.SharedBuffer) -> str:
    where = "" if buf.offset is None else f" @ arena+{buf.offset}"
    return f"__shared__ {buf.dtype.value} {buf.name}[{buf.size}]{where}"


def print_kernel(kernel: ir.Kernel) -> str:
    """The whole kernel: signature, launch, shared declarations and body."""
    launch = kernel.launch
    regs = f" regs<={launch.max_registers}" if launch.max_registers is not None else ""
    lines = [
        f"kernel {kernel.name}({', '.join(_param_text(b) for b in kernel.params)})",
        f"  launch grid={launch.grid} block={launch.block} coresident<={launch.max_coresident_blocks}{regs}"
        f" dynamic_smem={launch.dynamic_smem_bytes}",
        "{",
    ]
    lines += [f"{_INDENT}// {line}" for line in kernel.doc.splitlines()]
    if kernel.arena_bytes:
        lines.append(f"{_INDENT}__shared__ u8 arena[{kernel.arena_bytes}];")
    lines += [f"{_INDENT}{_shared_text(s)};" for s in kernel.shared]
    lines += _block_lines(kernel.body, 1, set())
    return "\n".join([*lines, "}"])
