"""The workload models (small versions, same code as the committed graphs) agree with TF, cluster by cluster."""

from __future__ import annotations

import pytest

from stitchfleet.compiler.ir import Op
from stitchfleet.demo.models import MODELS, build, training_step
from stitchfleet.plugin.frontend.converter import convert_graph_def
from tests.plugin.tf_harness import check_graph

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("name", sorted(MODELS))
def test_workload_converts_and_matches_tensorflow(name: str) -> None:
    graph = build(name, "small")
    conversion = convert_graph_def(training_step(graph), name)
    checked = check_graph(graph, conversion=conversion)
    checked.assert_ok()
    assert checked.values.checked > 100
    assert checked.cluster_count > 0 and checked.clusters.checked >= checked.cluster_count
    # the optimizer's update math is IR; the updates themselves are TF's
    ops = conversion.ops
    assert any(d.op_type == "AssignSubVariableOp" and d.fate == "dropped" for d in ops.values())
    assert {n.op for n in conversion.graph.nodes} >= {Op.REDUCE_SUM, Op.OPAQUE, Op.PARAMETER}


def test_unknown_model_or_size_is_named() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build("resnet")
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        build("bert_encoder", "huge")
