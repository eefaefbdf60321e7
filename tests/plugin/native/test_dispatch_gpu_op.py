"""The GPU kernel of `StitchfleetDispatch`, without a GPU: it compiles with -DGOOGLE_CUDA=1 against this
TF's headers (tensorflow-cpu ships the stream-executor header it needs), links with every symbol resolved
against TF's framework library, and, loaded into TF, registers a GPU kernel (switches in host memory)
beside the CPU one. A cluster compiled for the GPU (NVRTC cubin, launch plan, launch library) becomes an
op node with the GPU attributes. Launching on TF's stream is not verified here: no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet import settings  # noqa: E402
from stitchfleet.compiler.ir import GraphBuilder  # noqa: E402
from stitchfleet.compiler.plan import PlanOptions, plan_cluster  # noqa: E402
from stitchfleet.compiler.targets.cuda.gpu_executable import compile_gpu  # noqa: E402
from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc  # noqa: E402
from stitchfleet.compiler.targets.cuda.target import CudaNativeKernel, launcher_name  # noqa: E402
from stitchfleet.plugin.native import dispatch_op  # noqa: E402

pytestmark = pytest.mark.tf
ROOT = Path(__file__).resolve().parents[3]

REGISTRY = """
import json, sys
import tensorflow as tf
from tensorflow.python.framework import kernels
tf.load_op_library(sys.argv[1])
found = kernels.get_registered_kernels_for_op("StitchfleetDispatch").kernel
print(json.dumps(sorted([k.device_type, list(k.host_memory_arg)] for k in found)))
"""


@pytest.fixture
def gpu_library(prebuilt_shim: Path) -> Path:
    """`build_prebuilt(gpu=True)`'s output as `shim install --with-op` makes it (conftest.py: built once for both
    modules; test_prebuilt_op builds the same shim)."""
    return prebuilt_shim / "ops" / dispatch_op.prebuilt_name(gpu=True)


def _registered(library: Path) -> list[list[object]]:
    """The op's kernels as a fresh TF process sees them after loading `library` (bounded in time)."""
    done = subprocess.run(
        [sys.executable, "-c", REGISTRY, str(library)], capture_output=True, text=True, timeout=300, check=True
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.xdist_group("prebuilt_shim")  # the worker that builds the shim for test_prebuilt_op: built once
def test_the_gpu_variant_builds_under_its_own_name_with_its_launch_library(gpu_library: Path) -> None:
    from stitchfleet.compiler.targets.cuda.launch_library import LaunchError, LaunchLibrary

    assert gpu_library.is_file() and gpu_library.name == dispatch_op.prebuilt_name(gpu=True)
    launcher = gpu_library.parent / launcher_name()
    with pytest.raises(LaunchError, match="not initialised"):  # it loads; no driver call before sf_init
        LaunchLibrary(launcher).device()
    assert dispatch_op.prebuilt_name(gpu=True) != dispatch_op.prebuilt_name(gpu=False)
    # A process loads the variant of its TF's build: CPU-only under tensorflow-cpu (CI), with the GPU kernel
    # under the CUDA build of tensorflow (checked by hand with the 2.15.1 GPU wheel: see the README).
    assert dispatch_op.prebuilt_name() == dispatch_op.prebuilt_name(gpu=dispatch_op.cuda_build())


@pytest.mark.xdist_group("prebuilt_shim")
def test_the_gpu_variant_registers_a_gpu_kernel_with_host_switches(gpu_library: Path) -> None:
    assert _registered(gpu_library) == [["CPU", []], ["GPU", ["switches"]]]


def test_the_library_of_this_tf_registers_the_kernels_of_its_build(tmp_path: Path) -> None:
    library = dispatch_op.library_path(settings.current().cache_dir)
    gpu = [["GPU", ["switches"]]] if dispatch_op.cuda_build() else []
    assert _registered(library) == [["CPU", []], *gpu]


def _executable(tmp_path: Path) -> CudaNativeKernel:
    if find_nvrtc() is None:
        pytest.skip("no libnvrtc: install the dev extra")
    b = GraphBuilder()
    x = b.parameter("x", (8, 1000))
    b.output("y", b.reduce_sum(b.exp(x), (1,)))
    graph = b.build()
    return CudaNativeKernel(compile_gpu(graph, plan_cluster(graph, 0, PlanOptions(device="h200")), "sm_90", tmp_path))


def test_a_cluster_compiled_for_the_gpu_becomes_an_op_node_with_its_attributes(tmp_path: Path) -> None:
    kernel = _executable(tmp_path)
    executable = kernel.executable
    assert executable.module_path.is_file() and executable.launcher_path.is_file()
    op = dispatch_op.load(settings.current().cache_dir)
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        x = tf.compat.v1.placeholder(tf.float32, (8, 1000))
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        fallback = tf.function(lambda v: tf.reduce_sum(tf.exp(v), 1), autograph=False)
        concrete = fallback.get_concrete_function(tf.TensorSpec((8, 1000), tf.float32))
        (y,) = op.dispatch(kernel, [x], [tf.float32], switch=(switches, 0), fallback=concrete)
    node = y.op.node_def
    assert y.shape.as_list() == [8] and node.device == "/device:GPU:0"
    assert node.attr["module"].s.decode() == str(executable.module_path)
    assert list(node.attr["layout"].list.i) == list(executable.plan.spec)
    assert [n.decode() for n in node.attr["kernels"].list.s] == list(executable.plan.names)
    assert node.attr["symbol"].s.decode() == executable.symbol and node.attr["library"].s == b""
    assert op.count(kernel, "calls") == 0 and op.count(kernel, "faulted") == 0  # never launched here
