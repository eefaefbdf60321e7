"""The tests whose facts differ between TF's two CPU kernel libraries, run again under the one this process does
not use. TF reads TF_ENABLE_ONEDNN_OPTS once, at import (on by default only on CPUs with AVX-512 VNNI/BF16 or
AMX: CI's machine has oneDNN, many EPYC cluster nodes do not), so the other library needs its own process.
Input: `OTHER_LIBRARY`, a few test ids. Output: pass when they pass there. Why these: docs/testing.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from stitchfleet.plugin.frontend import kernel_library

pytestmark = [pytest.mark.tf, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# One of each fact that differs: wide_batchnorm's outputs (reserve spaces, placeholders, scratch), the declared
# rank of V3's reserve space 3 and a hook job whose layer-norm gradient cluster reads it (0 kernel calls on
# Eigen while the rank was oneDNN's), and the epilogues the cpu target holds for TF's fusions.
OTHER_LIBRARY = (
    "tests/plugin/guard/test_wide_batchnorm.py::test_the_forward_formulas_are_tfs",
    "tests/plugin/guard/test_wide_batchnorm.py::test_the_running_statistics_blend_as_tfs",
    "tests/plugin/guard/test_wide_batchnorm.py::test_the_gradient_formulas_are_tfs",
    "tests/plugin/graph/test_cluster_ops.py::test_the_shape_of_an_unread_input",
    "tests/plugin/graph/test_cluster_ops.py::test_keras_batch_norm_maps_with_its_variable_reads_and_reserve_spaces_as_unread_inputs",
    "tests/plugin/frontend/test_library_fusions.py::test_cpu_keeps_matmul_and_conv_epilogues_with_onednn",
    "tests/plugin/frontend/test_library_fusions.py::test_cpu_keeps_what_the_kernel_library_in_use_fuses",
    "tests/plugin/shapes/test_signature_kernels.py::test_a_compile_that_fails_leaves_that_signature_of_that_cluster_to_tf",
)


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_the_library_dependent_tests_pass_under_either_library(onednn: str) -> None:
    if (onednn == "1") == kernel_library.onednn():
        pytest.skip(f"TF_ENABLE_ONEDNN_OPTS={onednn} is this process's library: the tests ran here")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # the parent waits on the child, so under xdist the child may share its worker's kernel cache
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *OTHER_LIBRARY]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
