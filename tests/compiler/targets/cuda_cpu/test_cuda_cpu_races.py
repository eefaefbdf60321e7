"""cuda-cpu's shared-memory race check (race builds: shadow state per word between barriers, random yields).

The fast slice is the hand-written kernels: a missing barrier before a read of another thread's word
(static and extern shared memory) and a write over a word another thread read since the last barrier
are each reported with the threads and the word; their fixes run clean. Workload clusters (`races.py`,
slow tier): `RACE_SLICE`, one cluster of each kind of shared-memory use (the test checks that no saved
cluster is of a kind it lacks), bert_encoder/cluster_03's regression, every cluster in the sweep.
Findings on the workload slice (8 clusters, 2026-11-23): no race, every output within tolerance of
`evaluate`; crnn_head's two clusters touch no shared memory.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.kernel import Buffer, Launch, Role
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend, CudaCpuError, CudaCpuOptions, CudaCpuProgram
from stitchfleet.compiler.targets.cuda_cpu.module import CudaCpuError as ModuleError
from stitchfleet.compiler.targets.cuda_cpu.module import load_module, translation_unit
from tests.compiler.targets.cuda_cpu.races import OWN_TEST, RACE_SLICE, check_races, shared_use
from tests.compiler.targets.cuda_cpu.sweep import WORKLOADS, lowered_workloads, workload_cases

pytestmark = pytest.mark.cuda_cpu
ROOT = Path(__file__).resolve().parents[4]

X = Buffer("x", DType.F32, 64, Role.INPUT)
Y = Buffer("y", DType.F32, 64, Role.OUTPUT)
INPUT = np.arange(64, dtype=np.float32)
STATIC = "  __shared__ float s[64];\n  s[threadIdx.x] = x[threadIdx.x];\n"
EXTERN = (
    "  extern __shared__ __align__(16) unsigned char sf_smem[];\n"
    "  float* s = reinterpret_cast<float*>(sf_smem);\n  s[threadIdx.x] = x[threadIdx.x];\n"
)
NEXT = "  y[threadIdx.x] = s[(threadIdx.x + 1) % 64];"
# (name, body, the hazard it must be reported with, "" for a clean kernel)
KERNELS = (
    ("raw_static", STATIC + NEXT, r"race \(write after read\).*static __shared__ byte 4 "),
    ("fixed_static", STATIC + "  __syncthreads();\n" + NEXT, ""),
    ("raw_extern", EXTERN + NEXT, r"race \(write after read\).*extern __shared__ byte 4 "),
    ("fixed_extern", EXTERN + "  __syncthreads();\n" + NEXT, ""),
    (
        "war",
        STATIC + "  __syncthreads();\n  float v = s[(threadIdx.x + 1) % 64];\n  s[threadIdx.x] = v + 1.0f;\n"
        "  y[threadIdx.x] = v;",
        r"race \(write after read\).*generation 1\)",
    ),
    (
        "fixed_war",
        STATIC + "  __syncthreads();\n  float v = s[(threadIdx.x + 1) % 64];\n  __syncthreads();\n"
        "  s[threadIdx.x] = v + 1.0f;\n  y[threadIdx.x] = v;",
        "",
    ),
)


# The tests of the hand-written kernels on one xdist worker: `programs` is an instrumented build, once per worker
# that runs one of them (two workers built it twice: 28 s and 15 s on the loaded 2-core machine).
HAND_WRITTEN = pytest.mark.xdist_group("cuda_cpu_race_kernels")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CudaCpuProgram]:
    options = CudaCpuOptions(tmp_path_factory.mktemp("races"), debug=True, race=True)
    kernels = [
        CudaKernel(
            name,
            f'extern "C" __global__ void {name}(const float* x, float* y) {{\n{body}\n}}\n',
            (X, Y),
            Launch(1, 64, 1),
            False,
            256,
            0,
        )
        for name, body, _ in KERNELS
    ]
    library = load_module(kernels, options)  # one unit: the instrumented build is the slow part
    return {k.name: CudaCpuProgram([(k, library)], {"x": X, "y": Y}, options) for k in kernels}


@HAND_WRITTEN
@pytest.mark.parametrize(("name", "hazard"), [(name, hazard) for name, _, hazard in KERNELS])
def test_hazards_are_reported_and_their_fixes_run_clean(
    programs: dict[str, CudaCpuProgram], name: str, hazard: str
) -> None:
    if hazard:
        with pytest.raises(CudaCpuError, match=hazard):
            programs[name]({"x": INPUT})
        return
    got: npt.NDArray[Any] = programs[name]({"x": INPUT})["y"]
    np.testing.assert_array_equal(got, np.roll(INPUT, -1))


@HAND_WRITTEN
def test_the_check_counts_the_kernels_shared_accesses_only(programs: dict[str, CudaCpuProgram]) -> None:
    # fixed_static: 64 writes and 64 reads of s[]; not the fill, the runtime's books or the scheduler's accesses
    library = programs["fixed_static"].loaded[0][1]
    library.sf_race_checked.restype = ctypes.c_ulong
    before = int(library.sf_race_checked())
    programs["fixed_static"]({"x": INPUT})
    assert int(library.sf_race_checked()) - before == 128


def test_the_race_check_needs_the_checked_build() -> None:
    kernel = CudaKernel("k", 'extern "C" __global__ void k() {}\n', (), Launch(1, 32, 1), False, 0, 0)
    with pytest.raises(ModuleError, match="needs the checked build"):
        translation_unit([kernel], checked=False, race=True)


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> CudaCpuBackend:
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("stitchfleet-cuda-cpu-races")) if cache is not None else tmp_path
    return CudaCpuBackend(where, debug=True, race=True)


@pytest.mark.slow  # 30 s cold (an instrumented build), a few seconds warm; `make test` runs it
@pytest.mark.skipif(not any(WORKLOADS.glob("*/cluster_*.json")), reason="no workload clusters saved")
def test_the_race_build_of_bert_encoder_cluster_03_runs_to_its_verdict(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Regression (issue 33): this build killed the process with SIGSEGV. The check ran on the vector of static
    # shared ranges while SF_SHARED_FILL grew it (start new, end still null), walked heap garbage, took the
    # scheduler's own accesses for shared memory and yielded from the scheduler, saving its context as fiber
    # 0's. In a subprocess of its own, so that a crash fails this test instead of ending pytest.
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir("stitchfleet-cuda-cpu-races")) if cache is not None else tmp_path
    command = [sys.executable, "-m", "tests.compiler.targets.cuda_cpu.races", "--cache", str(where)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "bert_encoder/cluster_03"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    found = re.search(r"bert_encoder: 1 cluster\(s\), (\d+) shared accesses checked, 0 race\(s\), 0 off", done.stdout)
    assert found is not None, done.stdout
    assert int(found.group(1)) > 0  # its kernel reduces through static shared memory


@pytest.mark.slow  # 25 s cold (an instrumented build of six clusters); `make test` runs it
@pytest.mark.skipif(not any(WORKLOADS.glob("*/cluster_*.json")), reason="no workload clusters saved")
def test_the_race_slice_has_no_race(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    workloads = lowered_workloads()
    kinds = {case.label: shared_use(lowered) for case, lowered in workloads}
    covered = {kinds[label] for label in [*RACE_SLICE, OWN_TEST]}
    assert {label: kind for label, kind in kinds.items() if kind not in covered} == {}  # a new kind: slice it
    assert len(covered) == len(RACE_SLICE) + 1  # one cluster of each kind, none twice
    by_label = {case.label: case for case, _ in workloads}
    findings = check_races(_backend(request, tmp_path), [by_label[label] for label in RACE_SLICE])
    assert [f for f in findings if f.race or f.mismatches] == []
    # the check saw the shared-memory accesses of every cluster that has any
    assert [f.label for f in findings if (f.checked > 0) != any(kinds[f.label][:2])] == []


@pytest.mark.slow
@pytest.mark.sweep  # every workload cluster: long (instrumented builds and runs)
@pytest.mark.skipif(not any(WORKLOADS.glob("*/cluster_*.json")), reason="no workload clusters saved")
def test_every_workload_cluster_has_no_race(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    findings = check_races(_backend(request, tmp_path), workload_cases())
    assert len(findings) >= 145
    assert [f for f in findings if f.race or f.mismatches] == []
