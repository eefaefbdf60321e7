"""`subgraph.extract` with extra outputs: members the graph shows no outside reader of, kept as outputs."""

from __future__ import annotations

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph, GraphBuilder, IRError
from stitchfleet.compiler.subgraph import extract


def _chain() -> tuple[Graph, list[int]]:
    b = GraphBuilder()
    x = b.parameter("x", [4])
    t = b.tanh(x)
    e = b.exp(t)
    y = b.neg(e)
    b.output("y", y)
    return b.build(), [x.id, t.id, e.id, y.id]


def test_extra_outputs_follow_the_boundary_outputs_and_may_repeat() -> None:
    graph, (_, t, e, y) = _chain()
    cluster = extract(graph, {t, e, y}, [t, y])
    assert cluster.metadata.get_ints("source_outputs") == (y, t, y)
    values = evaluate(cluster, {"x": np.linspace(-1, 1, 4, dtype=np.float32)})
    got = [values[name] for name, _ in cluster.outputs]
    np.testing.assert_allclose(got[1], np.tanh(np.linspace(-1, 1, 4, dtype=np.float32)), rtol=1e-6)
    np.testing.assert_array_equal(got[0], got[2])


def test_an_extra_output_outside_the_members_is_refused() -> None:
    graph, (_, t, e, y) = _chain()
    with pytest.raises(IRError, match=r"extra outputs \[1\] are not members"):
        extract(graph, {e, y}, [t])
