"""The guard's NaN/Inf test in the generated C (`cpu.finite`): in the store loops of fused element-wise
loops (long ones reduce the flag in the loop, short rows keep a flag per column), after the region for the
planned loops' stores; flagged for one bad element wherever it is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.finite import LANES, LANES_MAX, laned, pass_after, with_reductions
from stitchfleet.compiler.targets.cpu.source import cluster_source

REPO = Path(__file__).resolve().parents[4]


def body(graph: Graph) -> str:
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    return text[text.index("struct f_tasks") :]


def gelu_parts(shape: tuple[int, ...], dtype: str = "f32") -> Graph:
    """Three element-wise outputs of one input: a fused loop with three float stores and a bool one."""
    b = GraphBuilder()
    x = b.parameter("x", shape, dtype)
    b.output("half", x * 0.5)
    b.output("e", b.exp(x))
    b.output("pos", b.binary(Op.GREATER, x, 0.0))
    b.output("sq", x * x)
    return b.build()


def test_a_fused_loop_tests_its_stores_and_has_no_pass_after() -> None:
    """Rows up to LANES_MAX columns on column flags (bias + GELU at 512 x 512: 247 -> 231 us against the simd
    reduction per row); longer rows reduce the flag in their loop."""
    text = body(gelu_parts((6, 256)))
    assert text.count(f"{LANES}[c_2] = sf_umax({LANES}[c_2], sf_key_float(out") == 3  # the bool output is not tested
    assert "reduction(max:sf_bad)" not in text and "const sf_u32a" not in text  # no second read of the outputs
    text = body(gelu_parts((3, 2 * LANES_MAX)))
    assert text.count("sf_bad = sf_umax(sf_bad, sf_key_float(out") == 3 and LANES not in text
    assert "#pragma omp simd reduction(max:sf_bad)" in text
    assert "__atomic_fetch_or(&sf_x->bad, sf_bad >= SF_BAD_KEY, __ATOMIC_RELAXED);" in text  # per task range
    assert "const sf_u32a" not in text


def test_short_rows_of_a_softmax_are_tested_after_the_region() -> None:
    text = body(build_case("softmax_fwd", (64, 32), "f32"))
    assert "sf_key_" not in text
    assert text.count("(const sf_u32a *)out0_y") == 1


def bias_adds(shape: tuple[int, ...]) -> Graph:
    """Two outputs of a row-broadcast add over rows of 32 (the Transformer's q/k/v bias adds): short rows."""
    b = GraphBuilder()
    x, bias = b.parameter("x", shape), b.parameter("b", shape[-2:])
    y = x + bias
    b.output("y", y)
    b.output("z", y * 0.5)
    return b.build()


def head_transpose(shape: tuple[int, int, int, int]) -> Graph:
    """Heads back beside each other, (B, H, S, D) -> (B*S, H*D): a gather whose rows run in pieces of D."""
    b = GraphBuilder()
    x = b.parameter("x", shape)
    moved = b.transpose(x * 1.5, (0, 2, 1, 3))
    b.output("t", b.reshape(moved, (shape[0] * shape[2], shape[1] * shape[3])))
    return b.build()


def test_short_rows_of_a_fused_loop_keep_a_flag_per_column_and_have_no_pass_after() -> None:
    """A pass after the region re-read the q/k/v bias cluster's four 256 KB outputs (32 -> 22 us through the op's
    pooled entry with the flags, one thread); the flags are reduced once per task range."""
    for graph in (bias_adds((8, 32, 4, 32)), head_transpose((4, 4, 32, 32))):
        text = body(graph)
        assert f"uint32_t {LANES}[32] = {{0}};" in text
        assert f"{LANES}[c_2] = sf_umax({LANES}[c_2], sf_key_float(out" in text
        assert f"for (int64_t sf_l = 0; sf_l < 32L; ++sf_l) sf_bad = sf_umax(sf_bad, {LANES}[sf_l]);" in text
        assert "const sf_u32a" not in text and "reduction(max:sf_bad)" not in text


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((6, 256), "f32"), ((3, 131), "f16"), ((5, 129), "f64"), ((9000,), "f32"), ((64, 32), "f16"), ((3, 2100), "f32")],
)
def test_one_bad_element_anywhere_in_one_output_is_flagged(tmp_path: Path, shape: tuple[int, ...], dtype: str) -> None:
    graph = gelu_parts(shape, dtype)
    executable = compile_cluster(graph, tmp_path)
    x = random_inputs(graph, 4)["x"]
    outputs, bad = executable.run([x])
    assert not bad
    want = evaluate(graph, {"x": x})
    np.testing.assert_array_equal(dict(zip(executable.output_names, outputs, strict=True))["pos"], want["pos"])
    flat = x.reshape(-1)
    for where in (0, flat.size - 1, flat.size // 2 + 1):
        for poison in (np.nan, np.inf, -np.inf, 1e300):  # 1e300: exp overflows (to inf in f16 at the store)
            y = flat.copy()
            with np.errstate(over="ignore"):
                y[where] = poison
            outputs, bad = executable.run([y.reshape(shape)])
            assert bad, (where, poison)
    big = flat.copy()
    big[-1] = 20.0  # exp(20) overflows f16 only: the test sees the value as stored
    _, bad = executable.run([big.reshape(shape)])
    assert bad == (dtype == "f16")


@pytest.mark.parametrize("graph", [bias_adds((8, 32, 4, 32)), head_transpose((2, 4, 32, 32))], ids=["bias", "heads"])
def test_one_bad_element_in_short_rows_is_flagged_from_its_column(tmp_path: Path, graph: Graph) -> None:
    """Every column's flag reaches the result: a NaN or Inf in any column of any row, first or last task."""
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 5)
    arrays = [inputs[n] for n in executable.input_names]
    outputs, bad = executable.run(arrays)
    assert not bad
    want = evaluate(graph, inputs)
    for name, got in zip(executable.output_names, outputs, strict=True):
        np.testing.assert_array_equal(got, want[name].astype(got.dtype))
    flat = arrays[0].reshape(-1)
    for where in (0, 31, flat.size // 2 + 7, flat.size - 1):
        for poison in (np.nan, np.inf, -np.inf):
            y = flat.copy()
            y[where] = poison
            _, bad = executable.run([y.reshape(arrays[0].shape), *arrays[1:]])
            assert bad, (where, poison)


def test_a_nan_in_the_last_row_of_a_softmax_is_flagged(tmp_path: Path) -> None:
    graph = build_case("softmax_fwd", (37, 33), "f32")
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 6)
    arrays = [inputs[n] for n in executable.input_names]
    assert not executable.run(arrays)[1]
    arrays[0] = arrays[0].copy()
    arrays[0].reshape(-1)[-1] = np.nan
    assert executable.run(arrays)[1]


def test_with_reductions_marks_only_loops_that_set_the_flag() -> None:
    lines = [
        "#pragma omp for schedule(static)",
        "for (int64_t t = 0; t < 4L; ++t) {",
        "    #pragma omp simd",
        "    for (int l = 0; l < 16; ++l) a[l] = 0;",
        "    #pragma omp simd",
        "    for (int64_t c = 0; c < 8L; ++c) {",
        "        sf_bad = sf_umax(sf_bad, sf_key_float(out0[c] = x[c]));",
        "    }",
        "}",
        "#pragma omp simd",
        "for (int l = 0; l < 16; ++l) b[l] = 0;",
    ]
    got = with_reductions(lines)
    assert got[0].endswith("reduction(max:sf_bad)") and got[4].endswith("reduction(max:sf_bad)")
    assert got[2] == lines[2] and got[9] == lines[9]


def test_laned_flags_short_simd_loops_and_moves_the_rest_after_the_region() -> None:
    store = "sf_bad = sf_umax(sf_bad, sf_key_float(out0_y[((r * 8L) + c)] = (a + b)));"
    lines = [
        "    for (int64_t r = sf_lo; r < sf_hi; ++r) {",
        "        #pragma omp simd",
        "        for (int64_t c = 0; c < 8L; ++c) {",
        f"            {store}",
        "            sf_bad = sf_umax(sf_bad, sf_key_double(out1_z[c] = q));",
        "        }",
        f"        {store}",  # outside the simd loop: no column to flag by
        "    }",
        "    #pragma omp simd",
        "    for (int64_t c = 0; c < 300L; ++c) {",  # longer than the limit
        "        sf_bad = sf_umax(sf_bad, sf_key_float(out2_w[c] = q));",
        "        sf_bad = sf_umax(sf_bad, sf_key_double(out1_z[c] = q));",
        "    }",
    ]
    got, moved, lanes = laned(lines, {"out1_z"}, limit=100)
    assert got[3] == f"            {LANES}[c] = sf_umax({LANES}[c], sf_key_float(out0_y[((r * 8L) + c)] = (a + b)));"
    assert got[4] == f"            {LANES}[c] = sf_umax({LANES}[c], sf_key_double(out1_z[c] = q));"
    assert got[6] == "        out0_y[((r * 8L) + c)] = (a + b);" and got[10] == "        out2_w[c] = q;"
    assert got[11] == lines[11]  # a kept buffer's test in a long loop stays as it is (reduced in the loop)
    assert moved == ["out0_y", "out2_w"] and lanes == 8
    assert laned(lines, {"out1_z"}, limit=0)[2] == 0  # limit 0: no flags; every other store's test after
    assert "(b[i] & 0x7c00u) == 0x7c00u" in "\n".join(pass_after([("out0_y", "_Float16", 10)], ""))


def test_two_threads_flag_a_bad_element_in_either_half(tmp_path: Path) -> None:
    """A cluster big enough for the parallel region, run where OpenMP may use two threads."""
    script = textwrap.dedent(f"""
        import numpy as np
        from pathlib import Path
        from stitchfleet.compiler.ir import GraphBuilder
        import re
        from stitchfleet.compiler.targets.cpu.executable import compile_cluster
        from stitchfleet.compiler.targets.cpu.generator import PARALLEL_ELEMENTS
        b = GraphBuilder()
        x = b.parameter("x", (2048, 1032))
        b.output("y", x * 0.5 + 1.0)
        b.output("z", x * x)
        ex = compile_cluster(b.build(), Path({str(tmp_path)!r}))
        tasks, cost = re.search(r"sf_run\\(sf_pool, (\\d+)L, (\\d+)L", ex.source.text).groups()
        assert int(tasks) * int(cost) >= PARALLEL_ELEMENTS  # OpenMP's runner splits it
        x = np.ones((2048, 1032), np.float32)
        assert not ex.run([x])[1]
        for where in (0, x.size // 2 - 1, x.size // 2, x.size - 1):
            y = x.copy().reshape(-1)
            y[where] = np.inf
            (a, c), bad = ex.run([y.reshape(x.shape)])
            assert bad and np.isinf(a.reshape(-1)[where]), where
        print("ok")
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
