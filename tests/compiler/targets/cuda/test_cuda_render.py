"""The CUDA renderer's decisions: declarations, shuffle masks, vector loops, constants, shared memory, errors."""

from __future__ import annotations

import pytest

from stitchfleet.compiler.ir import DType, Op
from stitchfleet.compiler.kernel import KernelError, blocks, ir
from stitchfleet.compiler.targets.cuda.expr import RenderError, const_text
from stitchfleet.compiler.targets.cuda.render import kernel_text, module_text, render_kernel, render_module

F32, I64 = DType.F32, DType.I64
X = ir.Buffer("x", F32, 1024, ir.Role.INPUT)
Y = ir.Buffer("y", F32, 1024, ir.Role.OUTPUT)


def kernel(body: tuple[ir.Stmt, ...], shared: tuple[ir.SharedBuffer, ...] = (), grid: int = 8) -> ir.Kernel:
    return ir.Kernel("k", (X, Y), shared, ir.Launch(grid, 128, 8), body)


def text(body: tuple[ir.Stmt, ...], **kw: object) -> str:
    return kernel_text(render_kernel(kernel(body, **kw)))  # type: ignore[arg-type]


def test_loop_carried_variable_is_declared_outside_the_loop() -> None:
    acc, i, tmp = ir.Var("acc", F32), ir.Var("i", I64), ir.Var("tmp", F32)
    loop = blocks.grid_stride_loop(i, ir.i64(1024), (ir.Assign(tmp, ir.Load(X, i)), ir.Assign(acc, ir.add(acc, tmp))))
    out = text((ir.Assign(acc, ir.const(0, F32)), loop, ir.Store(Y, ir.THREAD_IDX, acc)))
    lines = [line.strip() for line in out.splitlines()]
    assert lines.index("float acc;") < next(n for n, line in enumerate(lines) if line.startswith("for ("))
    assert "float tmp;" in lines[next(n for n, line in enumerate(lines) if line.startswith("for (")) :]
    assert any(line.startswith("for (long long i = ") for line in lines)


def test_variable_read_before_its_assignment_in_a_loop_is_hoisted() -> None:
    last, i = ir.Var("last", F32), ir.Var("i", I64)
    body = (ir.Store(Y, i, last), ir.Assign(last, ir.Load(X, i)))
    out = text((ir.Assign(last, ir.const(0, F32)), ir.For(i, ir.i64(0), ir.i64(4), ir.i64(1), body)))
    assert out.index("float last;") < out.index("for (")


def test_shuffles_use_the_full_mask_at_warp_uniform_control_flow() -> None:
    acc = ir.Var("acc", F32)
    out = text((ir.Assign(acc, ir.Load(X, ir.THREAD_IDX)), *blocks.warp_reduce(acc, Op.ADD)))
    assert out.count("__shfl_xor_sync(0xffffffffu, acc, ") == 5


def test_shuffle_under_a_lane_divergent_branch_uses_the_ballot_of_its_condition() -> None:
    acc = ir.Var("acc", F32)
    branch = ir.If(ir.lt(ir.LANE, ir.i64(16)), blocks.warp_reduce(acc, Op.ADD, width=16))
    out = text((ir.Assign(acc, ir.Load(X, ir.THREAD_IDX)), branch))
    assert "const unsigned sf_mask_1 = __ballot_sync(0xffffffffu, sf_cond_1);" in out
    assert "__shfl_xor_sync(sf_mask_1, acc, 8, 16)" in out


def test_shuffle_in_a_lane_divergent_loop_is_refused() -> None:
    acc, i = ir.Var("acc", F32), ir.Var("i", I64)
    loop = ir.For(i, ir.LANE, ir.i64(40), ir.i64(32), (ir.Shuffle(acc, acc, 1),))
    with pytest.raises(RenderError, match="lane-divergent bounds"):
        text((ir.Assign(acc, ir.const(0, F32)), loop))


def _scale_loop(start: ir.Expr, stop: ir.Expr) -> ir.For:
    i = ir.Var("i", I64)
    return ir.For(i, start, stop, ir.BLOCK_DIM, (ir.Store(Y, i, ir.Load(X, i)),))


def test_aligned_block_stride_loop_is_vectorized() -> None:
    base = ir.Var("base", I64)
    loop = _scale_loop(ir.add(base, ir.THREAD_IDX), ir.add(base, ir.i64(512)))
    rendered = render_kernel(kernel((ir.Assign(base, ir.mul(ir.BLOCK_IDX, ir.i64(512))), loop)))
    assert rendered.vector_loops == 1
    assert "const sf_vec<float, 4> x_v = *reinterpret_cast<const sf_vec<float, 4>*>(x + i_v);" in rendered.source


@pytest.mark.parametrize("mult", [3, 6])
def test_loop_not_provably_aligned_stays_scalar(mult: int) -> None:
    base = ir.Var("base", I64)
    loop = _scale_loop(ir.add(base, ir.THREAD_IDX), ir.add(base, ir.i64(mult * 64)))
    rendered = render_kernel(kernel((ir.Assign(base, ir.mul(ir.BLOCK_IDX, ir.i64(mult))), loop)))
    assert rendered.vector_loops == 0 and "sf_vec<float" not in kernel_text(rendered)


def test_loop_under_a_thread_divergent_branch_stays_scalar() -> None:
    branch = ir.If(ir.lt(ir.THREAD_IDX, ir.i64(64)), (_scale_loop(ir.THREAD_IDX, ir.i64(1024)),))
    assert render_kernel(kernel((branch,))).vector_loops == 0


def test_reduction_loop_stays_scalar() -> None:
    acc, i = ir.Var("acc", F32), ir.Var("i", I64)
    loop = blocks.grid_stride_loop(i, ir.i64(1024), (ir.Assign(acc, ir.add(acc, ir.Load(X, i))),))
    body = (ir.Assign(acc, ir.const(0, F32)), loop, ir.Store(Y, ir.global_thread_index(), acc))
    assert render_kernel(kernel(body)).vector_loops == 0


def test_a_loop_variable_escapes_only_when_read_outside_every_copy_of_the_loop() -> None:
    # Escape is counted (the kernel's mentions against the loop's, times its copies): the same loop object twice
    # keeps what it sets to itself; a read of that variable after it is one mention outside, and the loop stays scalar
    base = ir.Var("base", I64)
    loop = _scale_loop(ir.add(base, ir.THREAD_IDX), ir.add(base, ir.i64(512)))
    start = ir.Assign(base, ir.mul(ir.BLOCK_IDX, ir.i64(512)))
    assert render_kernel(kernel((start, loop, loop))).vector_loops == 2
    after = ir.Store(Y, ir.THREAD_IDX, ir.Load(X, loop.var))
    assert render_kernel(kernel((start, loop, loop, after))).vector_loops == 0


def test_sixteen_bit_constants_are_numpy_rounded_bit_patterns() -> None:
    assert const_text(ir.const(1.0, DType.F16)) == "__ushort_as_half((unsigned short)0x3c00)"
    assert const_text(ir.const(1.0, DType.BF16)) == "__ushort_as_bfloat16((unsigned short)0x3f80)"
    assert const_text(ir.const(float("-inf"), F32)) == "__int_as_float(0xff800000)"
    assert const_text(ir.const(0.1, F32)) == "0.1f"


def test_large_shared_memory_becomes_dynamic() -> None:
    big = ir.SharedBuffer("big", F32, 16384)  # 64 KiB
    launch = ir.Launch(8, 128, 8, shared_limit_bytes=227 * 1024)
    body = (ir.Store(big, ir.THREAD_IDX, ir.Load(X, ir.THREAD_IDX)), ir.SyncThreads())
    rendered = render_kernel(ir.Kernel("k", (X, Y), (big,), launch, body))
    assert rendered.dynamic_smem_bytes == 65536
    assert "extern __shared__ __align__(16) unsigned char sf_smem[];" in rendered.source


def test_grid_barrier_adds_the_counter_parameter() -> None:
    rendered = render_kernel(kernel((ir.GridSync(),)))
    assert rendered.grid_barrier and "unsigned int* __restrict__ sf_grid_counter)" in rendered.source
    assert "sf_grid_sync(sf_grid_counter);" in rendered.source


def test_reserved_names_are_refused() -> None:
    with pytest.raises(RenderError, match="'float' is reserved"):
        text((ir.Assign(ir.Var("float", F32), ir.const(0, F32)),))


def test_invalid_kernel_is_refused_by_the_verifier() -> None:
    with pytest.raises(KernelError, match="grid barrier"):
        render_kernel(kernel((ir.GridSync(),), grid=9))


def test_a_module_of_rendered_kernels_is_the_module_rendered_anew() -> None:
    # A launch plan builds its module from the kernels it rendered for the spec (they were rendered twice before)
    i = ir.Var("i", I64)
    first = kernel((ir.Store(Y, ir.THREAD_IDX, ir.Load(X, ir.THREAD_IDX)),))
    second = ir.Kernel(
        "k2",
        (X, Y),
        (),
        ir.Launch(4, 64, 8),
        (ir.For(i, ir.i64(0), ir.i64(4), ir.i64(1), (ir.Store(Y, i, ir.Load(X, i)),)),),
    )
    noted = frozenset({"y"})
    assert module_text([render_kernel(k, noted) for k in (first, second)]) == render_module([first, second], noted)
    assert "sf_checked(" in module_text([render_kernel(first, noted)])
    with pytest.raises(RenderError, match="unique in one module: \\['k', 'k'\\]"):
        module_text([render_kernel(first), render_kernel(first)])
