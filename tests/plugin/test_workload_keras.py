"""Keras training graphs (benchmarks/keras_apps.py): coverage >= 0.9, every stitched cluster matches evaluate.

The transformer runs in the default tier (cpu: every cluster; sim: the first clusters, the
sim is slow); the Keras applications, larger, in the slow tier with every cluster on both.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import tensorflow as tf

from benchmarks.keras_apps import APPLICATIONS, training_graph_def
from stitchfleet.compiler.compile_command import EXIT_OK, check_clusters, coverage_of
from stitchfleet.compiler.pipeline import Artifacts, Options, compile_graph
from stitchfleet.plugin.frontend.converter import convert_graph_def

pytestmark = pytest.mark.tf
GOAL = 0.9
SIM_SLICE = 4


def _compiled(name: str) -> Artifacts:
    with tf.Graph().as_default():
        tf.compat.v1.disable_eager_execution()
        graph_def = training_graph_def(name)
    return compile_graph(convert_graph_def(graph_def, name).graph, Options())


def _check(art: Artifacts, device: str, tmp_path: Path, first: int | None = None) -> None:
    out = io.StringIO()
    status = check_clusters(art, device, out, cache_dir=tmp_path, first=first)
    text = out.getvalue()
    assert status == EXIT_OK, text
    assert "FAIL" not in text and "not lowered" not in text and text.count(" ok") >= 1, text


@pytest.fixture(scope="module")
def transformer() -> Artifacts:
    return _compiled("KerasTransformer")


def test_transformer_coverage(transformer: Artifacts) -> None:
    coverage = coverage_of(transformer)
    assert coverage.share >= GOAL, coverage.line()


def test_transformer_clusters_on_cpu(transformer: Artifacts, tmp_path: Path) -> None:
    _check(transformer, "cpu", tmp_path)


def test_transformer_clusters_on_sim(transformer: Artifacts, tmp_path: Path) -> None:
    _check(transformer, "sim", tmp_path, SIM_SLICE)


# Measured 2026-11-22: one output of NASNetMobile's cluster 110 on cpu has a scaled error of
# 4.0e-05 where the rule allows 2.1e-05 (8 x the native error). The cluster is a training batch-norm
# gradient; the output is scale_backprop = sum(dy * (x - mean)) * rsqrt(var + eps) over 32 values
# per channel, a cancelling sum. Understood 2026-11-23: neither the C backend nor the formula is wrong.
# The worst element is 4.0e-4 where the output's RMS is 3.7 (terms of ~1 cancel 10,000-fold); the C
# kernel is 1.6e-7 from float64 there, while one unit roundoff of noise on the inputs alone moves that
# element by 1.7e-7 (median of 20 draws, max 6.7e-7) in float64; numpy's pairwise float32 sum happens to
# be 2.9e-9 off. The rule (8 x numpy's error, floor 1e-3 of the RMS) cannot tell an ill-conditioned element's
# ordinary rounding from a fault; a backward-stability allowance (the reference's own movement under
# unit-roundoff input noise) would. Kept visible until the rule has one.
_KNOWN = {
    "NASNetMobile": pytest.mark.xfail(
        strict=True, reason="cluster 110 on cpu: an ill-conditioned element's float32 rounding exceeds the rule (2.0x)"
    ),
}


# ResNet50 runs by default (~1 min); the other three are the sweep (~5 min on 2 cores).
DEFAULT_TIER = "ResNet50"


def _marks(name: str) -> list[pytest.MarkDecorator]:
    known = [_KNOWN[name]] if name in _KNOWN else []
    return known if name == DEFAULT_TIER else [*known, pytest.mark.sweep]


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in sorted(APPLICATIONS)])
def test_application_coverage_and_clusters(name: str, tmp_path: Path) -> None:
    art = _compiled(name)
    coverage = coverage_of(art)
    assert coverage.share >= GOAL, coverage.line()
    _check(art, "cpu", tmp_path)
    _check(art, "sim", tmp_path)
