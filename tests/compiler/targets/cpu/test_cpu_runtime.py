"""The cpu backend's runtime: on-disk cache, concurrent processes and threads, bad input, options, CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import build_case
from stitchfleet import cli
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op, save
from stitchfleet.compiler.targets.cpu.executable import (
    CpuBackend,
    CpuCompileError,
    CpuInputError,
    CpuOptions,
    compile_cluster,
    cpu_model,
)
from stitchfleet.compiler.tolerance import check_outputs

REPO = Path(__file__).resolve().parents[4]
SUITE = REPO / "benchmarks" / "suite"


def softmax() -> Graph:
    return build_case("softmax_fwd", (33, 70), "f32")


def assert_matches(graph: Graph, got: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}


def test_second_compile_loads_the_cached_object(tmp_path: Path) -> None:
    first = compile_cluster(softmax(), tmp_path)
    second = compile_cluster(softmax(), tmp_path)
    assert not first.cached and second.cached
    assert [p.name for p in (tmp_path / "cpu").iterdir()] == [p.name for p in (tmp_path / "cpu").glob("*.so")]
    assert len(list((tmp_path / "cpu").iterdir())) == 1
    inputs = random_inputs(softmax(), 1)
    assert_matches(softmax(), second(inputs), inputs)


def test_options_change_the_cache_key(tmp_path: Path) -> None:
    compile_cluster(softmax(), tmp_path)
    fast = compile_cluster(softmax(), tmp_path, fast_math=True)
    portable = compile_cluster(softmax(), tmp_path, portable=True)
    assert not fast.cached and not portable.cached
    assert len(list((tmp_path / "cpu").glob("*.so"))) == 3
    inputs = random_inputs(softmax(), 2)
    assert_matches(softmax(), portable(inputs), inputs)
    np.testing.assert_allclose(fast(inputs)["y"], evaluate(softmax(), inputs)["y"], rtol=1e-4, atol=1e-6)


CHILD = """
import sys
from pathlib import Path
from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import random_inputs
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
graph = build_case("layernorm_fwd", (17, 90), "f32")
out = compile_cluster(graph, Path(sys.argv[1]))(random_inputs(graph, 0))
print(float(out["y"].sum()))
"""


def test_concurrent_processes_share_one_cache_entry(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        results.append(out.decode().strip())
    assert len(set(results)) == 1
    assert [p.suffix for p in (tmp_path / "cpu").iterdir()] == [".so"]  # no temp file left behind


def test_threads_call_one_executable_concurrently(tmp_path: Path) -> None:
    graph = softmax()
    executable = compile_cluster(graph, tmp_path)
    inputs = [random_inputs(graph, seed) for seed in range(6)]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = executable(inputs[i])["y"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i, x in enumerate(inputs):
        np.testing.assert_array_equal(results[i], executable(x)["y"])
        assert_matches(graph, {"y": results[i]}, x)


def test_bad_inputs_name_the_input(tmp_path: Path) -> None:
    executable = compile_cluster(softmax(), tmp_path)
    good = random_inputs(softmax(), 0)
    with pytest.raises(CpuInputError, match="missing input"):
        executable({})
    with pytest.raises(CpuInputError, match=r"unexpected input\(s\): z \(parameters: x\)"):
        executable({**good, "z": good["x"]})
    with pytest.raises(CpuInputError, match="input 'x': dtype float64"):
        executable({"x": good["x"].astype(np.float64)})
    with pytest.raises(CpuInputError, match=r"input 'x': shape \[70, 33\]"):
        executable({"x": good["x"].T.copy()})


def test_non_contiguous_input_is_accepted(tmp_path: Path) -> None:
    graph = softmax()
    executable = compile_cluster(graph, tmp_path)
    wide = np.asfortranarray(random_inputs(graph, 4)["x"])
    assert_matches(graph, executable({"x": wide}), {"x": np.ascontiguousarray(wide)})


def test_missing_compiler_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CpuCompileError, match="no-such-cc"):
        compile_cluster(softmax(), tmp_path, compiler="no-such-cc")


def test_output_that_is_an_input_and_bool_int_outputs(tmp_path: Path) -> None:
    b = GraphBuilder()
    x, n = b.parameter("x", (6, 5)), b.parameter("n", (6, 5), "i32")
    b.output("same", x)
    b.output("pos", b.binary(Op.GREATER, b.exp(x), 1.0))
    b.output("twice", b.cast(b.binary(Op.MAXIMUM, n + n, b.neg(n)), "i64"))
    b.output("parts", b.concat([b.slice(x, (0, 1), (6, 5), (2, 2)), b.slice(x, (1, 0), (4, 2))], 0))
    graph = b.build()
    inputs = random_inputs(graph, 5)
    got = compile_cluster(graph, tmp_path)(inputs)
    np.testing.assert_array_equal(got["same"], inputs["x"])
    assert_matches(graph, got, inputs)


def test_cpu_model_is_named() -> None:
    assert cpu_model() and cpu_model() != "unknown cpu"


def test_backend_reports_its_name_and_plan(tmp_path: Path) -> None:
    backend = CpuBackend(CpuOptions(cache_dir=tmp_path))
    executable = backend.compile_graph(softmax())
    assert backend.name == "cpu" and executable.plan.kernel_count == 1
    assert executable.input_names == ("x",) and executable.output_names == ("y",)
    assert "sf_run(sf_pool, " in executable.source.text  # its planned loops, each through the runner


def test_cli_compile_device_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STITCHFLEET_CACHE_DIR", str(tmp_path))
    assert cli.main(["compile", str(SUITE / "astitch_fig7_2x128_f32.json"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "stitched C + OpenMP code on this CPU vs evaluate" in out
    assert "FAIL" not in out and out.rstrip().endswith("ok")
    assert list((tmp_path / "cpu").glob("*.so"))


def test_cli_compile_device_cpu_reads_a_tensor_constant_as_an_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: "tensor constants are not lowered"; the scope pass now leaves such constants outside."""
    monkeypatch.setenv("STITCHFLEET_CACHE_DIR", str(tmp_path))
    b = GraphBuilder()
    x = b.parameter("x", (2, 3))
    b.output("y", b.exp(x) + b.constant([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    path = save(b.build(), tmp_path / "g.json")
    assert cli.main(["compile", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.rstrip().endswith("ok")
