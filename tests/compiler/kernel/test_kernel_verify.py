"""The kernel IR verifier and printer: each rejection names kernel and statement."""

from __future__ import annotations

import pytest

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import (
    BLOCK_DIM,
    BLOCK_IDX,
    GRID_DIM,
    THREAD_IDX,
    Assign,
    Binary,
    Buffer,
    Cast,
    For,
    GridSync,
    If,
    Kernel,
    KernelError,
    Launch,
    Load,
    Role,
    SharedBuffer,
    Shuffle,
    Store,
    SyncThreads,
    Var,
    blocks,
    const,
    global_thread_index,
    i64,
    lt,
    mul,
    print_kernel,
    verify,
)
from stitchfleet.compiler.kernel.ir import Stmt

X = Buffer("x", DType.F32, 1000, Role.INPUT)
Y = Buffer("y", DType.F32, 1000, Role.OUTPUT)
IX = Var("i", DType.I64)
V = Var("v", DType.F32)


def _kernel(*body: Stmt, grid: int = 4, block: int = 128, coresident: int = 8, shared: int = 0) -> Kernel:
    smem = (SharedBuffer("sh", DType.F32, shared),) if shared else ()
    return Kernel("k", (X, Y), smem, Launch(grid, block, coresident), tuple(body))


def _scale_loop() -> For:
    return For(
        IX,
        global_thread_index(),
        i64(1000),
        mul(BLOCK_DIM, GRID_DIM),
        (Store(Y, IX, mul(Load(X, IX), const(2, DType.F32))),),
    )


def test_valid_kernel_prints_stably() -> None:
    kernel = _kernel(_scale_loop(), GridSync())
    verify(kernel)
    text = print_kernel(kernel)
    assert text == print_kernel(_kernel(_scale_loop(), GridSync()))
    assert "for (i64 i = ((blockIdx.x * blockDim.x) + threadIdx.x); i < 1000;" in text
    assert "y[i] = (x[i] * 2.0f);" in text and "grid.sync();" in text


@pytest.mark.parametrize(
    ("body", "kwargs", "needle"),
    [
        ((Assign(V, Binary(Op.ADD, V, const(1, DType.F32))),), {}, "undefined variable 'v'"),
        ((If(lt(THREAD_IDX, i64(5)), (SyncThreads(),)),), {}, "__syncthreads inside control flow"),
        ((If(lt(BLOCK_IDX, i64(1)), (GridSync(),)),), {}, "grid barrier inside control flow"),
        ((GridSync(),), {"grid": 9, "coresident": 8}, "only 8 can be co-resident"),
        ((Store(Y, i64(0), Cast(i64(1), DType.F64)),), {}, "dtype mismatch"),
        ((Assign(V, Binary(Op.ADD, const(1, DType.F32), const(1, DType.F64))),), {}, "dtype mismatch"),
        ((Store(X, i64(0), const(1, DType.F32)),), {}, "writes input buffer 'x'"),
        ((), {"shared": 20000}, "shared memory 80000 bytes exceeds"),
        ((), {"block": 100}, "multiple of 32"),
        ((Shuffle(V, const(1, DType.F32), 40),), {}, "shuffle width"),
        ((Store(Y, const(0.5, DType.F32), const(1, DType.F32)),), {}, "must be an integer"),
    ],
)
def test_verifier_rejects(body: tuple[Stmt, ...], kwargs: dict[str, int], needle: str) -> None:
    with pytest.raises(KernelError, match="kernel 'k'") as info:
        verify(_kernel(*body, **kwargs))
    assert needle in str(info.value)


def test_error_names_the_statement_and_path() -> None:
    body = (_scale_loop(), If(lt(THREAD_IDX, i64(5)), (Assign(IX, i64(0)), SyncThreads())))
    with pytest.raises(KernelError) as info:
        verify(_kernel(*body))
    assert "statement `__syncthreads();` at body[1].then[1]" in str(info.value)


def test_barrier_under_variable_derived_from_thread_index_is_divergent() -> None:
    tid = Var("t", DType.I64)
    body = (Assign(tid, THREAD_IDX), If(lt(tid, i64(3)), (SyncThreads(),)))
    with pytest.raises(KernelError, match="__syncthreads inside"):
        verify(_kernel(*body))


def test_block_uniform_branch_allows_barrier() -> None:
    verify(_kernel(If(lt(BLOCK_IDX, i64(2)), (SyncThreads(),))))


def test_undeclared_buffer_is_rejected() -> None:
    other = Buffer("z", DType.F32, 4, Role.OUTPUT)
    with pytest.raises(KernelError, match="'z' is not declared"):
        verify(_kernel(Store(other, i64(0), const(1, DType.F32))))


def test_loop_carried_thread_variance_is_found() -> None:
    """`u` becomes thread-variant only through a later assignment in the loop body: a fixed point."""
    u, j = Var("u", DType.I64), Var("j", DType.I64)
    loop = For(j, i64(0), i64(3), i64(1), (If(lt(u, i64(1)), (SyncThreads(),)), Assign(u, THREAD_IDX)))
    with pytest.raises(KernelError, match="__syncthreads inside"):
        verify(_kernel(Assign(u, i64(0)), loop))


def test_block_reduce_kernel_prints_as_cuda_like_code() -> None:
    acc, red = Var("acc", DType.F32), SharedBuffer("red", DType.F32, 4)
    body = (
        Assign(acc, const(0, DType.F32)),
        blocks.grid_stride_loop(IX, i64(1000), (Assign(acc, Binary(Op.ADD, acc, Load(X, IX))),)),
        *blocks.block_reduce(acc, Op.ADD, red, 128),
        blocks.atomic_combine(acc, Op.ADD, Y, i64(0)),
    )
    kernel = Kernel("sum", (X, Y), (red,), Launch(4, 128, 8), body)
    verify(kernel)
    lines = print_kernel(kernel).splitlines()
    assert lines[:4] == [
        "kernel sum(in f32 x[1000], out f32 y[1000])",
        "  launch grid=4 block=128 coresident<=8 dynamic_smem=0",
        "{",
        "  __shared__ f32 red[4];",
    ]
    assert "  f32 acc_shfl = __shfl_xor_sync(active, acc, 16, 32);" in lines
    assert "    atomicAdd(&y[0], acc);" in lines and lines.count("  __syncthreads();") == 2
    assert kernel.param("y") is Y and kernel.shared_bytes == 16
    with pytest.raises(KeyError, match="no parameter 'z'"):
        kernel.param("z")
