"""The cuda backend: import without pycuda, cubin cache, device array layout, co-residency; gpu tier vs evaluate."""

from __future__ import annotations

import importlib.util
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.devices import device
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cache import ArtifactCache, cache_key
from stitchfleet.compiler.targets.cuda import driver as cuda
from stitchfleet.compiler.targets.cuda.device_arrays import (
    DeviceArrayError,
    check_coresident,
    from_device,
    resident_blocks,
    to_device,
)
from stitchfleet.compiler.tolerance import check_outputs
from tests.compiler.test_stitch_sim import SMALL

HAS_PYCUDA = importlib.util.find_spec("pycuda") is not None


@pytest.mark.skipif(HAS_PYCUDA, reason="pycuda is installed here")
def test_backend_without_pycuda_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(cuda.CudaUnavailableError, match="needs pycuda"):
        cuda.CudaBackend(tmp_path).compile([])


def test_cache_key_depends_on_every_input() -> None:
    base = cache_key("src", "sm_90", {"nvcc": "13.0"})
    assert len({base, cache_key("src2", "sm_90", {"nvcc": "13.0"}), cache_key("src", "sm_75", {"nvcc": "13.0"})}) == 3
    assert base != cache_key("src", "sm_90", {"nvcc": "13.1"}) != cache_key("src", "sm_90", {"nvcc": "13.0"}, ("-G",))


def test_cache_builds_once_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    cache, calls = ArtifactCache(tmp_path / "c"), []
    key = cache_key("s", "sm_90", {})
    for _ in range(2):
        assert cache.get_or_build(key, lambda: calls.append(1) or b"cubin") == b"cubin"
    assert calls == [1] and [p.name for p in (tmp_path / "c").iterdir()] == [f"{key}.cubin"]
    with pytest.raises(ValueError, match="alphanumeric"):
        cache.path("../etc")


def _write_many(root: str, key: str, seed: int) -> None:
    cache = ArtifactCache(Path(root))
    for _ in range(50):
        cache.put(key, bytes([seed % 251]) * 100_000)
        got = cache.get(key)
        assert got is not None and len(got) == 100_000 and len(set(got)) == 1  # never a torn file


def test_concurrent_writers_never_leave_a_torn_entry(tmp_path: Path) -> None:
    key = cache_key("same", "sm_90", {})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), key, s)) for s in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_bf16_goes_to_the_device_as_rounded_16_bit_patterns() -> None:
    buf = ir.Buffer("b", DType.BF16, 3, ir.Role.INPUT)
    raw = to_device(buf, np.array([1.0, -2.5, 1.00390625 + 2**-10], np.float32))
    assert raw.dtype == np.uint16 and list(raw[:2]) == [0x3F80, 0xC020]
    assert from_device(buf, raw).tolist() == [1.0, -2.5, 1.0078125]


def test_host_array_mismatch_is_named() -> None:
    buf = ir.Buffer("x", DType.F32, 4, ir.Role.INPUT)
    with pytest.raises(DeviceArrayError, match="'x': got 3 elements, expected 4"):
        to_device(buf, np.zeros(3, np.float32))
    with pytest.raises(DeviceArrayError, match="got float64, expected float32"):
        to_device(buf, np.zeros(4))


def test_grid_barrier_launch_larger_than_the_device_holds_is_refused() -> None:
    h200 = device("h200")
    assert resident_blocks(h200, 1024, 32, 0) == 264
    assert resident_blocks(h200, 1024, 64, 0) == 132  # registers halve the residency
    assert resident_blocks(h200, 1024, 300, 0) == 0
    check_coresident("k", 264, 264)
    with pytest.raises(DeviceArrayError, match="would deadlock"):
        check_coresident("k", 265, 264)


# ---- gpu tier: the compiler suite on the cuda backend, checked against evaluate -----------------


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["tiny", "h200"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_suite_case_on_cuda(name: str, profile: str, tmp_path: Path) -> None:
    backend = cuda.CudaBackend(tmp_path)
    for dtype in CASES[name].dtypes:
        graph = build_case(name, SMALL[name], dtype)
        for i, cluster in enumerate(find_clusters(graph, 8).clusters):
            sub = extract(graph, cluster.nodes)
            lowered = lower(sub, plan_cluster(sub, i, PlanOptions(profile)))
            inputs = random_inputs(sub, seed=i + 1)
            buffers = {buf: np.asarray(inputs[n]).reshape(-1) for n, buf in lowered.inputs}
            raw = backend.compile(lowered.kernels)(buffers)
            shapes = {n: sub.node(nid).shape for n, nid in sub.outputs}
            got = {n: raw[buf].reshape(shapes[n]) for n, buf in lowered.outputs}
            output_checks = check_outputs(got, evaluate(sub, inputs), evaluate(sub, inputs, "float64"))
            assert all(v.ok for v in output_checks.values()), {
                n: v.reason for n, v in output_checks.items() if not v.ok
            }
