"""The native op tests' shared shim: one `stitchfleet shim install DIR --with-op` per pytest process.

Input: this process's TF and C++ compiler. Output: `prebuilt_shim`, the installed shim folder whose ops/ holds both
prebuilt op variants (CPU and -DGOOGLE_CUDA=1) and the GPU launch library: test_prebuilt_op reads the shim,
test_dispatch_gpu_op the GPU variant (the same `build_prebuilt(gpu=True)` call, built once instead of twice).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prebuilt_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each op build is a C++ compile against TF's headers (~10 s on a 2-core machine): tests only read the folder."""
    from stitchfleet import cli  # here, not at import: `make test-unit` loads this conftest without TensorFlow

    target = tmp_path_factory.mktemp("opt") / "stitchfleet"
    assert cli.main(["shim", "install", str(target), "--with-op"]) == 0
    return target
