"""The cpu target's source text for the pipeline's `sources` stage: a cluster's C, from its plan.

Input: the cluster's index, graph and `StitchPlan` (its kernel IR is not read: the C generator works from
the plan). Output: the C text the target compiles for it (`source.cluster_source`), entry `stitch_cluster<i>`.
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.cpu.source import cluster_source


def render(cluster: int, graph: Graph, plan: StitchPlan, lowered: Lowered | None) -> str:
    """The cluster's C source."""
    del lowered
    return cluster_source(graph, plan, f"stitch_cluster{cluster}").text
