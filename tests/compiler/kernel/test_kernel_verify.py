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
