"""The cpu target: C + OpenMP generated from the stitch plan, built by the system C compiler.

Input: a cluster graph and its `StitchPlan`. Output: C source (`source.cluster_source`) that
executable.py compiles (cached as a shared object, cache.py's "cpu" artifacts) and calls through
ctypes; target.py puts it behind the target seam. `cexpr` renders kernel IR expressions and
statements as C; `source` lays out the plan's stages, loops and groups as OpenMP loops;
fused/reduction/rowcache/invariant/pieces/indexmath shape the loops, vmath and finite the
vectorised float functions and the NaN/Inf flag. Unlike the SIMT targets it starts from the
plan, not the kernel IR's threads: a task stays in one CPU thread with reductions in registers.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import Profile

PROFILE = Profile(
    "cpu", runs_on="cpu", warp=WARP, summary="C + OpenMP code on this CPU", native_op=True, source_from="plan"
)
