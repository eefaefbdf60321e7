"""16-bit float atomic sums are the hardware's own on sm_80+ (one atom.add per value, where older archs
run a compare-and-swap loop), read from nvcc's PTX of the building-block atomic kernels."""

from __future__ import annotations

import pytest

from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc
from stitchfleet.compiler.targets.cuda.render import render_kernel
from tests.compiler.targets.cuda.suite_kernels import block_kernels


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_sums_are_native_atomics_on_sm_90_and_cas_loops_before_sm_80(
    dtype: str, nvcc: Nvcc, nvcc_cache: ArtifactCache
) -> None:
    (kernel,) = [k for k in block_kernels() if k.name == f"block_atomic_add_{dtype}"]
    source = render_kernel(kernel).source
    hopper = nvcc.compile(source, "sm_90", nvcc_cache, "ptx").decode()
    assert f"atom.add.noftz.{dtype}" in hopper and "atom.global.cas" not in hopper and "atom.cas" not in hopper
    turing = nvcc.compile(source, nvcc.oldest_arch, nvcc_cache, "ptx").decode()
    assert "cas" in turing and f"atom.add.noftz.{dtype}" not in turing
