"""The stitch planner (AStitch §3-4): cluster graph -> `StitchPlan` (groups, mappings, schemes, launches).

Input: a cluster as a standalone IR `Graph` and `PlanOptions`. Output: a `StitchPlan`
(data, with the reason for every choice) that `compiler.lower` turns into kernel IR.
"""

from stitchfleet.compiler.plan.model import (
    Choice,
    Combine,
    Edge,
    Group,
    GroupKind,
    Launch,
    Layout,
    Loop,
    Mapping,
    MappingKind,
    Scheme,
    SharedBuffer,
    StitchPlan,
)
from stitchfleet.compiler.plan.planner import PlanOptions, plan_cluster

__all__ = [
    "Choice",
    "Combine",
    "Edge",
    "Group",
    "GroupKind",
    "Launch",
    "Layout",
    "Loop",
    "Mapping",
    "MappingKind",
    "PlanOptions",
    "Scheme",
    "SharedBuffer",
    "StitchPlan",
    "plan_cluster",
]
