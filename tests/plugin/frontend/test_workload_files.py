"""The committed workload graphs (benchmarks/workloads) are valid IR and match their summary.

No TensorFlow here: the files exist so that machines without TF can compile and
benchmark real training graphs; this recompiles them and checks the recorded figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stitchfleet.compiler import ir
from stitchfleet.compiler.pipeline import Options, compile_graph

WORKLOADS = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads"
SUMMARY = json.loads((WORKLOADS / "summary.json").read_text())


def test_the_four_workloads_are_committed_and_small() -> None:
    assert set(SUMMARY) == {"bert_encoder", "transformer_block", "dien_attention_gru", "crnn_head"}
    total = sum(f.stat().st_size for f in WORKLOADS.rglob("*.json"))
    assert total < 4 * 1024 * 1024


@pytest.mark.parametrize("name", sorted(SUMMARY))
def test_summary_matches_a_fresh_compile(name: str) -> None:
    row = SUMMARY[name]
    graph = ir.load(WORKLOADS / name / "graph.json")
    report = compile_graph(graph, Options()).report
    assert report is not None
    assert report.graph_fingerprint == row["graph_fingerprint"]
    assert len(report.clusters) == row["clusters"] > 0
    assert sum(c.size for c in report.clusters) == row["mi_ops"]
    assert report.totals() == row["kernels"]
    assert row["kernels"]["xla_style"] < row["kernels"]["per_op"]
    assert row["check"]["checked"] > 0 and row["check"]["failures"] == []


@pytest.mark.parametrize("name", sorted(SUMMARY))
def test_cluster_files_are_the_clusters(name: str) -> None:
    graph = ir.load(WORKLOADS / name / "graph.json")
    files = sorted((WORKLOADS / name).glob("cluster_*.json"))
    assert len(files) == SUMMARY[name]["clusters"]
    for index, path in enumerate(files):
        cluster = ir.load(path)
        assert cluster.metadata["cluster"] == index
        assert cluster.metadata["source_fingerprint"] == ir.fingerprint(graph)
        members = cluster.metadata.get_ints("source_nodes")
        assert all(graph.node(m).op.is_memory_intensive for m in members)
        assert all(n.is_static for n in cluster.nodes)
