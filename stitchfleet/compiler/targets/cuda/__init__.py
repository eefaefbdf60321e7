"""The cuda target: kernel IR rendered as CUDA C, compiled to cubins, launched on an NVIDIA GPU.

Input: a program (kernels in launch order) or a cluster and its plan. Output: CUDA source
(render.py with expr/scope/shared/vector/prelude: the renderer, also used by cuda-cpu), cubins
(nvrtc.py for jobs, nvcc.py for checks; cache.py's "cubin" artifacts), and two ways to run
them: driver.py (pycuda, the benchmark harness and tests) and the launch library
(csrc/launch.c read by launch_source, launch_library, launch_plan: C that runs a whole cluster
program from the TF GPU op), with gpu_executable.py assembling a cluster for the bridge and
coresidency.py fitting grid-barrier grids to the device's real occupancy. device_arrays.py
converts host arrays to device layout. target.py puts the pycuda path behind the seam.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import LibraryFusion, Profile

# TF's GPU remapper fuses Conv2D+BiasAdd(+activation) into cuDNN's fused convolution and MatMul+BiasAdd
# (+activation) into a cuBLASLt epilogue (`_FusedConv2D`, `_FusedMatMul`): the epilogue is applied in the
# GEMM's registers, where a stitched kernel would reread the product from global memory, so the same rule
# as the CPU's holds (from the remapper's rules, not measured: no GPU TF runs here). Tanh/Sigmoid are not
# in TF's GPU fused kernels, and BatchMatMul+Mul+Add is a oneDNN-only fusion: those stay stitchable here.
_GPU = "kept with {compute} for TF's GPU fused epilogue (grappler remapper: cuDNN / cuBLASLt)"
LIBRARY_FUSIONS = (
    LibraryFusion(
        ("MatMul", "Conv2D"),
        (("BiasAdd",), ("Relu", "Relu6", "Elu", "LeakyRelu")),
        _GPU,
    ),
)

PROFILE = Profile(
    "cuda",
    runs_on="gpu",
    warp=WARP,
    summary="CUDA kernels on this GPU",
    native_op=True,
    checks_here=False,
    source_from="kernels",
    library_fusions=LIBRARY_FUSIONS,
    automatic=True,
)
