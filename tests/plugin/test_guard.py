"""The guard's judgement (`plugin/guard.py`): stitched outputs within rounding of TF's own pass without the
fp64 reference; anything further off, non-finite or a differing integer is judged against fp64, where a
real bug fails and a different summation order passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.plugin import guard


def row_sums() -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (64, 512))
    b.output("total", b.reduce_sum(b.mul(x, x), (1,)))
    b.output("scaled", b.mul(x, b.constant(0.5)))
    return b.build()


def case(seed: int = 0) -> tuple[Graph, list[Any], list[Any]]:
    graph = row_sums()
    inputs = random_inputs(graph, seed)
    values = evaluate(graph, inputs)
    tf_like = [np.asarray(values[name], np.float32) for name, _ in graph.outputs]
    return graph, [inputs["x"]], tf_like


@pytest.fixture
def no_fp64(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fp64 reference was computed")

    monkeypatch.setattr(guard, "evaluate", refuse)


def test_outputs_equal_to_tfs_pass_without_the_fp64_reference(no_fp64: None) -> None:
    graph, inputs, original = case()
    finding = guard.judge(graph, inputs, original, [o.copy() for o in original], 8.0)
    assert finding.ok and finding.compiled_error == 0.0


def test_a_last_bit_difference_passes_without_the_fp64_reference(no_fp64: None) -> None:
    graph, inputs, original = case(1)
    stitched = [np.nextafter(o, np.float32(np.inf)) for o in original]  # one ulp up everywhere
    finding = guard.judge(graph, inputs, original, stitched, 8.0)
    assert finding.ok and 0.0 < finding.compiled_error <= finding.allowed


def test_a_wrong_output_is_judged_against_fp64_and_fails() -> None:
    graph, inputs, original = case(2)
    stitched = [o.copy() for o in original]
    stitched[1][3, 7] *= 1.5  # a corrupted element
    finding = guard.judge(graph, inputs, original, stitched, 8.0)
    assert not finding.ok and finding.output == "scaled" and "exceeds" in finding.reason


def test_a_different_summation_order_goes_to_fp64_and_passes() -> None:
    graph, inputs, original = case(3)
    x = inputs[0].astype(np.float32)
    reordered = np.zeros(64, np.float32)
    for column in range(511, -1, -1):  # summed backwards, in float32: off by more than the fast bound
        reordered += x[:, column] * x[:, column]
    stitched = [reordered, original[1].copy()]
    assert guard._distance(reordered, original[0]) > guard._fast_bound(np.dtype(np.float32), 8.0)
    assert guard.judge(graph, inputs, original, stitched, 8.0).ok


def test_nan_where_tf_is_finite_fails() -> None:
    graph, inputs, original = case(4)
    stitched = [o.copy() for o in original]
    stitched[0][5] = np.nan
    finding = guard.judge(graph, inputs, original, stitched, 8.0)
    assert not finding.ok and "non-finite" in finding.reason


def test_factor_one_accepts_only_identical_results_on_the_fast_path(no_fp64: None) -> None:
    graph, inputs, original = case(5)
    assert guard.judge(graph, inputs, original, [o.copy() for o in original], 1.0).ok
    with pytest.raises(AssertionError, match="fp64 reference was computed"):
        guard.judge(graph, inputs, original, [np.nextafter(o, np.float32(np.inf)) for o in original], 1.0)


def residual_with_bias() -> Graph:
    b = GraphBuilder()
    h, x = b.parameter("h", (32, 64)), b.parameter("x", (32, 64))
    bias = b.parameter("bias", (1, 64))
    b.output("out", b.add(h, b.add(x, bias)))
    return b.build()


def test_tf_regrouping_adds_does_not_make_a_correct_kernel_fail() -> None:
    """Regression: grappler rewrites TF's graph before it runs; on a Keras transformer's residual add
    after the attention output's bias, TF's result was nearly exact where `h` cancels `x + bias`, while
    the graph's own order `h + (x + bias)` rounds the larger `x + bias` first. A kernel following the
    graph was reverted as a mismatch (9.4e-07 > 7.9e-07). Here TF's result is the exact sum rounded
    once, and the kernel's is numpy in the graph's order."""
    graph = residual_with_bias()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    bias = rng.standard_normal((1, 64)).astype(np.float32)
    h = (-(x + bias) + 1e-3 * rng.standard_normal((32, 64))).astype(np.float32)
    h[:, :32] = rng.standard_normal((32, 32))  # outputs of unit scale beside the cancelling ones
    inputs = [h, x, bias]
    regrouped = [(h.astype(np.float64) + x + bias).astype(np.float32)]  # TF: nearly exact
    as_written = [h + (x + bias)]  # what the stitched kernel computed
    reference = evaluate(graph, dict(zip(("h", "x", "bias"), inputs, strict=True)), "float64")
    strict = guard.judge_with_reference(graph, regrouped, as_written, reference, 8.0)
    assert not strict.ok  # the situation of the regression: against TF's order alone it fails
    assert guard.judge(graph, inputs, regrouped, as_written, 8.0).ok
    faulty = [as_written[0] * np.float32(1.01)]
    assert not guard.judge(graph, inputs, regrouped, faulty, 8.0).ok
