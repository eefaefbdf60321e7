"""Every rendered kernel compiles with nvcc (cubin) for sm_90 and for the oldest arch this nvcc accepts.

No GPU needed. Suite kernels (all 78 cases, planned for the H200) are compiled as one
translation unit per arch, the workload clusters (145, four TF training graphs) as one per
workload and arch; results are cached by source hash across runs. Each unit is built as
`nvcc -cubin -Xptxas -v` (`Nvcc.ptxas_report`) and every kernel must be an entry function ptxas
compiled: for sm_90 that is the very build test_kernel_resources' gate makes (same units, options and
cache key), so the two tests share one nvcc run per unit instead of making two.
"""

from __future__ import annotations

import re

import pytest

from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc, NvccError, parse_arch_list
from stitchfleet.compiler.targets.cuda.render import render_kernel, render_module
from stitchfleet.compiler.targets.cuda.resources import parse_ptxas
from tests.compiler.targets.cuda.suite_kernels import (
    MODELS,
    block_kernels,
    scale_kernel,
    unit,
)

ENTRY = re.compile(rb"stitch_c\d+_k\d+|block_\w+")


def _archs(nvcc: Nvcc) -> list[str]:
    return sorted({"sm_90", nvcc.oldest_arch})


def _not_compiled(nvcc: Nvcc, cache: ArtifactCache, which: str, arch: str) -> list[str]:
    """The kernels of `which`'s unit that ptxas compiled no entry function for when it is built for `arch` (a
    failed build raises NvccError). The entry names are exact, where a name found in the cubin's bytes could
    be a substring of a mangled or longer one."""
    kernels, source = unit(which)
    compiled = parse_ptxas(nvcc.ptxas_report(source, arch, cache))
    return [k.name for k in kernels if k.name not in compiled]


def test_oldest_arch_is_what_nvcc_lists(nvcc: Nvcc) -> None:
    # CUDA 13 dropped Volta (sm_70/72): the oldest is sm_75 there; older toolkits list sm_50+.
    assert nvcc.oldest_arch == nvcc.archs[0] and "sm_90" in nvcc.archs
    if nvcc.version.startswith("13."):
        assert nvcc.oldest_arch == "sm_75" and "sm_70" not in nvcc.archs


# On one xdist worker with test_kernel_resources' gate, which then reads these sm_90 units from nvcc_cache instead of
# running nvcc again (the cache is per worker under -p no:cacheprovider; in pytest's cache two workers building one
# unit at once would each run nvcc): after them the gate took 22 s in one process, their ~28 s of nvcc not run again.
NVCC_UNITS = pytest.mark.xdist_group("nvcc_units")


@pytest.mark.slow
@NVCC_UNITS
@pytest.mark.parametrize("which", ["sm_90", "oldest"])
def test_every_suite_kernel_compiles(nvcc: Nvcc, nvcc_cache: ArtifactCache, which: str) -> None:
    arch = "sm_90" if which == "sm_90" else nvcc.oldest_arch
    assert len(unit("suite")[0]) >= 78
    missing = _not_compiled(nvcc, nvcc_cache, "suite", arch)
    assert not missing, f"{len(missing)} kernel(s) missing from the {arch} cubin, e.g. {missing[:3]}"


# The two largest workloads (~60 s of the default tier's nvcc time) compile here once: dien_attention_gru for sm_90;
# crnn_head's sm_90 unit is built by test_kernel_resources' gate (the same nvcc build, default tier; NVRTC compiles it
# in the sweep, test_nvrtc_compile), and neither goes through the oldest arch, whose back end the
# suite (every dtype, atomics, grid barriers) and the other workloads exercise: their kernels are of no kind those
# lack. The sweep compiles the whole matrix.
BIG_SWEEP = {("sm_90", "crnn_head"), ("oldest", "crnn_head"), ("oldest", "dien_attention_gru")}
WORKLOAD_ARCHS = [
    pytest.param(which, model, marks=[pytest.mark.sweep] if (which, model) in BIG_SWEEP else [])
    for which in ("sm_90", "oldest")
    for model in MODELS
]


@pytest.mark.slow
@NVCC_UNITS
@pytest.mark.parametrize(("which", "model"), WORKLOAD_ARCHS)
def test_every_workload_cluster_compiles(nvcc: Nvcc, nvcc_cache: ArtifactCache, model: str, which: str) -> None:
    """The 145 clusters of the four TF training graphs, one translation unit per workload and arch."""
    arch = "sm_90" if which == "sm_90" else nvcc.oldest_arch
    assert unit(model)[0]
    missing = _not_compiled(nvcc, nvcc_cache, model, arch)
    assert not missing, f"{len(missing)} kernel(s) missing from the {arch} cubin, e.g. {missing[:3]}"


@pytest.mark.parametrize("which", ["sm_90", "oldest"])
def test_building_block_kernels_compile(nvcc: Nvcc, nvcc_cache: ArtifactCache, which: str) -> None:
    arch = "sm_90" if which == "sm_90" else nvcc.oldest_arch
    kernels = block_kernels()
    cubin = nvcc.compile(render_module(kernels), arch, nvcc_cache)
    assert all(k.name.encode() in cubin for k in kernels)


def test_vector_loop_becomes_16_byte_accesses(nvcc: Nvcc, nvcc_cache: ArtifactCache) -> None:
    rendered = render_kernel(scale_kernel())
    assert rendered.vector_loops == 1
    ptx = nvcc.compile(rendered.source, "sm_90", nvcc_cache, target="ptx").decode()
    assert re.search(r"ld\.global\.nc\.v4\.(f32|u32|b32)", ptx), "expected one 16-byte vector load"
    assert re.search(r"st\.global\.v4\.(f32|u32|b32)", ptx), "expected one 16-byte vector store"


def test_nvcc_error_names_the_line(nvcc: Nvcc) -> None:
    with pytest.raises(NvccError, match=r"kernel\.cu\(2\)") as err:
        nvcc.compile('extern "C" __global__ void k() {\n  undefined_thing();\n}\n', "sm_90")
    assert "undefined_thing();" in str(err.value)


def test_unknown_arch_is_refused(nvcc: Nvcc) -> None:
    with pytest.raises(NvccError, match="cannot compile for sm_1"):
        nvcc.compile("", "sm_1")


def test_arch_list_parsing() -> None:
    assert parse_arch_list("compute_90 compute_75 compute_100\ncompute_80") == ("sm_75", "sm_80", "sm_90", "sm_100")
    with pytest.raises(NvccError, match="no compute_XX"):
        parse_arch_list("garbage")
