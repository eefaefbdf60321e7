"""The guard's judgement (`plugin/guard/numeric.py`): stitched outputs within rounding of TF's own pass without the
fp64 reference; anything further off, non-finite or a differing integer is judged against fp64, where a
real bug fails and a different summation order passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.plugin.guard import numeric


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

    monkeypatch.setattr(numeric, "evaluate", refuse)


def test_outputs_equal_to_tfs_pass_without_the_fp64_reference(no_fp64: None) -> None:
    graph, inputs, original = case()
    finding = numeric.judge(graph, inputs, original, [o.copy() for o in original], 8.0)
    assert finding.ok and finding.compiled_error == 0.0


def test_a_last_bit_difference_passes_without_the_fp64_reference(no_fp64: None) -> None:
    graph, inputs, original = case(1)
    stitched = [np.nextafter(o, np.float32(np.inf)) for o in original]  # one ulp up everywhere
    finding = numeric.judge(graph, inputs, original, stitched, 8.0)
    assert finding.ok and 0.0 < finding.compiled_error <= finding.allowed


def test_a_wrong_output_is_judged_against_fp64_and_fails() -> None:
    graph, inputs, original = case(2)
    stitched = [o.copy() for o in original]
    stitched[1][3, 7] *= 1.5  # a corrupted element
    finding = numeric.judge(graph, inputs, original, stitched, 8.0)
    assert not finding.ok and finding.output == "scaled" and "exceeds" in finding.reason


def test_a_different_summation_order_goes_to_fp64_and_passes() -> None:
    graph, inputs, original = case(3)
    x = inputs[0].astype(np.float32)
    reordered = np.zeros(64, np.float32)
    for column in range(511, -1, -1):  # summed backwards, in float32: off by more than the fast bound
        reordered += x[:, column] * x[:, column]
    stitched = [reordered, original[1].copy()]
    assert numeric._distance(reordered, original[0]) > numeric._fast_bound(np.dtype(np.float32), 8.0)
    assert numeric.judge(graph, inputs, original, stitched, 8.0).ok


def test_nan_where_tf_is_finite_fails() -> None:
    graph, inputs, original = case(4)
    stitched = [o.copy() for o in original]
    stitched[0][5] = np.nan
    finding = numeric.judge(graph, inputs, original, stitched, 8.0)
    assert not finding.ok and "non-finite" in finding.reason


def test_factor_one_accepts_only_identical_results_on_the_fast_path(no_fp64: None) -> None:
    graph, inputs, original = case(5)
    assert numeric.judge(graph, inputs, original, [o.copy() for o in original], 1.0).ok
    with pytest.raises(AssertionError, match="fp64 reference was computed"):
        numeric.judge(graph, inputs, original, [np.nextafter(o, np.float32(np.inf)) for o in original], 1.0)


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
    strict = numeric.judge_with_reference(graph, regrouped, as_written, reference, 8.0)
    assert not strict.ok  # the situation of the regression: against TF's order alone it fails
    assert numeric.judge(graph, inputs, regrouped, as_written, 8.0).ok
    faulty = [as_written[0] * np.float32(1.01)]
    assert not numeric.judge(graph, inputs, regrouped, faulty, 8.0).ok


ROWS, CHANNELS, ILL = 32, 64, 5


def scale_backprop() -> Graph:
    """A training batch norm's scale gradient: sum(dy * (x - mean)) * rsqrt(var + eps) per channel."""
    b = GraphBuilder()
    dy, x = b.parameter("dy", (ROWS, CHANNELS)), b.parameter("x", (ROWS, CHANNELS))
    mean = b.mul(b.reduce_sum(x, (0,)), 1.0 / ROWS)
    centred = b.sub(x, b.broadcast(mean, (ROWS, CHANNELS), (1,)))
    var = b.mul(b.reduce_sum(b.square(centred), (0,)), 1.0 / ROWS)
    b.output("scale_backprop", b.mul(b.reduce_sum(b.mul(dy, centred), (0,)), b.rsqrt(b.add(var, 1e-3))))
    return b.build()


def blocked_f32(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The same in float32, each channel summed in 4 interleaved lanes then a tree (a SIMD kernel's order)."""
    centred = (x - x.sum(axis=0, dtype=np.float32) / np.float32(ROWS)).astype(np.float32)
    var = (centred * centred).sum(axis=0, dtype=np.float32) / np.float32(ROWS)
    lanes = np.zeros((4, CHANNELS), np.float32)
    for row, terms in enumerate((dy * centred).astype(np.float32)):
        lanes[row % 4] += terms
    total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
    return (total / np.sqrt(var + np.float32(1e-3))).astype(np.float32)


def test_an_ill_conditioned_gradient_in_another_order_passes_and_faults_fail() -> None:
    """Regression (NASNetMobile's cluster 110 on cpu, the backend tests' rule): a batch-norm scale
    gradient whose channel cancels 10,000-fold, TF's result exact there by chance, the kernel's 4-lane
    sum an ordinary float32 rounding away. It failed every look but the backward-stability allowance
    (tolerance.py); faults on the same data still fail it. Seed 5: one where numpy's own float32 order
    (the guard's second native result) is also close to exact there, as it was on NASNetMobile."""
    graph = scale_backprop()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, CHANNELS)).astype(np.float32)
    dy = rng.standard_normal((ROWS, CHANNELS)).astype(np.float32)
    centred = x[:, ILL] - x[:, ILL].astype(np.float64).mean()
    d = dy[:, ILL].astype(np.float64)  # the ill channel's terms of ~1 cancel to ~1e-4
    dy[:, ILL] = d - centred * (d @ centred) / (centred @ centred) * (1 - 1e-4)
    given = {"dy": dy, "x": x}
    reference = evaluate(graph, given, "float64")
    exact = [reference["scale_backprop"].astype(np.float32)]  # TF's order, nearly exact by chance
    stitched = [blocked_f32(dy, x)]
    in_order = evaluate(graph, given)
    strict = numeric.judge_with_reference(graph, exact, stitched, reference, 8.0, in_order=in_order)
    assert not strict.ok  # both orders and the summation allowance refuse a correct kernel
    finding = numeric.judge(graph, [dy, x], exact, stitched, 8.0)
    assert finding.ok and "backward-stability allowance" in finding.reason
    assert finding.ratio is not None and finding.ratio <= 1.0
    dropped = stitched[0].copy()
    dropped[ILL] -= np.float32(dy[0, ILL] * (x[0, ILL] - x[:, ILL].mean()) / np.sqrt(x[:, ILL].var() + 1e-3))
    for fault in (dropped, np.roll(stitched[0], 1), stitched[0] * np.float32(1 + 1e-4)):
        assert not numeric.judge(graph, [dy, x], exact, [fault], 8.0).ok


def test_a_float64_bias_gradient_summed_in_another_order_passes_and_faults_fail() -> None:
    """The Estimator MNIST corpus program's false revert (numpy_input_fn feeds float64 images, so its dense
    layer's bias gradient is a float64 column sum): TF's and the reference's sums are the same order, the
    kernel's another, no further from the exact sums; judged against the reference as if it were exact, it
    was reverted ("error 1.05e-14 exceeds 8 x native error (8.88e-16 allowed)")."""
    b = GraphBuilder()
    b.output("bias_grad", b.reduce_sum(b.parameter("x", (100, 1024), "f64"), (0,)))
    graph = b.build()
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((100, 1024))
    terms = raw - raw.mean(0) + 1e-4 * rng.standard_normal(1024)  # cancelling sums, as a gradient's are
    tf_like = terms.sum(0)
    blocked = terms.reshape(4, 25, 1024).sum(1).sum(0)
    finding = numeric.judge(graph, [terms], [tf_like], [blocked], 8.0)
    assert finding.ok, finding.reason
    dropped = blocked.copy()
    dropped[5] -= terms[7, 5]
    assert not numeric.judge(graph, [terms], [tf_like], [dropped], 8.0).ok
    assert not numeric.judge(graph, [terms], [tf_like], [blocked * (1 + 1e-9)], 8.0).ok
