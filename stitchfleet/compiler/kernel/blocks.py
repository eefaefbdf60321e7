"""Building blocks the stitch lowering composes into kernels: loops, reductions, broadcasts.

Input: the variables, buffers and expressions of the kernel being built. Output:
statements (a `For`, or a tuple of statements to splice into a body). Each block
states what it assumes and what it leaves behind, e.g. `block_reduce` leaves the
block's result in `acc` of every thread and the scratch buffer free for reuse.
- loops: grid-stride over elements, block/warp/grid-uniform task loops (vertical packing: a
  block or warp loops over tasks), block/lane stride loops over one task's elements;
- reductions: `warp_reduce` (shuffles), `block_reduce` (warp shuffles + shared +
  barrier), `grid_reduce` (partials in global scratch + grid barrier), `atomic_combine`;
- broadcasts of a reduced value: `broadcast_shared` (regional) and `broadcast_global`;
- `column_reduce_tile`: a 32-column tile reduced over a row range by a block.
"""

from __future__ import annotations

from collections.abc import Callable

from stitchfleet.compiler.ir.types import DType, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.ir import (
    BLOCK_DIM,
    BLOCK_IDX,
    GRID_DIM,
    LANE,
    THREAD_IDX,
    WARP,
    WARP_SIZE,
    Assign,
    Binary,
    Expr,
    For,
    If,
    Load,
    Stmt,
    Store,
    SyncThreads,
    Var,
    add,
    div,
    eq,
    i64,
    lt,
    mul,
    sub,
)

REDUCE_OPS = frozenset({Op.ADD, Op.MUL, Op.MAXIMUM, Op.MINIMUM})
_INT_LIMITS = {DType.I32: (-(2**31), 2**31 - 1), DType.I64: (-(2**63), 2**63 - 1)}


def identity(op: Op, dtype: DType) -> ir.Const:
    """The neutral element of a reduction op (-inf for MAXIMUM on floats, the type's min on ints)."""
    if op not in REDUCE_OPS:
        raise ValueError(f"{op.value} is not a reduction op (use one of ADD, MUL, MAXIMUM, MINIMUM)")
    if op in (Op.ADD, Op.MUL):
        return ir.const(1 if op is Op.MUL else 0, dtype)
    if dtype.is_float:
        return ir.const(float("-inf") if op is Op.MAXIMUM else float("inf"), dtype)
    low, high = _INT_LIMITS[dtype]
    return ir.const(low if op is Op.MAXIMUM else high, dtype)


def combine(op: Op, a: Expr, b: Expr) -> Binary:
    return Binary(op, a, b)


# ---- loops ---------------------------------------------------------------------------------


def grid_stride_loop(var: Var, count: Expr, body: tuple[Stmt, ...]) -> For:
    """Every thread of the grid strides over [0, count)."""
    return For(var, ir.global_thread_index(), count, mul(BLOCK_DIM, GRID_DIM), body)


def block_task_loop(task: Var, num_tasks: Expr, body: tuple[Stmt, ...]) -> For:
    """Vertical packing: block b runs tasks b, b + gridDim, ... (block-uniform: barriers allowed inside)."""
    return For(task, BLOCK_IDX, num_tasks, GRID_DIM, body)


def uniform_task_loop(step: Var, task: Var, num_tasks: Expr, body: tuple[Stmt, ...]) -> For:
    """Vertical packing that keeps grid barriers legal: every block runs ceil(tasks / gridDim) steps.

    Step s gives block b the task s * gridDim + b; the last step may hand a block a task
    >= num_tasks, which `body` must treat as empty (e.g. `grid_reduce(valid=...)`).
    """
    steps = div(add(num_tasks, sub(GRID_DIM, i64(1))), GRID_DIM)
    return For(step, i64(0), steps, i64(1), (Assign(task, add(mul(step, GRID_DIM), BLOCK_IDX)), *body))


def warp_task_loop(task: Var, num_tasks: Expr, warps_per_block: int, body: tuple[Stmt, ...]) -> For:
    """Warp per task, several tasks per block (horizontal packing); no __syncthreads inside."""
    first = add(mul(BLOCK_IDX, i64(warps_per_block)), WARP)
    return For(task, first, num_tasks, mul(GRID_DIM, i64(warps_per_block)), body)


def block_stride_loop(var: Var, start: Expr, stop: Expr, body: tuple[Stmt, ...]) -> For:
    """The threads of a block stride over [start, stop)."""
    return For(var, _plus(start, THREAD_IDX), stop, BLOCK_DIM, body)


def lane_stride_loop(var: Var, start: Expr, stop: Expr, body: tuple[Stmt, ...]) -> For:
    """The lanes of a warp stride over [start, stop)."""
    return For(var, _plus(start, LANE), stop, i64(WARP_SIZE), body)


def _plus(start: Expr, index: Expr) -> Expr:
    return index if start == i64(0) else add(start, index)


# ---- reductions ----------------------------------------------------------------------------


def warp_reduce(acc: Var, op: Op, *, width: int = WARP_SIZE) -> tuple[Stmt, ...]:
    """Butterfly (xor) shuffles: every lane of each `width`-lane segment ends with the segment's result."""
    if width not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"warp_reduce width must be a power of two <= 32, got {width}")
    other = Var(f"{acc.name}_shfl", acc.dtype)
    stmts: list[Stmt] = []
    offset = width // 2
    while offset:
        stmts += [ir.Shuffle(other, acc, offset, ir.ShuffleMode.XOR, width), Assign(acc, combine(op, acc, other))]
        offset //= 2
    return tuple(stmts)


def block_reduce(acc: Var, op: Op, scratch: ir.SharedBuffer, block_threads: int) -> tuple[Stmt, ...]:
    """Reduces `acc` over the block; all threads end with the result, `scratch` free again.

    Needs all threads of the block (block-uniform control flow) and scratch of at
    least one element per warp, of acc's dtype.
    """
    warps = block_threads // WARP_SIZE
    if scratch.size < warps or scratch.dtype is not acc.dtype:
        raise ValueError(f"block_reduce needs {warps} {acc.dtype.value} scratch elements, got {scratch}")
    per_warp = If(eq(LANE, i64(0)), (Store(scratch, WARP, acc),))
    gather = If(lt(LANE, i64(warps)), (Assign(acc, Load(scratch, LANE)),), (Assign(acc, identity(op, acc.dtype)),))
    return (*warp_reduce(acc, op), per_warp, SyncThreads(), gather, *warp_reduce(acc, op), SyncThreads())


def grid_reduce(
    acc: Var,
    op: Op,
    partials: ir.Buffer,
    scratch: ir.SharedBuffer,
    block_threads: int,
    *,
    slot: Expr = BLOCK_IDX,
    first: Expr | None = None,
    count: Expr = GRID_DIM,
    valid: Expr | None = None,
) -> tuple[Stmt, ...]:
    """Cross-block combine through global scratch and a grid barrier; every thread ends with the result.

    Each block reduces `acc`, thread 0 writes it to `partials[slot]`, the grid syncs,
    then each block reduces `partials[first : first + count]` (default: all blocks;
    a task split over S blocks passes its own S slots). Needs every thread of the
    grid here (grid-uniform control flow) and blocks <= max_coresident_blocks. A block
    whose `valid` is false (an empty task of `uniform_task_loop`) joins the barriers
    only. Reusing a slot in a later step needs a grid barrier after this one's reads.
    """
    start = i64(0) if first is None else first
    if valid is not None:
        count = ir.Select(valid, count, i64(0))
    leader = eq(THREAD_IDX, i64(0))
    writer = leader if valid is None else Binary(Op.LOGICAL_AND, leader, valid)
    j = Var(f"{acc.name}_part", DType.I64)
    gather = block_stride_loop(j, start, add(start, count), (Assign(acc, combine(op, acc, Load(partials, j))),))
    return (
        *block_reduce(acc, op, scratch, block_threads),
        If(writer, (Store(partials, slot, acc),)),
        ir.GridSync(),
        Assign(acc, identity(op, acc.dtype)),
        gather,
        *block_reduce(acc, op, scratch, block_threads),
    )


def atomic_combine(acc: Expr, op: Op, target: ir.Buffer, index: Expr, writer: Expr | None = None) -> If:
    """`writer` (default: thread 0 of the block) folds `acc` into target[index] atomically.

    The target must start at the identity (the runtime zeroes scratch and outputs, right for ADD).
    """
    return If(writer if writer is not None else eq(THREAD_IDX, i64(0)), (ir.Atomic(op, target, index, acc),))


# ---- broadcasts ----------------------------------------------------------------------------


def broadcast_shared(var: Var, scratch: ir.SharedBuffer, slot: Expr, writer: Expr) -> tuple[Stmt, ...]:
    """Regional scheme: the `writer` thread's `var` reaches every thread of its block via shared memory."""
    return (If(writer, (Store(scratch, slot, var),)), SyncThreads(), Assign(var, Load(scratch, slot)), SyncThreads())


def broadcast_global(
    var: Var, buffer: ir.Buffer, slot: Expr, writer: Expr, read_slot: Expr | None = None
) -> tuple[Stmt, ...]:
    """Global scheme: `writer` stores `var` to `buffer[slot]`; after a grid barrier all read `read_slot`."""
    source = slot if read_slot is None else read_slot
    return (If(writer, (Store(buffer, slot, var),)), ir.GridSync(), Assign(var, Load(buffer, source)))


# ---- column reduction ----------------------------------------------------------------------


def column_reduce_tile(
    acc: Var,
    op: Op,
    *,
    value_at: Callable[[Expr, Expr], Expr],
    tile: tuple[Expr, Expr, Expr, Expr],
    scratch: ir.SharedBuffer,
    block_threads: int,
    emit: Callable[[Expr, Var], tuple[Stmt, ...]],
) -> tuple[Stmt, ...]:
    """A block reduces 32 columns [col0, col0 + 32) over rows [row0, row1) of a `cols`-wide matrix.

    `tile` is (col0, row0, row1, cols); lane = column in the tile, warp = row phase.
    `value_at(row, col)` gives an element; `emit(col, acc)` runs in warp 0 for each
    valid column with the tile's result. Needs block-uniform control flow and scratch
    of block_threads elements; leaves scratch free.
    """
    col0, row0, row1, cols = tile
    warps = block_threads // WARP_SIZE
    if scratch.size < block_threads or scratch.dtype is not acc.dtype:
        raise ValueError(f"column_reduce_tile needs {block_threads} {acc.dtype.value} scratch elements")
    col = Var(f"{acc.name}_col", DType.I64)
    row = Var(f"{acc.name}_row", DType.I64)
    w = Var(f"{acc.name}_w", DType.I64)
    valid = lt(col, cols)
    rows = For(row, add(row0, WARP), row1, i64(warps), (Assign(acc, combine(op, acc, value_at(row, col))),))
    fold = For(
        w, i64(0), i64(warps), i64(1), (Assign(acc, combine(op, acc, Load(scratch, add(mul(w, i64(32)), LANE)))),)
    )
    final = If(eq(WARP, i64(0)), (Assign(acc, identity(op, acc.dtype)), fold, If(valid, emit(col, acc))))
    return (
        Assign(col, add(col0, LANE)),
        Assign(acc, identity(op, acc.dtype)),
        If(valid, (rows,)),
        Store(scratch, THREAD_IDX, acc),
        SyncThreads(),
        final,
        SyncThreads(),
    )
