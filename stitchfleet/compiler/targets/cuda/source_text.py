"""The cuda target's source text for the pipeline's `sources` stage: a cluster's CUDA module, from its kernel IR.

Input: the cluster's index, graph, plan and `Lowered` kernels (required: the renderer works from the kernel
IR). Output: the CUDA text of the module (`render.render_module`), as NVRTC or nvcc compiles it.
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.cuda.render import render_module


def render(cluster: int, graph: Graph, plan: StitchPlan, lowered: Lowered | None) -> str:
    """The cluster's CUDA module text; ValueError without its kernel IR."""
    del cluster, graph, plan
    if lowered is None:
        raise ValueError("cuda source is rendered from the kernel IR, and there is none")
    return render_module(lowered.kernels)
