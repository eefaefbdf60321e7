"""The translation check feeds a zero-size input empty, as TF's placeholder of that static shape takes it.

Regression (issue 30's corpus, Horovod's word2vec): `random_inputs` gives every dimension at least 1, so the
check fed a (1,) value to a (0,) placeholder of the NCE cluster ("Cannot feed value of shape (1,) for Tensor
stitchfleet_in_12:0, which has shape (0,)"); the check could not run and its cluster stayed with TF.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet.compiler.evaluate import random_inputs
from stitchfleet.compiler.ir import Attrs, DType, Graph, Node, Op, load
from stitchfleet.plugin.guard import translation

pytestmark = pytest.mark.tf  # translation imports TensorFlow
WORKLOAD = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads" / "transformer_block" / "cluster_03.json"


def _with_empty_input(graph: Graph) -> Graph:
    nodes = list(graph.nodes)
    nodes.append(Node(len(nodes), Op.PARAMETER, (), (0,), DType.F32, "empty", Attrs(name="empty")))
    return Graph.create(nodes, graph.output_map, graph.metadata)


def test_a_zero_size_input_is_fed_empty_and_the_others_as_drawn() -> None:
    graph = _with_empty_input(load(WORKLOAD))
    drawn = random_inputs(graph, 1)
    assert drawn["empty"].shape == (1,)  # what the check used to feed
    sized = translation._sized(graph, dict(drawn))
    assert sized["empty"].shape == (0,) and sized["empty"].dtype == drawn["empty"].dtype
    assert all((sized[name] == value).all() for name, value in drawn.items() if name != "empty")
