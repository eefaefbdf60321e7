"""Identical kernels of one job (a model's repeated layers: the same C text, so the same cache key) built at once
by its compile workers are compiled once, and each runs as compiled alone (`executable.load_library`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.suite import build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cpu import executable


def test_identical_kernels_built_at_once_compile_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = build_case("layernorm_fwd", (64, 256), "f32")
    cluster = extract(graph, find_clusters(graph, 8).clusters[0].nodes)
    plan = plan_cluster(cluster, 0, PlanOptions())
    builds, build = [], executable._build

    def slow_build(source: Any, options: Any) -> bytes:
        builds.append(source.function)
        time.sleep(0.3)  # both workers are inside the cache lookup before the first file lands
        return build(source, options)

    monkeypatch.setattr(executable, "_build", slow_build)
    found: list[Any] = [None, None]

    def compile_one(slot: int) -> None:
        found[slot] = executable.compile_cluster(cluster, tmp_path, plan, reuse_source=False)

    workers = [threading.Thread(target=compile_one, args=(slot,)) for slot in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(builds) == 1  # before: 2 (both missed the cache, both ran the C compiler)
    assert sorted(kernel.cached for kernel in found) == [False, True]
    assert len(list((tmp_path / "cpu").glob("*.so"))) == 1
    inputs = random_inputs(cluster, seed=3)
    expected = evaluate(cluster, inputs)
    for kernel in found:
        got = kernel(inputs)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
