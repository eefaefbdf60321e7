"""The cuda-cpu backend: the CUDA renderer's exact source, compiled by g++ and run on the CPU.

Input: a program (kernels in launch order) and host arrays by buffer name. Output: the
output buffers (flat), like the sim and the cuda backend. Each kernel's text from
`render_kernel` is compiled with a compatibility header (`csrc/cuda_cpu.h`: fibers per
CUDA thread, 32-lane warps, PTX shuffle rules, `__atomic` atomics) into a shared object,
several kernels to a unit (module.py), cached on disk by hash of (text, compiler, flags),
and launched through ctypes with the cuda backend's contract: parameters in
`CudaKernel.params` order, then a zeroed grid barrier counter when the kernel has one;
dynamic shared memory of the launch's size; scratch zeroed before each kernel
(backend.py). `debug=True` is the checked build: the header's checks, static shared
memory filled like dynamic, `-fsanitize=alignment`; `order` 1 or 2 runs each block's
fibers reversed or reshuffled every round (other legal orders: a missing barrier shows
up as a different result); `fill` picks the byte shared memory starts as.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import Profile

# a checking target: the CUDA text's semantics on any machine; jobs never choose it
PROFILE = Profile("cuda-cpu", runs_on="cpu", warp=WARP, summary="CUDA text run on this CPU", in_jobs=False)
