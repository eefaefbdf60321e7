"""The cuda-cpu backend: the CUDA renderer's exact source, compiled by g++ and run on the CPU.

Input: a program (kernels in launch order) and host arrays by buffer name. Output: the
output buffers (flat), like the sim and the cuda backend. Each kernel's text from
`render_kernel` is compiled with a compatibility header (`header.HEADER`: fibers per
CUDA thread, 32-lane warps, PTX shuffle rules, `__atomic` atomics) into a shared object,
cached on disk by hash of (source, header, flags), and launched through ctypes with the
cuda backend's contract: parameters in `CudaKernel.params` order, then a zeroed grid
barrier counter when the kernel has one; dynamic shared memory of the launch's size;
scratch zeroed before each kernel. `debug=True` builds with the header's checks and
`-fsanitize=alignment`; `reverse=True` runs each block's fibers in reverse order (a
second legal order: a missing barrier shows up as a different result).
"""
