"""scripts/corpus_graphs.py: a corpus program's own model code built into a graph the step benchmarks time, with
feeds of the shapes it trains on; the graph trains (its loss moves) and the hook stitches it as the program's run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.corpus import corpus_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import corpus_graphs

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(
        corpus_runs.PROGRAMS is None,
        reason=f"{corpus_runs.CORPUS_DIR} is not set: other people's programs are not committed (tests/corpus)",
    ),
]


def test_bert_builds_from_the_programs_own_code_and_trains() -> None:
    import tensorflow as tf

    graph, loss, train_op, feeds = corpus_graphs.bert()
    data = feeds()
    ids = next(t for t in data if t.op.name == "ids")
    mask = next(t for t in data if t.op.name == "mask")
    assert data[ids].shape == (corpus_graphs.BERT_BATCH, corpus_graphs.BERT_SEQUENCE)
    assert np.array_equal(data[ids] > 0, data[mask] > 0)  # padding past each sentence, as the program's features
    assert any(op.type == "RandomUniform" for op in graph.get_operations())  # its dropout, training mode
    with graph.as_default(), tf.compat.v1.train.MonitoredSession() as session:
        losses = [session.run((loss, train_op), data)[0] for _ in range(5)]
    assert all(np.isfinite(losses)) and losses[-1] != losses[0]
    again = corpus_graphs.bert()  # the program is loaded once: its absl flags cannot be defined twice
    assert again[0] is not graph
