"""A reduction whose operand an earlier part wrote whole as an output loads it (`Gen.stored`) instead of
recomputing its producers: the GELU backward's bias gradient reads `dx`, not dy, x, bias, erf and exp."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import random_inputs
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source


def reduction_part(text: str) -> str:
    """The part function holding the column reduction."""
    parts = text.split("static void f_part")[1:]
    return next(p for p in parts if "column_tiles" in p)


def test_the_bias_gradient_loads_dx() -> None:
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f32")
    part = reduction_part(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    assert "out0_dx[" in part and "sf_erff" not in part and "sf_expf" not in part


def test_a_rounded_output_is_recomputed() -> None:
    """An f16 output holds the value rounded to f16 (the reduction adds it in float): recomputed."""
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f16")
    part = reduction_part(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    assert "sf_erff" in part


def test_the_loaded_sum_equals_the_recomputed_one(tmp_path: Path) -> None:
    """The output holds the bits the reduction computed before, so dbias is unchanged: the column sum of dx
    in float partials of 8 rows folded in double, in row order (here done in numpy from the kernel's dx)."""
    graph = build_case("gelu_bwd_bias_grad", (64, 256), "f32")
    got = compile_cluster(graph, tmp_path)(random_inputs(graph, 4))
    dx = got["dx"]
    want = np.zeros(dx.shape[1])
    for first in range(0, dx.shape[0], 8):
        part = np.zeros(dx.shape[1], np.float32)
        for row in dx[first : first + 8]:
            part += row
        want += part
    np.testing.assert_array_equal(got["dbias"], want.astype(np.float32))
