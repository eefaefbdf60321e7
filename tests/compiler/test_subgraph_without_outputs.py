"""`subgraph.without_outputs`: a cluster graph losing outputs nobody reads, and the nodes only they needed."""

from __future__ import annotations

import numpy as np
import pytest

from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph, GraphBuilder, IRError, Op
from stitchfleet.compiler.subgraph import extract, without_outputs


def _cluster() -> tuple[Graph, Graph]:
    """x, w -> tanh(x) (read outside), exp(tanh(x)) * w, and neg(w) (only the dropped output needs it)."""
    b = GraphBuilder()
    x, w = b.parameter("x", [4]), b.parameter("w", [4])
    t = b.tanh(x)
    ex = b.exp(t)
    e = b.mul(ex, w)
    n = b.neg(w)
    b.output("t", t)
    b.output("e", e)
    b.output("n", n)
    graph = b.build()
    return graph, extract(graph, {t.id, ex.id, e.id, n.id})


def test_dropping_outputs_prunes_what_only_they_needed_and_keeps_every_parameter() -> None:
    _, cluster = _cluster()
    assert [name for name, _ in cluster.outputs] == ["tanh.2", "mul.4", "neg.5"]
    kept = without_outputs(cluster, [0, 2])
    assert [name for name, _ in kept.outputs] == ["mul.4"]
    assert [n.op for n in kept.nodes].count(Op.NEG) == 0  # only the dropped output read it
    assert [p.name for p in kept.parameters] == [p.name for p in cluster.parameters]  # inputs keep their positions
    sources = cluster.metadata.get_ints("source_outputs")
    assert kept.metadata.get_ints("source_outputs") == (sources[1],)
    inputs = {"x": np.linspace(-1, 1, 4, dtype=np.float32), "w": np.arange(4, dtype=np.float32)}
    np.testing.assert_array_equal(evaluate(kept, inputs)["mul.4"], evaluate(cluster, inputs)["mul.4"])


def test_every_output_or_an_unknown_position_is_refused() -> None:
    _, cluster = _cluster()
    with pytest.raises(IRError, match="at least one must stay"):
        without_outputs(cluster, [0, 1, 2])
    with pytest.raises(IRError, match=r"cannot drop outputs \[5\]"):
        without_outputs(cluster, [5])
