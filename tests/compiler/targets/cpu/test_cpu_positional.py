"""The cpu backend's positional call (the bridge's path) and the NaN/Inf flag computed by the C code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.targets.cpu.executable import CpuInputError, compile_cluster


def mixed(dtype: str) -> Graph:
    """A passed-through input, a float output and an integer output."""
    b = GraphBuilder()
    x, n = b.parameter("x", (7, 9), dtype), b.parameter("n", (7, 9), "i32")
    b.output("same", x)
    b.output("y", b.exp(x) * 2.0)
    b.output("m", n + n)
    return b.build()


@pytest.mark.parametrize("dtype", ["f16", "f32", "f64"])
def test_flag_is_set_only_for_nan_or_inf_in_a_computed_output(tmp_path: Path, dtype: str) -> None:
    graph = mixed(dtype)
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 1)
    (same, y, m), bad = executable.run([inputs["x"], inputs["n"]])
    want = evaluate(graph, inputs)
    assert not bad
    np.testing.assert_array_equal(same, inputs["x"])
    np.testing.assert_array_equal(m, want["m"])
    assert same is not inputs["x"]  # a copy: TF owns what the bridge returns
    for poison in (np.nan, np.inf, 1e300):  # 1e300 overflows exp in every float type
        x = inputs["x"].copy()
        with np.errstate(over="ignore"):
            x[3, 4] = poison
        (_, y, _), bad = executable.run([x, inputs["n"]])
        assert bad and not np.isfinite(y[3, 4]) and np.isfinite(np.delete(y.reshape(-1), 3 * 9 + 4)).all()


def test_a_nan_only_in_a_passed_through_output_is_not_flagged(tmp_path: Path) -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    b.output("same", x)
    b.output("y", b.binary(Op.MAXIMUM, x, 0.0) * 0.0)
    graph = b.build()
    x_in = np.ones((4, 8), np.float32)
    x_in[0, 0] = np.inf  # max(inf, 0) * 0 = nan: flagged; a nan input stays nan: flagged too
    (_, y), bad = compile_cluster(graph, tmp_path).run([x_in])
    assert bad and np.isnan(y[0, 0])
    x_in[0, 0] = -np.inf  # max(-inf, 0) * 0 = 0: only the passed-through copy holds -inf
    (same, y), bad = compile_cluster(graph, tmp_path).run([x_in])
    assert not bad and np.isneginf(same[0, 0]) and np.isfinite(y).all()


def test_reductions_and_scratch_flag_too(tmp_path: Path) -> None:
    graph = build_case("layernorm_fwd", (33, 70), "f32")
    executable = compile_cluster(graph, tmp_path)
    names = executable.input_names
    inputs = random_inputs(graph, 2)
    arrays = [inputs[n] for n in names]
    outputs, bad = executable.run(arrays)
    assert not bad
    assert dict(zip(executable.output_names, outputs, strict=True)).keys() == executable({**inputs}).keys()
    arrays[names.index("x")] = arrays[names.index("x")].copy()
    arrays[names.index("x")][5, 0] = np.nan
    _, bad = executable.run(arrays)
    assert bad


def test_positional_inputs_are_checked(tmp_path: Path) -> None:
    graph = mixed("f32")
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 3)
    with pytest.raises(CpuInputError, match=r"expected 2 input\(s\) \(x, n\), got 1"):
        executable.run([inputs["x"]])
    with pytest.raises(CpuInputError, match="input 'n': dtype int64"):
        executable.run([inputs["x"], inputs["n"].astype(np.int64)])
    wide = np.asfortranarray(inputs["x"])  # not contiguous: copied, same answer
    (_, y, _), _ = executable.run([wide, inputs["n"]])
    np.testing.assert_array_equal(y, executable(inputs)["y"])


def test_outputs_are_reused_only_once_nothing_references_them(tmp_path: Path) -> None:
    graph = mixed("f32")
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 4)
    arrays = [inputs["x"], inputs["n"]]
    first, _ = executable.run(arrays)
    kept = first[1].copy()
    view = first[1][2:]  # a view keeps its base alive: that set must not be overwritten
    addresses = {a.ctypes.data for a in first}
    del first
    second, _ = executable.run([arrays[0] * 2, arrays[1]])
    assert not addresses & {a.ctypes.data for a in second}
    np.testing.assert_array_equal(view, kept[2:])
    del view
    third, _ = executable.run(arrays)
    assert {a.ctypes.data for a in third} == addresses  # the first set again, refilled
    np.testing.assert_array_equal(third[1], kept)
    np.testing.assert_array_equal(third[0], inputs["x"])
    assert third[0] is not inputs["x"]
    held = [executable.run(arrays)[0] for _ in range(4)]  # more sets than the pool keeps: all distinct
    assert len({a.ctypes.data for outs in [third, *held] for a in outs}) == 5 * 3


def test_outputs_start_on_64_byte_boundaries_for_tf_to_adopt(tmp_path: Path) -> None:
    executable = compile_cluster(mixed("f32"), tmp_path)
    inputs = random_inputs(mixed("f32"), 4)
    outputs, _ = executable.run([inputs["x"], inputs["n"]])
    assert all(a.ctypes.data % 64 == 0 and a.flags.c_contiguous and a.flags.writeable for a in outputs)


def test_a_slice_of_a_slice_still_holds_its_output_set(tmp_path: Path) -> None:
    """Regression: aligned outputs are views of a byte buffer and numpy points a view's view at that
    buffer, not at the output; the pool must see references there too."""
    executable = compile_cluster(mixed("f32"), tmp_path)
    inputs = random_inputs(mixed("f32"), 4)
    arrays = [inputs["x"], inputs["n"]]
    first, _ = executable.run(arrays)
    inner = first[1][1:][1:]
    kept = inner.copy()
    del first
    executable.run([arrays[0] * 3, arrays[1]])
    np.testing.assert_array_equal(inner, kept)
