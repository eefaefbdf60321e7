"""The kernels the CUDA tests render: every suite case and every workload cluster planned for the H200
and lowered, plus building blocks.

Not a test module: a helper the tests import. Kernels are renamed after their case or cluster
file so that they can share one translation unit.
"""

from __future__ import annotations

import functools

from benchmarks.kernel_resources import MODELS, SUITE, WORKLOADS, suite_kernels, workload_kernels
from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import blocks, ir
from stitchfleet.compiler.targets.cuda.render import render_module

# the suite and workload kernels are the benchmark's own (one definition for the CI gate and these tests)
__all__ = ["MODELS", "SUITE", "WORKLOADS", "suite_kernels", "unit", "workload_kernels"]


@functools.cache
def unit(which: str) -> tuple[tuple[ir.Kernel, ...], str]:
    """The kernels of "suite" or of one workload model and their one translation unit, made once per process:
    the nvcc and NVRTC tests build the same unit for up to four archs, and planning and rendering it takes
    seconds (render_module is most of it)."""
    kernels = tuple(suite_kernels() if which == "suite" else workload_kernels(which))
    return kernels, render_module(list(kernels))


def _launch(grid: int = 4, block: int = 128) -> ir.Launch:
    return ir.Launch(grid, block, max_coresident_blocks=8)


def block_kernels() -> list[ir.Kernel]:
    """Building-block kernels: grid reduce (grid barrier), atomics of each kind, column tile, shuffles."""
    f32, n = DType.F32, 1000
    x = ir.Buffer("x", f32, n, ir.Role.INPUT)
    out = ir.Buffer("y", f32, 1, ir.Role.OUTPUT)
    part = ir.Buffer("part", f32, 4, ir.Role.SCRATCH)
    smem = ir.SharedBuffer("warps", f32, 4)
    acc, i = ir.Var("acc", f32), ir.Var("i", DType.I64)
    load = (ir.Assign(acc, ir.add(acc, ir.Load(x, i))),)
    reduce_body = (
        ir.Assign(acc, ir.const(0, f32)),
        blocks.grid_stride_loop(i, ir.i64(n), load),
        *blocks.grid_reduce(acc, Op.ADD, part, smem, 128),
        ir.If(ir.eq(ir.global_thread_index(), ir.i64(0)), (ir.Store(out, ir.i64(0), acc),)),
    )
    kernels = [ir.Kernel("block_grid_reduce", (x, out, part), (smem,), _launch(), reduce_body)]
    for dtype in (DType.F32, DType.F16, DType.BF16, DType.F64, DType.I32, DType.I64):
        for op in (Op.ADD, Op.MAXIMUM, Op.MINIMUM):
            src = ir.Buffer("src", dtype, n, ir.Role.INPUT)
            dst = ir.Buffer("dst", dtype, 1, ir.Role.OUTPUT)
            body = (blocks.grid_stride_loop(i, ir.i64(n), (ir.Atomic(op, dst, ir.i64(0), ir.Load(src, i)),)),)
            name = f"block_atomic_{op.value.lower()}_{dtype.value}"
            kernels.append(ir.Kernel(name, (src, dst), (), _launch(), body))
    return [*kernels, large_smem_kernel()]


def scale_kernel(n: int = 4096) -> ir.Kernel:
    """y = 2x over `n` floats in a grid-stride loop: the renderer makes it 16-byte vector accesses."""
    x = ir.Buffer("x", ir.DType.F32, n, ir.Role.INPUT)
    y = ir.Buffer("y", ir.DType.F32, n, ir.Role.OUTPUT)
    i = ir.Var("i", ir.DType.I64)
    body = (ir.Store(y, i, ir.mul(ir.Load(x, i), ir.const(2.0, ir.DType.F32))),)
    loop = ir.For(i, ir.global_thread_index(), ir.i64(n), ir.mul(ir.BLOCK_DIM, ir.GRID_DIM), body)
    return ir.Kernel("scale", (x, y), (), ir.Launch(8, 128, 8), (loop,))


LARGE_TILE = 16 * 1024  # floats: 64 KiB of shared memory per block, past the 48 KiB static limit


def large_smem_kernel(tiles: int = 2) -> ir.Kernel:
    """Each block stages a 64 KiB tile of x in shared memory and writes it reversed: the renderer carves it
    from dynamic shared memory (`extern __shared__`), which a launch must opt in to past 48 KiB."""
    f32 = ir.DType.F32
    n = tiles * LARGE_TILE
    x, y = ir.Buffer("x", f32, n, ir.Role.INPUT), ir.Buffer("y", f32, n, ir.Role.OUTPUT)
    tile = ir.SharedBuffer("tile", f32, LARGE_TILE)
    i = ir.Var("i", ir.DType.I64)
    base = ir.mul(ir.BLOCK_IDX, ir.i64(LARGE_TILE))
    stage = ir.For(
        i, ir.THREAD_IDX, ir.i64(LARGE_TILE), ir.BLOCK_DIM, (ir.Store(tile, i, ir.Load(x, ir.add(base, i))),)
    )
    mirrored = ir.Load(tile, ir.sub(ir.i64(LARGE_TILE - 1), i))
    write = ir.For(i, ir.THREAD_IDX, ir.i64(LARGE_TILE), ir.BLOCK_DIM, (ir.Store(y, ir.add(base, i), mirrored),))
    launch = ir.Launch(tiles, 1024, tiles, shared_limit_bytes=227 * 1024)
    return ir.Kernel("block_large_smem", (x, y), (tile,), launch, (stage, ir.SyncThreads(), write))
