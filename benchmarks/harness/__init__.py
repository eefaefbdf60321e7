"""The GPU benchmark harness: our stitched kernels against per_op, JAX jit, torch.compile and copy bandwidth.

Input/output: see the submodules (translators, programs, runners, timing, results,
bench). Importing this package is light: jax, torch and pycuda load only inside the
modules and functions that use them.
"""
