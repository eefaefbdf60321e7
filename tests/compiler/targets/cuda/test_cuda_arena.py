"""Shared arena views in CUDA C: typed pointers into one byte array, static or carved from dynamic smem.

The planner's layout reuses shared bytes by liveness; the renderer must keep every
view at exactly its planned byte offset (so overlapping views really share space)
and count the arena once. Compiled with nvcc where it is on PATH (no GPU needed).
"""

from __future__ import annotations

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc
from stitchfleet.compiler.targets.cuda.render import kernel_text, render_kernel

F32, F64 = DType.F32, DType.F64
X = ir.Buffer("x", F32, 128, ir.Role.INPUT)
Y = ir.Buffer("y", F64, 128, ir.Role.OUTPUT)
V, W = ir.Var("v", F32), ir.Var("w", F64)


def arena_kernel(shared: tuple[ir.SharedBuffer, ...], launch: ir.Launch | None = None) -> ir.Kernel:
    a, b = shared[0], shared[1]
    body = (
        ir.Store(a, ir.THREAD_IDX, ir.Load(X, ir.THREAD_IDX)),
        ir.SyncThreads(),
        ir.Assign(V, ir.Load(a, ir.sub(ir.i64(127), ir.THREAD_IDX))),
        ir.SyncThreads(),
        ir.If(ir.lt(ir.THREAD_IDX, ir.i64(b.size)), (ir.Store(b, ir.THREAD_IDX, ir.Cast(V, F64)),)),
        ir.SyncThreads(),
        ir.Assign(W, ir.Load(b, ir.i64(0))),
        ir.Store(Y, ir.THREAD_IDX, ir.add(ir.Cast(V, F64), W)),
    )
    return ir.Kernel("arena_views", (X, Y), shared, launch or ir.Launch(1, 128, 1), body)


A = ir.SharedBuffer("a", F32, 128, offset=0)
B = ir.SharedBuffer("b", F64, 64, offset=0)
OWN = ir.SharedBuffer("own", F32, 4)


def test_views_are_pointers_into_one_static_arena() -> None:
    text = kernel_text(render_kernel(arena_kernel((A, B, OWN))))
    assert "__shared__ __align__(16) unsigned char sf_arena[512];" in text
    assert "float* const a = reinterpret_cast<float*>(sf_arena + 0);" in text
    assert "double* const b = reinterpret_cast<double*>(sf_arena + 0);" in text
    assert "__shared__ __align__(16) float own[4];" in text


def test_dynamic_shared_memory_puts_the_arena_first_then_the_arrays() -> None:
    launch = ir.Launch(1, 128, 1, dynamic_smem_bytes=64, shared_limit_bytes=96 * 1024)
    c = ir.SharedBuffer("c", F32, 4, offset=512)
    rendered = render_kernel(arena_kernel((A, B, c, OWN), launch))
    text = kernel_text(rendered)
    assert "double* const b = reinterpret_cast<double*>(sf_smem + 0);" in text
    assert "float* const c = reinterpret_cast<float*>(sf_smem + 512);" in text
    assert "float* const own = reinterpret_cast<float*>(sf_smem + 528);" in text  # after the 528-byte arena
    assert rendered.dynamic_smem_bytes == 528 + 16 + 64


def test_arena_kernel_compiles(nvcc: Nvcc, nvcc_cache: ArtifactCache) -> None:
    cubin = nvcc.compile(render_kernel(arena_kernel((A, B, OWN))).source, "sm_90", nvcc_cache)
    assert b"arena_views" in cubin
