"""Workload clusters (benchmarks/workloads) run as rendered CUDA on the CPU and match evaluate.

Checked build (header checks, -fsanitize=alignment), `tiny` profile (grid barriers,
vertical packing). Besides the tolerance rule, each cluster must give the same bits with
its blocks' fibers reshuffled every round and with shared memory starting as 0x00 instead
of NaN bytes. The default tier runs a slice (per graph, the first cluster with a grid
barrier and the first without); all 145 clusters are the slow sweep (about a minute warm).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend
from tests.compiler.targets.cuda_cpu.sweep import (
    WORKLOADS,
    Case,
    buffers_of,
    check_case,
    differing,
    has_atomics,
    problems,
    run_cases,
    workload_cases,
    workload_slice,
)

ATOMIC_SUMS = "dien_attention_gru/cluster_71"

pytestmark = [
    pytest.mark.cuda_cpu,
    pytest.mark.skipif(not any(WORKLOADS.glob("*/cluster_*.json")), reason="no workload clusters saved"),
]


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CudaCpuBackend:
    """Units cached in pytest's cache directory when the cache plugin is on (reruns skip g++)."""
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("stitchfleet-cuda-cpu")) if cache is not None else tmp_path_factory.mktemp("cuda-cpu")
    return CudaCpuBackend(where, debug=True)


def test_workload_slice_on_cuda_cpu(backend: CudaCpuBackend) -> None:
    cases = workload_slice()
    models = {case.label.split("/")[0] for case in cases}
    assert len(models) == len({p.parent.name for p in WORKLOADS.glob("*/cluster_*.json")})
    outcomes = run_cases(backend, cases)
    assert not problems(outcomes)
    assert sum(o.order_checked for o in outcomes) >= len(models)  # the order check ran, not skipped


@pytest.mark.slow
def test_every_workload_cluster_on_cuda_cpu(backend: CudaCpuBackend) -> None:
    outcomes = run_cases(backend, workload_cases())
    assert len(outcomes) >= 145
    assert not problems(outcomes)


def _cluster(label: str) -> Case:
    return next(case for case in workload_cases() if case.label == label)


def test_one_block_at_a_time_is_reproducible_with_atomics(backend: CudaCpuBackend) -> None:
    """Serial block orders give the same bits run after run; other block orders other sums."""
    case = _cluster(ATOMIC_SUMS)
    lowered = case.lowered()
    assert has_atomics(lowered)
    program = backend.compile(lowered.kernels)
    buffers = buffers_of(case, lowered)
    runs = {blocks: [program.with_options(blocks=blocks)(buffers) for _ in range(3)] for blocks in (0, 1)}
    for first, *others in runs.values():
        for other in others:
            assert not differing(first, other, lowered)
    assert differing(runs[0][0], runs[1][0], lowered)  # the atomics' order shows in the bits


@pytest.mark.xfail(
    strict=True,
    reason="finding of this tier: dien_attention_gru/cluster_71 sums 10 column sums of 128 values with "
    "cross-block float atomics; in some legal block orders (seeds 2, 3, 5, ...; about 1 in 3 free-running "
    "launches) mul.1706 misses the tolerance rule (4.9e-07 > 4.77e-07, the 8 x 2^-24 floor); the sim runs "
    "the one index order and passes. On a GPU the guard would revert it now and then. Needs a planner or "
    "tolerance-rule fix (outside the cuda-cpu target)",
)
def test_atomic_sums_pass_the_tolerance_rule_in_every_block_order(backend: CudaCpuBackend) -> None:
    case = _cluster(ATOMIC_SUMS)
    lowered = case.lowered()
    program = backend.compile(lowered.kernels)
    failing = []
    for blocks in range(6):  # index, reversed and four shuffled orders of the 4 blocks
        outcome = check_case(case, lowered, program.with_options(blocks=blocks), strict=False, sim=False)
        failing += [blocks] if outcome.failures else []
    assert not failing, f"block orders {failing} miss the tolerance rule"
