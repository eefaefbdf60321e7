"""Rendered CUDA of small suite kernels (the prelude is a file of its own), compared with committed snapshots.

A change in generated code shows up in review as a snapshot diff; rewrite them with
STITCHFLEET_UPDATE_SNAPSHOTS=1 (see conftest.py).
"""

from __future__ import annotations

import pytest

from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cuda.render import kernel_text, render_kernel
from tests.compiler.targets.cuda.conftest import check_snapshot

SMALL: dict[str, tuple[int, ...]] = {
    "layernorm_fwd": (24, 200),
    "layernorm_bwd": (24, 200),
    "rmsnorm_fwd": (20, 96),
    "softmax_fwd": (40, 64),
    "softmax_bwd": (12, 300),
    "bias_gelu_fwd": (16, 48),
    "gelu_bwd_bias_grad": (40, 24),
    "cross_entropy_fwd": (64, 100),
    "astitch_fig7": (2, 128),
    "few_long_rows": (2, 1500),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_suite_kernel_snapshot(name: str, update_snapshots: bool) -> None:
    dtype = CASES[name].dtypes[-1]
    graph = build_case(name, SMALL[name], dtype)
    texts = []
    for i, cluster in enumerate(find_clusters(graph, 8).clusters):
        sub = extract(graph, cluster.nodes)
        texts += [kernel_text(render_kernel(k)) for k in lower(sub, plan_cluster(sub, i, PlanOptions("tiny"))).kernels]
    check_snapshot(f"{name}_{'x'.join(map(str, SMALL[name]))}_{dtype}.cu", "\n".join(texts), update_snapshots)
