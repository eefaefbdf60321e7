"""The native bridge: the `StitchfleetDispatch` TF op, its C++ and CUDA sources, and each cluster's kernel.

Input: the compiler's executables (through the targets registry) and the installed TensorFlow. Output:
a loaded op library and per cluster a callable kernel; the native sources are package data files.
"""
