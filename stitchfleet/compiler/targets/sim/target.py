"""The sim behind the target seam: a cluster and its plan -> lowered kernels run in numpy.

Input: a cluster graph, its `StitchPlan` and graph-shaped inputs by name. Output: the
cluster's outputs by name, graph-shaped (`run_lowered`, or `target(...).build`). Nothing is
built or cached: the sim interprets the kernel IR as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.targets.base import Arrays
from stitchfleet.compiler.targets.program import ProgramTarget, cluster_run
from stitchfleet.compiler.targets.sim import PROFILE
from stitchfleet.compiler.targets.sim.interpreter import SimBackend


def run_lowered(lowered: Lowered, graph: Graph, inputs: Mapping[str, Any]) -> Arrays:
    """Runs the kernels on the sim with graph-shaped inputs; returns graph-shaped outputs by name."""
    return cluster_run(lowered, graph, SimBackend().compile(lowered.kernels))(inputs)


def target(cache_dir: Path) -> ProgramTarget:
    """The sim target (`cache_dir` unused: nothing is built)."""
    del cache_dir
    return ProgramTarget(PROFILE, SimBackend())
