"""Keras training graphs (benchmarks/keras_apps.py): coverage >= 0.9, every stitched cluster matches evaluate.

The transformer runs in the default tier (cpu: every cluster; sim: the first clusters, the
sim is slow); the Keras applications, larger, in the slow tier with every cluster on both (ResNet50 in
the default tier: every cluster on sim, one of each kind on cpu; all of them on cpu in the sweep).
"""

from __future__ import annotations

import io
from collections.abc import Collection
from pathlib import Path

import pytest
import tensorflow as tf

from benchmarks.keras_apps import APPLICATIONS, training_graph_def
from stitchfleet.compiler.compile_command import EXIT_OK, check_clusters, coverage_of
from stitchfleet.compiler.decision import Decision
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


def _check(
    art: Artifacts, device: str, tmp_path: Path, first: int | None = None, only: Collection[int] | None = None
) -> None:
    out = io.StringIO()
    status = check_clusters(art, device, out, cache_dir=tmp_path, first=first, only=only)
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


# Regression, measured 2026-11-22: one output of NASNetMobile's cluster 110 on cpu had a scaled error of
# 4.0e-05 where the rule allowed 2.1e-05 (8 x the native error): a training batch-norm gradient,
# scale_backprop = sum(dy * (x - mean)) * rsqrt(var + eps) over 32 values per channel, whose worst element
# (4.0e-4 where the output's RMS is 3.7) cancels 10,000-fold. Neither the C backend nor the formula was
# wrong: the kernel was 1.6e-7 from float64 there, while one unit roundoff of noise on the inputs moves
# that element by 1.7e-7 in float64, and numpy's float32 sum happened to be 2.9e-9 off. The rule's
# backward-stability allowance (tolerance.py) accepts it now (at 0.09 of that element's allowance); it
# was a strict xfail until then.
# Graphs with a known miss, as strict xfails. ConvNeXtTiny's was one (its LayerScale gradient summed in one
# thread's order on sim, issue 34): fixed in the planner, tests/compiler/test_stitch_sim.py holds the case.
_KNOWN: dict[str, pytest.MarkDecorator] = {}


# ResNet50 runs by default (~1 min; its cpu check on one cluster of each kind); the other three are the sweep
# (~5 min on 2 cores), as is ResNet50's cpu check of every cluster.
DEFAULT_TIER = "ResNet50"


def one_of_each_kind(art: Artifacts) -> list[int]:
    """The first cluster of each kind: its op set, its groups' kind, layout, mapping and combine, its edges'
    schemes and its launch count, what decides the C the cpu backend builds for it (shapes, names and
    constants aside). ResNet50: 12 of its 101 clusters; 48 are batch-norm-and-ReLU forwards and 47 its
    backwards at other shapes. A cluster left unplanned is a kind of its own."""
    chosen: dict[object, int] = {}
    for i, (graph, plan) in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)):
        ops = frozenset(node.op for node in graph.nodes)
        if isinstance(plan, Decision):
            chosen.setdefault(("unplanned", ops), i)
            continue
        groups = frozenset((g.kind, g.layout, g.mapping.kind, g.combine) for g in plan.groups)
        chosen.setdefault((ops, groups, frozenset(e.scheme for e in plan.edges), len(plan.launches)), i)
    return sorted(chosen.values())


def _marks(name: str) -> list[pytest.MarkDecorator]:
    known = [_KNOWN[name]] if name in _KNOWN else []
    return known if name == DEFAULT_TIER else [*known, pytest.mark.sweep]


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in sorted(APPLICATIONS)])
def test_application_coverage_and_clusters(name: str, tmp_path: Path) -> None:
    art = _compiled(name)
    coverage = coverage_of(art)
    assert coverage.share >= GOAL, coverage.line()
    _check(art, "cpu", tmp_path, only=one_of_each_kind(art) if name == DEFAULT_TIER else None)
    _check(art, "sim", tmp_path)


@pytest.mark.slow
@pytest.mark.sweep  # the default tier checks one ResNet50 cluster of each kind on cpu (one_of_each_kind)
def test_every_resnet50_cluster_on_cpu(tmp_path: Path) -> None:
    _check(_compiled(DEFAULT_TIER), "cpu", tmp_path)
