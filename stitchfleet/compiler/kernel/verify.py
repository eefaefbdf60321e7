"""The kernel verifier: rejects kernels that are malformed or would misbehave on a GPU.

Input: a `Kernel`. Output: None, or a `KernelError` naming the kernel and the
statement (its one-line text and its path, e.g. `body[2].then[0]`). Checks: launch
shape (1-D, block a multiple of 32), unique and declared buffers, no stores into
inputs, variables assigned before use with one dtype each, operand dtypes, shared
memory within the limit, shared arena views aligned to their element size, barriers
outside divergent control flow (when visible statically), and a grid barrier only
with at most `max_coresident_blocks` blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stitchfleet.compiler.ir.types import COMPARISONS, FLOAT_ONLY, LOGICAL, DType, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.printer import format_stmt
from stitchfleet.compiler.kernel.uniformity import BLOCK_VARIANT, GRID_VARIANT, is_variant, sub_exprs, variant_vars

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INTS = frozenset({DType.I32, DType.I64})


class KernelError(ValueError):
    """A kernel failed verification; the message names the kernel and the statement."""


@dataclass
class _Scope:
    kernel: ir.Kernel
    buffers: dict[str, ir.AnyBuffer]
    var_types: dict[str, DType] = field(default_factory=dict)
    block_variant: set[str] = field(default_factory=set)
    grid_variant: set[str] = field(default_factory=set)

    def fail(self, problem: str, stmt: ir.Stmt | None = None, path: str = "") -> KernelError:
        where = f": statement `{format_stmt(stmt)}` at {path}" if stmt is not None else ""
        return KernelError(f"kernel {self.kernel.name!r}{where}: {problem}")


def verify(kernel: ir.Kernel) -> None:
    """Raises KernelError on the first problem found."""
    scope = _Scope(kernel, {})
    _check_launch(scope)
    _check_buffers(scope)
    scope.block_variant = variant_vars(kernel.body, BLOCK_VARIANT)
    scope.grid_variant = variant_vars(kernel.body, GRID_VARIANT)
    _check_body(scope, kernel.body, "body", False, False)


def _check_launch(scope: _Scope) -> None:
    k, launch = scope.kernel, scope.kernel.launch
    if not _NAME.match(k.name):
        raise scope.fail(f"kernel name {k.name!r} is not an identifier")
    if launch.grid < 1 or launch.max_coresident_blocks < 1:
        raise scope.fail(f"grid ({launch.grid}) and max_coresident_blocks must be >= 1")
    if launch.block % ir.WARP_SIZE or not ir.WARP_SIZE <= launch.block <= ir.MAX_BLOCK_THREADS:
        raise scope.fail(f"block of {launch.block} threads: must be a multiple of 32 in [32, 1024]")
    if k.shared_bytes > launch.shared_limit_bytes:
        raise scope.fail(f"shared memory {k.shared_bytes} bytes exceeds the limit of {launch.shared_limit_bytes}")


def _check_buffers(scope: _Scope) -> None:
    declared: tuple[ir.AnyBuffer, ...] = (*scope.kernel.params, *scope.kernel.shared)
    for buf in declared:
        if not _NAME.match(buf.name):
            raise scope.fail(f"buffer name {buf.name!r} is not an identifier")
        if buf.name in scope.buffers:
            raise scope.fail(f"buffer {buf.name!r} declared twice")
        if buf.size < 1:
            raise scope.fail(f"buffer {buf.name!r} has size {buf.size}; must be >= 1")
        if isinstance(buf, ir.SharedBuffer) and buf.offset is not None:
            _check_view(scope, buf)
        scope.buffers[buf.name] = buf


def _check_view(scope: _Scope, view: ir.SharedBuffer) -> None:
    """An arena view starts inside the arena at a multiple of its element size (aligned loads)."""
    assert view.offset is not None
    size = view.dtype.itemsize
    if view.offset < 0 or view.offset % size:
        raise scope.fail(
            f"shared view {view.name!r} at byte offset {view.offset}: must be >= 0 and a multiple of {size}"
            f" (its {view.dtype.value} element size)"
        )


def _check_body(scope: _Scope, body: tuple[ir.Stmt, ...], path: str, block_div: bool, grid_div: bool) -> None:
    for i, stmt in enumerate(body):
        here = f"{path}[{i}]"
        try:
            _check_stmt(scope, stmt, here, block_div, grid_div)
        except _ProblemError as problem:
            raise scope.fail(str(problem), stmt, here) from None


class _ProblemError(Exception):
    """Raised inside one statement's checks; `_check_body` adds the kernel and statement."""


def _check_stmt(scope: _Scope, stmt: ir.Stmt, path: str, block_div: bool, grid_div: bool) -> None:
    match stmt:
        case ir.Assign(var=var, value=value):
            _expect(scope, value, var.dtype, "assigned value")
            _define(scope, var)
        case ir.Store(buffer=buf, index=index, value=value) | ir.Atomic(buffer=buf, index=index, value=value):
            _check_target(scope, stmt, buf, index, value)
        case ir.For(var=var, start=start, stop=stop, step=step, body=inner):
            _check_for(scope, var, (start, stop, step))
            bdiv = block_div or any(is_variant(e, BLOCK_VARIANT, scope.block_variant) for e in (start, stop, step))
            gdiv = grid_div or any(is_variant(e, GRID_VARIANT, scope.grid_variant) for e in (start, stop, step))
            _check_body(scope, inner, f"{path}.body", bdiv, gdiv)
        case ir.If(cond=cond, then=then, orelse=orelse):
            _expect(scope, cond, DType.BOOL, "condition")
            bdiv = block_div or is_variant(cond, BLOCK_VARIANT, scope.block_variant)
            gdiv = grid_div or is_variant(cond, GRID_VARIANT, scope.grid_variant)
            _check_body(scope, then, f"{path}.then", bdiv, gdiv)
            _check_body(scope, orelse, f"{path}.else", bdiv, gdiv)
        case ir.SyncThreads() if block_div:
            raise _ProblemError("__syncthreads inside control flow that differs between threads of a block")
        case ir.GridSync():
            _check_grid_sync(scope, grid_div)
        case ir.Shuffle(var=var, value=value, offset=offset, width=width):
            _check_shuffle(scope, var, value, offset, width)


def _check_grid_sync(scope: _Scope, grid_div: bool) -> None:
    launch = scope.kernel.launch
    if launch.grid > launch.max_coresident_blocks:
        raise _ProblemError(
            f"grid barrier with {launch.grid} blocks but only {launch.max_coresident_blocks} can be co-resident"
            " (it would deadlock)"
        )
    if grid_div:
        raise _ProblemError("grid barrier inside control flow that differs between threads or blocks")


def _check_for(scope: _Scope, var: ir.Var, bounds: tuple[ir.Expr, ...]) -> None:
    if var.dtype not in _INTS:
        raise _ProblemError(f"loop variable {var.name!r} must be an integer, not {var.dtype.value}")
    for bound in bounds:
        _expect(scope, bound, var.dtype, "loop bound")
    if isinstance(bounds[2], ir.Const) and int(bounds[2].value) <= 0:
        raise _ProblemError("loop step must be positive")
    _define(scope, var)


def _check_shuffle(scope: _Scope, var: ir.Var, value: ir.Expr, offset: int, width: int) -> None:
    if width not in (1, 2, 4, 8, 16, 32) or not 0 < offset < max(width, 2):
        raise _ProblemError(f"shuffle width {width} must be a power of two <= 32 and offset {offset} in (0, width)")
    _expect(scope, value, var.dtype, "shuffled value")
    _define(scope, var)


def _check_target(scope: _Scope, stmt: ir.Stmt, buf: ir.AnyBuffer, index: ir.Expr, value: ir.Expr) -> None:
    _check_buffer(scope, buf)
    if isinstance(buf, ir.Buffer) and buf.role is ir.Role.INPUT:
        raise _ProblemError(f"writes input buffer {buf.name!r} (inputs are read-only)")
    if isinstance(stmt, ir.Atomic) and stmt.op not in ir.ATOMIC_OPS:
        raise _ProblemError(f"atomic op {stmt.op.value} is not one of ADD, MAXIMUM, MINIMUM")
    _check_index(scope, index)
    _expect(scope, value, buf.dtype, f"value stored into {buf.name!r}")


def _check_buffer(scope: _Scope, buf: ir.AnyBuffer) -> None:
    if scope.buffers.get(buf.name) != buf:
        raise _ProblemError(f"buffer {buf.name!r} is not declared by the kernel (or declared differently)")


def _check_index(scope: _Scope, index: ir.Expr) -> None:
    _check_expr(scope, index)
    if index.dtype not in _INTS:
        raise _ProblemError(f"index has dtype {index.dtype.value}; must be an integer")


def _define(scope: _Scope, var: ir.Var) -> None:
    known = scope.var_types.setdefault(var.name, var.dtype)
    if known is not var.dtype:
        raise _ProblemError(f"variable {var.name!r} is {var.dtype.value} here but {known.value} elsewhere")


def _expect(scope: _Scope, expr: ir.Expr, dtype: DType, what: str) -> None:
    _check_expr(scope, expr)
    if expr.dtype is not dtype:
        raise _ProblemError(f"dtype mismatch: {what} is {expr.dtype.value}, expected {dtype.value}")


def _check_expr(scope: _Scope, expr: ir.Expr) -> None:
    for part in sub_exprs(expr):
        _check_node(scope, part)


def _check_node(scope: _Scope, expr: ir.Expr) -> None:
    match expr:
        case ir.Var(name=name, dtype=dtype):
            if name not in scope.var_types:
                raise _ProblemError(f"undefined variable {name!r} (read before any assignment)")
            if scope.var_types[name] is not dtype:
                raise _ProblemError(f"variable {name!r} read as {dtype.value} but it is {scope.var_types[name].value}")
        case ir.Load(buffer=buf, index=index):
            _check_buffer(scope, buf)
            if index.dtype not in _INTS:
                raise _ProblemError(f"index into {buf.name!r} has dtype {index.dtype.value}; must be an integer")
        case ir.Unary(op=op, x=x):
            _check_op(op, (x,), 1)
        case ir.Binary(op=op, a=a, b=b):
            _check_op(op, (a, b), 2)
        case ir.Select(cond=c, a=a, b=b):
            if c.dtype is not DType.BOOL or a.dtype is not b.dtype:
                raise _ProblemError(f"select needs a bool condition and equal branch dtypes, got {_types(c, a, b)}")


def _check_op(op: Op | ir.IndexOp, args: tuple[ir.Expr, ...], arity: int) -> None:
    if isinstance(op, ir.IndexOp):
        if args[0].dtype not in _INTS or args[1].dtype is not args[0].dtype:
            raise _ProblemError(f"{op.value} needs two operands of one integer dtype, got {_types(*args)}")
        return
    if op.arity != arity or not op.is_elementwise or op in (Op.CAST, Op.SELECT):
        raise _ProblemError(f"{op.value} is not a {arity}-operand element-wise op (use Cast/Select nodes for those)")
    if len({a.dtype for a in args}) != 1:
        raise _ProblemError(f"dtype mismatch: {op.value} operands are {_types(*args)}")
    dtype = args[0].dtype
    if op in LOGICAL and dtype is not DType.BOOL:
        raise _ProblemError(f"{op.value} needs bool operands, got {_types(*args)}")
    if op in FLOAT_ONLY and op is not Op.DIV and not dtype.is_float:
        raise _ProblemError(f"{op.value} needs floating-point operands, got {_types(*args)}")
    if dtype is DType.BOOL and op not in LOGICAL and op not in COMPARISONS:
        raise _ProblemError(f"{op.value} is not defined on bool operands")


def _types(*exprs: ir.Expr) -> str:
    return ", ".join(e.dtype.value for e in exprs)
