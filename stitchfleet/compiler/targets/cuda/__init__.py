"""The cuda target: kernel IR rendered as CUDA C, compiled to cubins, launched on an NVIDIA GPU.

Input: a program (kernels in launch order) or a cluster and its plan. Output: CUDA source
(render.py with expr/scope/shared/vector/prelude: the renderer, also used by cuda-cpu), cubins
(nvrtc.py for jobs, nvcc.py for checks; cache.py's "cubin" artifacts), and two ways to run
them: driver.py (pycuda, the benchmark harness and tests) and the launch library
(launch_source/launch_program_source/launch_library/launch_plan: C that runs a whole cluster
program from the TF GPU op), with gpu_executable.py assembling a cluster for the bridge and
coresidency.py fitting grid-barrier grids to the device's real occupancy. device_arrays.py
converts host arrays to device layout. target.py puts the pycuda path behind the seam.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import Profile

PROFILE = Profile(
    "cuda",
    runs_on="gpu",
    warp=WARP,
    summary="CUDA kernels on this GPU",
    native_op=True,
    checks_here=False,
    source_from="kernels",
)
