"""Benchmark suite: every case builds and evaluates at a small shape; key cases match numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.suite import CASES, build_case, io_bytes, write_suite
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import load


def _small(name: str) -> tuple[int, ...]:
    return (2, 3, 8, 8) if len(CASES[name].sizes) == 4 else (6, 16)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_evaluates_and_states_its_io_bytes(name: str) -> None:
    case = CASES[name]
    for dtype in case.dtypes:
        graph = build_case(name, _small(name), dtype)
        sizes = dict(graph.metadata["sizes"])  # type: ignore[arg-type]
        formula = eval(case.formula, {"__builtins__": {}}, {**sizes, "isz": graph.metadata["io_bytes_isz"]})
        assert formula == graph.metadata["io_bytes"] == io_bytes(graph)
        inputs = random_inputs(graph, seed=1)
        native = evaluate(graph, inputs)
        ref = evaluate(graph, inputs, "float64")
        for out in native:
            assert np.isfinite(ref[out]).all()
            assert np.allclose(native[out].astype(np.float64), ref[out], rtol=0.05, atol=0.05)


def test_layernorm_matches_numpy() -> None:
    graph = build_case("layernorm_fwd", (5, 32), "f32")
    inputs = random_inputs(graph, seed=2)
    x, gamma, beta = (inputs[k].astype(np.float64) for k in ("x", "gamma", "beta"))
    expected = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(evaluate(graph, inputs)["y"], expected, rtol=1e-5, atol=1e-5)


def test_softmax_fwd_and_bwd_match_numpy() -> None:
    graph = build_case("softmax_fwd", (4, 64), "f32")
    inputs = random_inputs(graph, seed=3)
    x = inputs["x"].astype(np.float64)
    expected = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    np.testing.assert_allclose(evaluate(graph, inputs)["y"], expected, rtol=1e-5)
    bwd = build_case("softmax_bwd", (4, 64), "f32")
    feed = random_inputs(bwd, seed=4)
    y, dy = feed["y"].astype(np.float64), feed["dy"].astype(np.float64)
    np.testing.assert_allclose(
        evaluate(bwd, feed, "float64")["dx"], y * (dy - (dy * y).sum(1, keepdims=True)), rtol=1e-12
    )


def test_gelu_fwd_and_bias_grad_match_numpy() -> None:
    erf = np.vectorize(math.erf)
    graph = build_case("bias_gelu_fwd", (4, 16), "f32")
    inputs = random_inputs(graph, seed=5)
    v = inputs["x"].astype(np.float64) + inputs["bias"]
    np.testing.assert_allclose(evaluate(graph, inputs)["y"], 0.5 * v * (1 + erf(v / np.sqrt(2))), rtol=1e-5, atol=1e-6)
    bwd = build_case("gelu_bwd_bias_grad", (4, 16), "f32")
    feed = random_inputs(bwd, seed=6)
    v = feed["x"].astype(np.float64) + feed["bias"]
    grad = 0.5 * (1 + erf(v / np.sqrt(2))) + v * np.exp(-v * v / 2) / np.sqrt(2 * np.pi)
    out = evaluate(bwd, feed, "float64")
    np.testing.assert_allclose(out["dx"], feed["dy"] * grad, rtol=1e-12)
    np.testing.assert_allclose(out["dbias"], (feed["dy"] * grad).sum(0), rtol=1e-12)


def test_unknown_case_and_bad_shape_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown suite case 'nope'"):
        build_case("nope", (2, 2), "f32")
    with pytest.raises(ValueError, match="takes a shape of 2 sizes"):
        build_case("softmax_fwd", (2, 2, 2), "f32")


def test_written_files_round_trip(tmp_path) -> None:
    written = write_suite(tmp_path)
    assert len(written) == sum(len(c.shapes) * len(c.dtypes) for c in CASES.values())
    assert max(p.stat().st_size for p in written) < 20_000
    graph = load(tmp_path / "softmax_fwd_4096x1024_f16.json")
    assert graph.metadata["case"] == "softmax_fwd"
    assert graph.metadata["io_bytes"] == 4096 * 1024 * 2 * 2
