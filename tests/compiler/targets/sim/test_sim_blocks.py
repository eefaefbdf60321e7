"""Building blocks composed into kernels, run on sim, checked against numpy with the tolerance rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import (
    BLOCK_IDX,
    LANE,
    THREAD_IDX,
    Assign,
    Binary,
    Buffer,
    Expr,
    If,
    Kernel,
    Launch,
    Load,
    Role,
    Select,
    SharedBuffer,
    Store,
    Unary,
    Var,
    add,
    blocks,
    const,
    div,
    eq,
    i64,
    mod,
    mul,
    sub,
    verify,
)
from stitchfleet.compiler.kernel.ir import Stmt
from stitchfleet.compiler.targets.sim.interpreter import SimBackend, SimError, run
from stitchfleet.compiler.tolerance import check

F32 = DType.F32
Array = npt.NDArray[Any]
ACC = Var("acc", F32)
ROW = Var("row", DType.I64)
COL = Var("c", DType.I64)


def _assert_close(got: Array, native: Array, reference: Array) -> None:
    output_check = check(got, native, reference)
    assert output_check.ok, output_check.reason


def _buf(name: str, size: int, role: Role = Role.INPUT, dtype: DType = F32) -> Buffer:
    return Buffer(name, dtype, size, role)


def _kernel(
    name: str, params: tuple[Buffer, ...], shared: tuple[SharedBuffer, ...], launch: Launch, *body: Stmt
) -> Kernel:
    kernel = Kernel(name, params, shared, launch, tuple(body))
    verify(kernel)
    return kernel


def _rand(shape: tuple[int, ...], seed: int = 0) -> Array:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n", [1, 31, 1000, 4099])
def test_grid_stride_elementwise(n: int) -> None:
    x, y = _buf("x", n), _buf("y", n, Role.OUTPUT)
    i = Var("i", DType.I64)
    body = (Store(y, i, mul(Unary(Op.EXP, Load(x, i)), const(2, F32))),)
    kernel = _kernel("ew", (x, y), (), Launch(3, 64, 8), blocks.grid_stride_loop(i, i64(n), body))
    data = _rand((n,))
    _assert_close(run([kernel], {"x": data})["y"], np.exp(data) * 2, np.exp(data.astype(np.float64)) * 2)


def _row_span(cols: int) -> tuple[Expr, Expr]:
    start = mul(ROW, i64(cols))
    return start, add(start, i64(cols))


@pytest.mark.parametrize(("rows", "cols"), [(5, 7), (37, 33), (64, 100)])
def test_warp_per_row_reduce_and_register_broadcast(rows: int, cols: int) -> None:
    x, y, sums = _buf("x", rows * cols), _buf("y", rows * cols, Role.OUTPUT), _buf("sums", rows, Role.OUTPUT)
    m = Var("m", F32)
    start, stop = _row_span(cols)
    row_body = (
        Assign(m, blocks.identity(Op.MAXIMUM, F32)),
        Assign(ACC, const(0, F32)),
        blocks.lane_stride_loop(COL, start, stop, (Assign(m, Binary(Op.MAXIMUM, m, Load(x, COL))),)),
        blocks.lane_stride_loop(COL, start, stop, (Assign(ACC, add(ACC, Load(x, COL))),)),
        *blocks.warp_reduce(m, Op.MAXIMUM),
        *blocks.warp_reduce(ACC, Op.ADD),
        If(eq(LANE, i64(0)), (Store(sums, ROW, ACC),)),
        blocks.lane_stride_loop(COL, start, stop, (Store(y, COL, sub(Load(x, COL), m)),)),
    )
    grid = min(-(-rows // 4), 3)  # fewer blocks than tasks: vertical packing
    kernel = _kernel(
        "warp_rows", (x, y, sums), (), Launch(grid, 128, 8), blocks.warp_task_loop(ROW, i64(rows), 4, row_body)
    )
    data = _rand((rows, cols), 1)
    out = run([kernel], {"x": data})
    wide = data.astype(np.float64)
    _assert_close(out["y"].reshape(rows, cols), data - data.max(1, keepdims=True), wide - wide.max(1, keepdims=True))
    _assert_close(out["sums"], data.sum(1), wide.sum(1))


@pytest.mark.parametrize(("rows", "cols", "grid"), [(3, 1000, 3), (10, 257, 4), (7, 31, 2)])
def test_block_per_row_reduce_and_shared_broadcast(rows: int, cols: int, grid: int) -> None:
    x, y = _buf("x", rows * cols), _buf("y", rows * cols, Role.OUTPUT)
    red, bcast = SharedBuffer("red", F32, 4), SharedBuffer("bcast", F32, 1)
    first = Var("first", F32)
    start, stop = _row_span(cols)
    leader = eq(THREAD_IDX, i64(0))
    row_body = (
        Assign(ACC, const(0, F32)),
        blocks.block_stride_loop(COL, start, stop, (Assign(ACC, add(ACC, Load(x, COL))),)),
        *blocks.block_reduce(ACC, Op.ADD, red, 128),
        If(leader, (Assign(first, Load(x, start)),)),
        *blocks.broadcast_shared(first, bcast, i64(0), leader),
        blocks.block_stride_loop(COL, start, stop, (Store(y, COL, sub(div(Load(x, COL), ACC), first)),)),
    )
    launch = Launch(grid, 128, 8)
    kernel = _kernel("block_rows", (x, y), (red, bcast), launch, blocks.block_task_loop(ROW, i64(rows), row_body))
    data = np.abs(_rand((rows, cols), 2)) + 0.5
    wide = data.astype(np.float64)
    got = run([kernel], {"x": data})["y"].reshape(rows, cols)
    _assert_close(got, data / data.sum(1, keepdims=True) - data[:, :1], wide / wide.sum(1, keepdims=True) - wide[:, :1])


@pytest.mark.parametrize(("rows", "cols", "split"), [(3, 5000, 4), (2, 999, 3), (1, 64, 2)])
def test_task_split_over_blocks_with_grid_barrier(rows: int, cols: int, split: int) -> None:
    """Few long rows, each split over `split` blocks, on a tiny device where all blocks fit in one wave."""
    grid = rows * split
    x, y, partials = _buf("x", rows * cols), _buf("y", rows * cols, Role.OUTPUT), _buf("part", grid, Role.SCRATCH)
    red = SharedBuffer("red", F32, 2)
    chunk = -(-cols // split)
    row, part = div(BLOCK_IDX, i64(split)), mod(BLOCK_IDX, i64(split))
    lo = add(mul(row, i64(cols)), mul(part, i64(chunk)))
    hi = Binary(Op.MINIMUM, add(lo, i64(chunk)), add(mul(row, i64(cols)), i64(cols)))
    body = (
        Assign(ACC, const(0, F32)),
        blocks.block_stride_loop(COL, lo, hi, (Assign(ACC, add(ACC, Load(x, COL))),)),
        *blocks.grid_reduce(ACC, Op.ADD, partials, red, 64, first=mul(row, i64(split)), count=i64(split)),
        blocks.block_stride_loop(COL, lo, hi, (Store(y, COL, sub(Load(x, COL), div(ACC, const(cols, F32)))),)),
    )
    kernel = _kernel("split_rows", (x, y, partials), (red,), Launch(grid, 64, grid), *body)
    data = _rand((rows, cols), 3)
    wide = data.astype(np.float64)
    got = run([kernel], {"x": data})["y"].reshape(rows, cols)
    _assert_close(got, data - data.mean(1, keepdims=True), wide - wide.mean(1, keepdims=True))


def _full_reduce(n: int, grid: int, *, atomic: bool) -> Kernel:
    x, out, partials = _buf("x", n), _buf("out", 1, Role.OUTPUT), _buf("part", grid, Role.SCRATCH)
    red = SharedBuffer("red", F32, 8)
    i = Var("i", DType.I64)
    accumulate = (Assign(ACC, const(0, F32)), blocks.grid_stride_loop(i, i64(n), (Assign(ACC, add(ACC, Load(x, i))),)))
    if atomic:
        combine: tuple[Stmt, ...] = (
            *blocks.block_reduce(ACC, Op.ADD, red, 256),
            blocks.atomic_combine(ACC, Op.ADD, out, i64(0)),
        )
        return _kernel("sum_atomic", (x, out), (red,), Launch(grid, 256, grid), *accumulate, *combine)
    combine = (
        *blocks.grid_reduce(ACC, Op.ADD, partials, red, 256),
        If(eq(add(BLOCK_IDX, THREAD_IDX), i64(0)), (Store(out, i64(0), ACC),)),
    )
    return _kernel("sum_grid", (x, out, partials), (red,), Launch(grid, 256, grid), *accumulate, *combine)


@pytest.mark.parametrize(("n", "grid"), [(77, 2), (33_333, 5), (1 << 20, 132)])
@pytest.mark.parametrize("atomic", [False, True])
def test_full_reduction_cross_block(n: int, grid: int, atomic: bool) -> None:
    data = _rand((n,), 4)
    got = run([_full_reduce(n, grid, atomic=atomic)], {"x": data})["out"]
    _assert_close(got, data.sum(keepdims=True), data.astype(np.float64).sum(keepdims=True))


def test_broadcast_global_reaches_every_block() -> None:
    n, grid = 1000, 4
    x, y, slot = _buf("x", n), _buf("y", n, Role.OUTPUT), _buf("slot", 1, Role.SCRATCH)
    i, v = Var("i", DType.I64), Var("v", F32)
    body = (
        If(eq(add(BLOCK_IDX, THREAD_IDX), i64(0)), (Assign(v, Load(x, i64(n - 1))),)),
        *blocks.broadcast_global(v, slot, i64(0), eq(add(BLOCK_IDX, THREAD_IDX), i64(0))),
        blocks.grid_stride_loop(i, i64(n), (Store(y, i, mul(Load(x, i), v)),)),
    )
    kernel = _kernel("bcast_global", (x, y, slot), (), Launch(grid, 64, grid), *body)
    data = _rand((n,), 5)
    _assert_close(run([kernel], {"x": data})["y"], data * data[-1], data.astype(np.float64) * np.float64(data[-1]))


@pytest.mark.parametrize(("rows", "cols", "row_chunk"), [(1000, 70, 300), (33, 5, 33), (64, 32, 10)])
def test_column_reduce_tiles(rows: int, cols: int, row_chunk: int) -> None:
    x, out = _buf("x", rows * cols), _buf("out", cols, Role.OUTPUT)
    tile_sh = SharedBuffer("tile", F32, 128)
    tiles, chunks = -(-cols // 32), -(-rows // row_chunk)
    task = Var("task", DType.I64)
    chunk = div(task, i64(tiles))
    row0 = mul(chunk, i64(row_chunk))
    tile = (
        mul(mod(task, i64(tiles)), i64(32)),
        row0,
        Binary(Op.MINIMUM, add(row0, i64(row_chunk)), i64(rows)),
        i64(cols),
    )

    def emit(col: Expr, acc: Var) -> tuple[Stmt, ...]:
        return (blocks.atomic_combine(acc, Op.ADD, out, col, writer=const(True, DType.BOOL)),)

    def value_at(row: Expr, col: Expr) -> Expr:
        return Load(x, add(mul(row, i64(cols)), col))

    step = blocks.column_reduce_tile(
        ACC, Op.ADD, value_at=value_at, tile=tile, scratch=tile_sh, block_threads=128, emit=emit
    )
    kernel = _kernel(
        "col_reduce", (x, out), (tile_sh,), Launch(3, 128, 8), blocks.block_task_loop(task, i64(tiles * chunks), step)
    )
    data = _rand((rows, cols), 6)
    _assert_close(run([kernel], {"x": data})["out"], data.sum(0), data.astype(np.float64).sum(0))


def test_sim_backend_runs_a_program_of_two_kernels() -> None:
    """Global buffers persist between kernels: the second reads what the first wrote."""
    n = 500
    x, mid, y = _buf("x", n), _buf("mid", n, Role.OUTPUT), _buf("y", n, Role.OUTPUT)
    i = Var("i", DType.I64)
    first = _kernel(
        "double",
        (x, mid),
        (),
        Launch(2, 64, 8),
        blocks.grid_stride_loop(i, i64(n), (Store(mid, i, add(Load(x, i), Load(x, i))),)),
    )
    mid_in = Buffer("mid", F32, n, Role.INPUT)
    second = _kernel(
        "square",
        (mid_in, y),
        (),
        Launch(2, 64, 8),
        blocks.grid_stride_loop(i, i64(n), (Store(y, i, mul(Load(mid_in, i), Load(mid_in, i))),)),
    )
    data = _rand((n,), 7)
    out = SimBackend().compile([first, second])({"x": data})
    _assert_close(out["y"], (2 * data) ** 2, (2 * data.astype(np.float64)) ** 2)
    assert set(out) == {"mid", "y"}


def test_identity_rejects_non_reduction_op() -> None:
    with pytest.raises(ValueError, match="EXP is not a reduction op"):
        blocks.identity(Op.EXP, F32)


def _packed_split(rows: int, cols: int, split: int, grid: int, *, slot_per_task: bool) -> Kernel:
    """Row tasks split over blocks, more tasks than co-resident blocks: a grid-uniform task loop."""
    tasks = rows * split
    x, y, partials = _buf("x", rows * cols), _buf("y", rows * cols, Role.OUTPUT), _buf("part", tasks, Role.SCRATCH)
    red = SharedBuffer("red", F32, 2)
    step, task = Var("step", DType.I64), Var("task", DType.I64)
    chunk = -(-cols // split)
    row, part = div(task, i64(split)), mod(task, i64(split))
    valid = Binary(Op.LESS, task, i64(tasks))
    lo = add(mul(row, i64(cols)), mul(part, i64(chunk)))
    hi = Select(valid, Binary(Op.MINIMUM, add(lo, i64(chunk)), add(mul(row, i64(cols)), i64(cols))), lo)
    slot = task if slot_per_task else BLOCK_IDX
    body = (
        Assign(ACC, const(0, F32)),
        blocks.block_stride_loop(COL, lo, hi, (Assign(ACC, add(ACC, Load(x, COL))),)),
        *blocks.grid_reduce(
            ACC, Op.ADD, partials, red, 64, slot=slot, first=mul(row, i64(split)), count=i64(split), valid=valid
        ),
        blocks.block_stride_loop(COL, lo, hi, (Store(y, COL, sub(Load(x, COL), ACC)),)),
    )
    loop = blocks.uniform_task_loop(step, task, i64(tasks), body)
    return _kernel("packed_split", (x, y, partials), (red,), Launch(grid, 64, grid), loop)


@pytest.mark.parametrize(("rows", "cols", "split", "grid"), [(5, 300, 2, 4), (3, 1000, 3, 3), (1, 50, 2, 4)])
def test_vertical_packing_with_grid_barrier_inside(rows: int, cols: int, split: int, grid: int) -> None:
    data = _rand((rows, cols), 8)
    wide = data.astype(np.float64)
    got = run([_packed_split(rows, cols, split, grid, slot_per_task=True)], {"x": data})["y"].reshape(rows, cols)
    _assert_close(got, data - data.sum(1, keepdims=True), wide - wide.sum(1, keepdims=True))


@pytest.mark.parametrize(
    ("split", "grid", "per_task"),
    [
        (2, 4, False),  # slots reused by the next step while other blocks may still read them
        (3, 2, True),  # a row's parts fall in different steps: the combine reads slots not yet written
    ],
)
def test_bad_packing_is_a_write_after_read_race(split: int, grid: int, per_task: bool) -> None:
    with pytest.raises(SimError, match=r"kernel 'packed_split': statement `part\[.*write-after-read race"):
        run([_packed_split(5, 300, split, grid, slot_per_task=per_task)], {"x": _rand((5, 300), 9)})
