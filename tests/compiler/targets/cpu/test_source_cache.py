"""The generated C, remembered on disk (`source_cache`): the same text as generated, and never an entry
written by other code, another plan or another function name."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.plan import PlanOptions, StitchPlan, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cpu import source_cache
from stitchfleet.compiler.targets.cpu.source import cluster_source


def _cluster() -> tuple[Graph, StitchPlan]:
    graph = build_case("layernorm_fwd", (128, 768), "f32")
    cluster = extract(graph, find_clusters(graph, 8).clusters[0].nodes)
    return cluster, plan_cluster(cluster, 0, PlanOptions())


def test_a_cached_source_is_the_generated_one(tmp_path: Path) -> None:
    graph, plan = _cluster()
    first = source_cache.cached_source(graph, plan, "stitch_x", tmp_path)
    assert first == cluster_source(graph, plan, "stitch_x")
    assert len(list((tmp_path / "cpu-source").glob("*.json"))) == 1
    again = source_cache.cached_source(graph, plan, "stitch_x", tmp_path)
    assert again == first and again is not first  # read back from the entry


def test_the_key_covers_the_function_the_plan_and_the_compiler_code(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, plan = _cluster()
    key = source_cache.source_key(graph, plan, "stitch_x")
    assert source_cache.source_key(graph, plan, "stitch_y") != key
    other = plan_cluster(graph, 1, PlanOptions())
    assert source_cache.source_key(graph, other, "stitch_x") != key
    monkeypatch.setattr(source_cache, "code_digest", lambda: "another generator")
    assert source_cache.source_key(graph, plan, "stitch_x") != key


def test_a_malformed_entry_is_generated_again(tmp_path: Path) -> None:
    graph, plan = _cluster()
    first = source_cache.cached_source(graph, plan, "stitch_x", tmp_path)
    (entry,) = (tmp_path / "cpu-source").glob("*.json")
    entry.write_text('{"function": "stitch_x", "text": "int broken;"}')  # no params: not an entry
    assert source_cache.cached_source(graph, plan, "stitch_x", tmp_path) == first
    assert source_cache.cached_source(graph, plan, "stitch_x", tmp_path) == first
