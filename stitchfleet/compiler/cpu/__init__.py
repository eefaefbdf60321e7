"""The C + OpenMP code generator of the `cpu` backend (issue 9).

Input: a cluster graph and its `StitchPlan`. Output: C source (`source.cluster_source`)
that `compiler.runtime.cpu` compiles with the system C compiler and calls through ctypes.
`cexpr` renders kernel IR expressions and statements as C; `source` lays out the plan's
stages, loops and groups as OpenMP loops.
"""
