"""The sim catches what a GPU would get wrong silently, naming kernel and statement; correct twins pass."""

from __future__ import annotations

import numpy as np
import pytest

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import (
    BLOCK_IDX,
    GRID_DIM,
    LANE,
    THREAD_IDX,
    WARP,
    Assign,
    Binary,
    Buffer,
    Cast,
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
    add,
    blocks,
    const,
    div,
    eq,
    global_thread_index,
    i64,
    lt,
    mod,
    verify,
)
from stitchfleet.compiler.kernel.ir import Stmt
from stitchfleet.compiler.targets.sim.interpreter import SimBackend, SimError, run

F32 = DType.F32
X = Buffer("x", F32, 256, Role.INPUT)
Y = Buffer("y", F32, 256, Role.OUTPUT)
P = Buffer("p", F32, 4, Role.SCRATCH)
SH = SharedBuffer("sh", F32, 128)
V = Var("v", F32)
LEADER = eq(THREAD_IDX, i64(0))
DATA = {"x": np.arange(256, dtype=np.float32)}


def _kernel(*body: Stmt, grid: int = 2, block: int = 128, coresident: int = 4) -> Kernel:
    return Kernel("probe", (X, Y, P), (SH,), Launch(grid, block, coresident), tuple(body))


def _fails(kernel: Kernel, needle: str, statement: str, *, check: bool = True) -> None:
    with pytest.raises(SimError) as info:
        run([kernel], DATA, check=check)
    text = str(info.value)
    assert "kernel 'probe'" in text and f"`{statement}" in text and needle in text, text


def _neighbour_read(*barrier: Stmt) -> Kernel:
    """Each thread publishes x to shared memory and reads its right neighbour's slot."""
    return _kernel(
        Store(SH, THREAD_IDX, Load(X, global_thread_index())),
        *barrier,
        Store(Y, global_thread_index(), Load(SH, mod(add(THREAD_IDX, i64(1)), i64(128)))),
    )


def test_missing_barrier_between_shared_write_and_other_threads_read() -> None:
    _fails(_neighbour_read(), "shared memory race", "y[((blockIdx.x * blockDim.x) + threadIdx.x)] = ")
    got = run([_neighbour_read(SyncThreads())], DATA)["y"].reshape(2, 128)
    assert np.array_equal(got, np.roll(DATA["x"].reshape(2, 128), -1, axis=1))


def _warp_partials(*barrier: Stmt) -> Kernel:
    """Warp leaders publish, then warp 0 reads all warps' slots: needs the barrier before the read."""
    return _kernel(
        Assign(V, Load(X, global_thread_index())),
        If(eq(LANE, i64(0)), (Store(SH, WARP, V),)),
        *barrier,
        If(lt(THREAD_IDX, i64(4)), (Store(Y, add(BLOCK_IDX, THREAD_IDX), Load(SH, THREAD_IDX)),)),
    )


def test_shared_read_before_barrier() -> None:
    _fails(_warp_partials(), "reads sh[1] written by thread 32", "y[(blockIdx.x + threadIdx.x)] = sh[threadIdx.x];")
    with pytest.raises(SimError, match="write-write race"):  # correct barriers, but the output slots overlap
        run([_warp_partials(SyncThreads())], DATA)


def test_read_of_shared_memory_nobody_wrote() -> None:
    kernel = _kernel(SyncThreads(), Assign(V, Load(SH, THREAD_IDX)))
    _fails(kernel, "uninitialised shared sh[0]", "v = sh[threadIdx.x];")


def test_write_after_other_threads_read_without_barrier() -> None:
    publish = (*blocks.broadcast_shared(V, SH, i64(0), LEADER)[:3],)  # the trailing barrier dropped
    kernel = _kernel(Assign(V, const(1, F32)), *publish, If(LEADER, (Store(SH, i64(0), const(2, F32)),)))
    _fails(kernel, "accessed by several threads", "sh[0] = 2.0f;")
    good = _kernel(
        Assign(V, const(1, F32)), *blocks.broadcast_shared(V, SH, i64(0), LEADER), If(LEADER, (Store(SH, i64(0), V),))
    )
    run([good], DATA)


def test_global_write_write_race() -> None:
    same_step = _kernel(Store(Y, i64(7), const(1, F32)))
    _fails(same_step, "write-write race", "y[7] = 1.0f;")
    across_blocks = _kernel(
        If(eq(global_thread_index(), i64(0)), (Store(Y, i64(7), const(1, F32)),)),
        If(eq(global_thread_index(), i64(128)), (Store(Y, i64(7), const(2, F32)),)),
    )
    _fails(across_blocks, "cross-block write", "y[7] = 2.0f;")
    atomics = _kernel(blocks.atomic_combine(const(1, F32), Op.ADD, Y, i64(7), writer=const(True, DType.BOOL)))
    assert run([atomics], DATA)["y"][7] == 256


def test_same_block_global_write_then_read_needs_syncthreads() -> None:
    def kernel(*barrier: Stmt) -> Kernel:
        mine = add(Binary(Op.MUL, BLOCK_IDX, i64(128)), THREAD_IDX)
        other = add(Binary(Op.MUL, BLOCK_IDX, i64(128)), mod(add(THREAD_IDX, i64(1)), i64(128)))
        return _kernel(Store(Y, mine, const(3, F32)), *barrier, Assign(V, Load(Y, other)))

    _fails(kernel(), "no __syncthreads", "v = y[")
    run([kernel(SyncThreads())], DATA)


def _cross_block(*barrier: Stmt) -> Kernel:
    return _kernel(
        If(LEADER, (Store(P, BLOCK_IDX, Load(X, BLOCK_IDX)),)),
        *barrier,
        Assign(V, Load(P, mod(add(BLOCK_IDX, i64(1)), GRID_DIM))),
        Store(Y, global_thread_index(), V),
    )


def test_cross_block_read_without_grid_barrier() -> None:
    _fails(_cross_block(), "cross-block read", "v = p[((blockIdx.x + 1) % gridDim.x)];")
    got = run([_cross_block(GridSync())], DATA)["y"]
    assert np.array_equal(got, np.repeat([1.0, 0.0], 128).astype(np.float32))


@pytest.mark.parametrize(
    ("stmt", "text"),
    [
        (
            Assign(V, Load(X, add(global_thread_index(), i64(1)))),
            "v = x[(((blockIdx.x * blockDim.x) + threadIdx.x) + 1)];",
        ),
        (
            Store(Y, Binary(Op.SUB, global_thread_index(), i64(1)), const(0, F32)),
            "y[(((blockIdx.x * blockDim.x) + threadIdx.x) - 1)] = 0.0f;",
        ),
        (Store(SH, add(THREAD_IDX, i64(1)), const(0, F32)), "sh[(threadIdx.x + 1)] = 0.0f;"),
    ],
)
def test_out_of_bounds_access(stmt: Stmt, text: str) -> None:
    _fails(_kernel(stmt), "out-of-bounds index", text)


def test_in_bounds_guarded_access_passes() -> None:
    guarded = If(
        lt(global_thread_index(), i64(255)),
        (Store(Y, global_thread_index(), Load(X, add(global_thread_index(), i64(1)))),),
    )
    assert run([_kernel(guarded)], DATA)["y"][254] == 255


def _half_warp_shuffle(offset: int, width: int) -> Kernel:
    shuffle = Shuffle(V, Load(X, global_thread_index()), offset, width=width)
    return _kernel(If(lt(LANE, i64(16)), (shuffle, Store(Y, global_thread_index(), V))))


def test_shuffle_from_inactive_lane() -> None:
    _fails(
        _half_warp_shuffle(16, 32),
        "inactive",
        "v = __shfl_down_sync(active, x[((blockIdx.x * blockDim.x) + threadIdx.x)], 16, 32);",
    )
    got = run([_half_warp_shuffle(8, 16)], DATA)["y"]  # 16-lane segments: lanes 8..15 keep their own value
    assert (got[0], got[7], got[8], got[15]) == (8, 15, 8, 15)


def test_divergent_barrier() -> None:
    kernel = _kernel(If(lt(THREAD_IDX, i64(64)), (SyncThreads(),)))
    with pytest.raises(KernelError, match="__syncthreads inside control flow"):
        verify(kernel)
    _fails(kernel, "invalid kernel", "__syncthreads();")
    _fails(kernel, "only 64 of 128 threads of block 0", "__syncthreads();", check=False)
    run([_kernel(If(lt(BLOCK_IDX, i64(1)), (SyncThreads(),)))], DATA)


def test_grid_barrier_over_coresident_limit() -> None:
    kernel = _kernel(GridSync(), grid=8, coresident=4)
    _fails(kernel, "only 4 can be co-resident", "grid.sync();")
    _fails(kernel, "only 4 can be co-resident: deadlock", "grid.sync();", check=False)
    run([_kernel(GridSync(), grid=4, coresident=4)], DATA)


def test_divergent_grid_barrier() -> None:
    kernel = _kernel(If(lt(BLOCK_IDX, i64(1)), (GridSync(),)))
    _fails(kernel, "only 128 of 256 threads", "grid.sync();", check=False)


def test_uninitialised_variable_and_integer_division_by_zero() -> None:
    n = Var("n", DType.I64)
    unset = _kernel(If(LEADER, (Assign(V, const(1, F32)),)), Store(Y, global_thread_index(), V))
    _fails(unset, "reads variable 'v' before assigning it", "y[((blockIdx.x * blockDim.x) + threadIdx.x)] = v;")
    _fails(_kernel(Assign(n, div(i64(1), Binary(Op.SUB, THREAD_IDX, THREAD_IDX)))), "integer DIV by zero", "n = ")


def test_bad_program_buffers_are_named() -> None:
    kernel = _kernel(Store(Y, THREAD_IDX, Load(X, THREAD_IDX)))
    with pytest.raises(SimError, match="missing input buffer 'x'"):
        run([kernel], {})
    with pytest.raises(SimError, match="buffer 'x': got float64"):
        run([kernel], {"x": np.zeros(256)})
    with pytest.raises(SimError, match="unknown buffer"):
        run([kernel], {**DATA, "z": np.zeros(3)})


def test_program_buffers_must_agree_across_kernels() -> None:
    first = _kernel(Store(Y, THREAD_IDX, const(1, F32)))
    other_y = Buffer("y", DType.F64, 256, Role.OUTPUT)
    second = Kernel(
        "later",
        (X, other_y),
        (),
        Launch(2, 128, 4),
        (Store(other_y, THREAD_IDX, Cast(Load(X, THREAD_IDX), DType.F64)),),
    )
    with pytest.raises(
        SimError, match="kernel 'later': buffer 'y' is f64\\[256\\] but an earlier kernel declares it f32\\[256\\]"
    ):
        SimBackend().compile([first, second])
    with pytest.raises(SimError, match="invalid kernel: kernel 'probe'"):
        SimBackend().compile([_kernel(GridSync(), grid=8)])
