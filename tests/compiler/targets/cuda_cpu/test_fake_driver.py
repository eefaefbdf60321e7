"""The launch library's host half on the fake CUDA driver (issue 33 item 1), in a subprocess of its own.

`fake_gpu.py` drives workload clusters end to end through `LaunchLibrary.program` on the fake
libcuda.so.1 (kernels run by cuda-cpu from the same module source NVRTC compiles), each twice on
garbage-filled outputs and scratch: the in-kernel non-finite flag (clear, set by a NaN input, reset), the
blame kernels, each program's destroy (module unloaded, pinned flag words freed, nothing left in the
fake's books), and one cluster of each kind under every injected fault. The default tier runs the workload
slice (per graph the first cluster with a grid barrier, and one graph's first without); the sweep runs every
cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.compiler.targets.cuda_cpu.sweep import WORKLOADS

ROOT = Path(__file__).resolve().parents[4]
pytestmark = [
    pytest.mark.cuda_cpu,
    pytest.mark.skipif(not any(WORKLOADS.glob("*/cluster_*.json")), reason="no workload clusters saved"),
]


# Driver calls the tier does not fail on purpose: cuInit and the primary-context path (sf_primary_enter/leave,
# set-up outside a program), the error text itself, the pop (the library pops whatever happened, so it must
# not fail), cuFuncSetAttribute (only kernels above 48 KiB of dynamic shared memory call it, none in the slice: its
# fault is injected on the > 48 KiB kernel, `_assert_large_shared_memory`),
# occupancy (its fault is the device holding no block, "occupancy 0") and the teardown calls, whose failure the
# void destroy cannot report (the books would show the leak).
_NOT_INJECTED = {
    "cuInit",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxPopCurrent",
    "cuFuncSetAttribute",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuModuleUnload",
    "cuMemFreeHost",
}


def _tier(request: pytest.FixtureRequest, tmp_path: Path, *labels: str, timeout_s: int) -> dict[str, Any]:
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("stitchfleet-fake-driver")) if cache is not None else tmp_path / "cache"
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.compiler.targets.cuda_cpu.fake_gpu", str(where), str(report), *labels]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def _assert_clusters(report: dict[str, Any]) -> None:
    assert report["missing_calls"] == []  # the fake exports every driver call csrc/launch.c resolves
    problems = {c["label"]: c["problems"] for c in report["clusters"] if c["problems"]}
    assert problems == {}
    assert all(c["runs"] == 2 for c in report["clusters"])
    # every program created was destroyed with its module unloaded and its pinned words freed
    assert all(c["destroyed"] == 1 + c["flag_checked"] for c in report["clusters"])
    assert report["books"]["modules"] == report["books"]["pinned"] == 0
    print(f"clusters driven end to end through the launch library on the fake driver: {len(report['clusters'])}")


@pytest.mark.slow  # 2 min on a loaded 2-core machine (36 s of CPU warm); `make test` runs it
def test_workload_slice_through_the_launch_library_on_the_fake_driver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    report = _tier(request, tmp_path, timeout_s=900)
    models = {p.parent.name for p in WORKLOADS.glob("*/cluster_*.json")}
    assert {c["label"].split("/")[0] for c in report["clusters"]} == models
    _assert_clusters(report)
    assert sum(c["cooperative"] for c in report["clusters"]) >= len(models)  # grid barriers ran cooperatively
    # a NaN input set a second program's flag (not the first's), the host's reset and a clean run cleared it,
    # and the blame kernels found ours NaN where the clean run's values were finite
    assert any(c["flag_checked"] for c in report["clusters"])
    assert all(c["blamed"] == 1 for c in report["clusters"] if c["flag_checked"])
    # every injected fault is a LaunchError naming the failed call, contexts stay balanced, a failed create
    # leaks nothing, the next run recovers
    calls = {f["call"] for f in report["faults"]}
    assert calls >= {name.removesuffix("_v2") for name in report["resolved"]} - _NOT_INJECTED
    assert {f["where"] for f in report["faults"]} == {"create", "run", "blame"}
    for fault in report["faults"]:
        assert fault["problems"] == [], fault
        named = fault["call"] if fault["call"] != "occupancy 0" else "grid barrier"
        assert named.removesuffix("Async") in fault["error"], fault
    refusals = report["refusals"]
    assert "barrier counter not zero" in refusals["counter not reset"]
    assert "too many resources requested for launch" in refusals["wider than __launch_bounds__"]
    assert refusals["sf_nonfinite_flag bytes"] == "8"
    assert "copy outside any allocation or global" in refusals["copy wider than its global"]
    assert "copy outside any allocation or global" in refusals["copy into an unloaded module's global"]
    assert "never returned" in refusals["free of memory never allocated"]
    assert "never returned (or freed twice)" in refusals["second free"]
    assert "function of an unloaded module" in refusals["launch after unload"]
    assert "invalid resource handle" in refusals["second unload"]
    assert "pop without a push" in refusals["pop without a push"]
    _assert_large_shared_memory(report["large_shared_memory"])


def test_repeated_outputs_through_the_launch_library_on_the_fake_driver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A cluster whose outputs repeat an earlier one's value (plan/repeats.py): the kernels store each value once
    and the repeats get their source's device buffer (as the GPU op hands it out); every output equals the
    reference, and a NaN reaching a stored output sets the flag and is blamed (a repeat is checked as its source).
    About 10 s."""
    report = _tier(request, tmp_path, "repeats", timeout_s=600)
    assert [c["label"] for c in report["clusters"]] == ["repeats"]
    _assert_clusters(report)
    assert report["clusters"][0]["flag_checked"] and report["clusters"][0]["blamed"] == 1


def _assert_large_shared_memory(found: dict[str, Any]) -> None:
    """The > 48 KiB dynamic shared-memory kernel (issue 32): opted in at create, right twice on garbage, refused
    by the fake from a function not opted in (as a GPU refuses it), and a failed opt-in a LaunchError."""
    assert found["dynamic_smem"] > 48 * 1024
    assert found["opt_in"] == [f"cuFuncSetAttribute attribute=8 value={found['dynamic_smem']}"]  # MAX_DYNAMIC_SHARED
    assert found["runs_equal"] == [True, True]
    assert "dynamic shared memory above the function's allowance" in found["without_opt_in"]
    assert found["opt_in_fault"].startswith("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) failed")
    assert not found["leaked"]


@pytest.mark.slow
@pytest.mark.sweep  # every workload cluster; the slice above runs by default
def test_every_workload_cluster_through_the_launch_library_on_the_fake_driver(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    report = _tier(request, tmp_path, "all", timeout_s=3600)
    assert len(report["clusters"]) >= 145
    _assert_clusters(report)
