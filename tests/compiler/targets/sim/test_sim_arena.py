"""Shared arena views on the sim: typed views at byte offsets share space, and misuse is caught.

A planner reuses shared bytes for values whose lifetimes do not overlap; the sim must
run such reuse exactly (bytes written through one view of one dtype, later through
another) and reject what would be wrong on a GPU: reading a value whose bytes another
view overwrote, and touching overlapping bytes from two threads without a barrier.
"""

from __future__ import annotations

import numpy as np
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import (
    THREAD_IDX,
    Assign,
    Buffer,
    Cast,
    If,
    Kernel,
    KernelError,
    Launch,
    Load,
    Role,
    SharedBuffer,
    Store,
    SyncThreads,
    Var,
    add,
    i64,
    lt,
    mod,
    sub,
    verify,
)
from stitchfleet.compiler.kernel.ir import Stmt
from stitchfleet.compiler.kernel.printer import print_kernel
from stitchfleet.compiler.targets.sim.interpreter import SimError, run

X = Buffer("x", DType.F32, 64, Role.INPUT)
Y = Buffer("y", DType.F64, 64, Role.OUTPUT)
A = SharedBuffer("a", DType.F32, 64, offset=0)  # bytes [0, 256)
B = SharedBuffer("b", DType.F64, 32, offset=0)  # bytes [0, 256) again, as f64
OWN = SharedBuffer("own", DType.F32, 8)  # an array of its own, outside the arena
V, W = Var("v", DType.F32), Var("w", DType.F64)
DATA = {"x": np.arange(64, dtype=np.float32)}
FIRST_HALF = lt(THREAD_IDX, i64(32))


def _kernel(*body: Stmt, shared: tuple[SharedBuffer, ...] = (A, B)) -> Kernel:
    return Kernel("arena", (X, Y), shared, Launch(1, 64, 1), body)


def _fails(kernel: Kernel, needle: str) -> None:
    with pytest.raises(SimError) as info:
        run([kernel], DATA)
    assert "kernel 'arena'" in str(info.value) and needle in str(info.value), str(info.value)


PUBLISH_A = (Store(A, THREAD_IDX, Load(X, THREAD_IDX)), SyncThreads())
WRITE_B = If(FIRST_HALF, (Store(B, THREAD_IDX, Cast(THREAD_IDX, DType.F64)),))


def test_views_reuse_bytes_in_turn_and_give_exact_results() -> None:
    """a (f32) is read, dies at a barrier; b (f64) then takes its bytes."""
    kernel = _kernel(
        *PUBLISH_A,
        Assign(V, Load(A, sub(i64(63), THREAD_IDX))),
        SyncThreads(),
        WRITE_B,
        SyncThreads(),
        Assign(W, Load(B, mod(THREAD_IDX, i64(32)))),
        Store(Y, THREAD_IDX, add(Cast(V, DType.F64), W)),
    )
    assert kernel.arena_bytes == kernel.shared_bytes == 256  # not 512: the two views share
    t = np.arange(64)
    np.testing.assert_array_equal(run([kernel], DATA)["y"], (63 - t) + t % 32)


def test_reading_a_value_whose_bytes_were_reused_is_an_error() -> None:
    kernel = _kernel(*PUBLISH_A, WRITE_B, SyncThreads(), Store(Y, THREAD_IDX, Cast(Load(A, THREAD_IDX), DType.F64)))
    _fails(kernel, "its bytes were last written through b (arena space reused while a was live)")


def test_overlapping_views_race_without_a_barrier() -> None:
    """Threads read a's neighbour element, then b's element t overwrites bytes others just read."""
    read = Assign(V, Load(A, mod(add(THREAD_IDX, i64(1)), i64(64))))
    _fails(_kernel(*PUBLISH_A, read, WRITE_B), "shared memory race: thread 0 of block 0 writes b[0] accessed by")


def test_arena_and_own_arrays_add_up_against_the_limit() -> None:
    kernel = _kernel(Store(OWN, i64(0), Load(X, i64(0))), shared=(A, B, OWN))
    assert (kernel.arena_bytes, kernel.shared_bytes) == (256, 256 + 32)
    big = SharedBuffer("big", DType.F32, 12288, offset=256)  # ends at 49408 > 48 KiB
    with pytest.raises(KernelError, match="shared memory 49408 bytes exceeds the limit of 49152"):
        verify(_kernel(shared=(A, big)))


@pytest.mark.parametrize("offset", [4, -8])
def test_misaligned_or_negative_view_is_refused(offset: int) -> None:
    bad = SharedBuffer("bad", DType.F64, 4, offset=offset)
    with pytest.raises(
        KernelError, match=f"shared view 'bad' at byte offset {offset}: must be >= 0 and a multiple of 8"
    ):
        verify(_kernel(shared=(A, bad)))


def test_printer_shows_the_arena_and_each_views_offset() -> None:
    text = print_kernel(_kernel(shared=(A, SharedBuffer("c", DType.F32, 4, offset=256), OWN)))
    assert "__shared__ u8 arena[272];" in text
    assert "__shared__ f32 c[4] @ arena+256;" in text and "__shared__ f32 own[8];" in text
