"""Fixtures of the controller's tests: real compiled cluster kernels (sim backend, from the benchmark suite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet.compiler import pipeline
from stitchfleet.compiler.ir import load
from stitchfleet.plugin.native.kernels import ClusterKernel

SUITE = Path(__file__).resolve().parents[3] / "benchmarks" / "suite"
GRAPHS = ("layernorm_fwd_128x768_f32.json", "softmax_bwd_4096x256_f32.json", "softmax_bwd_4096x512_f32.json")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, ClusterKernel, int]]:
    cache = tmp_path_factory.mktemp("cache")
    found = []
    for name in GRAPHS:
        art = pipeline.compile_graph(load(SUITE / name))
        assert art.report is not None
        graph, plan = art.cluster_graphs[0], art.stitch[0]
        found.append((art.report.clusters[0].fingerprint, ClusterKernel(graph, plan, "sim", cache), len(graph.nodes)))
    return found
