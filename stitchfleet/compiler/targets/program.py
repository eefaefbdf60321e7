"""Targets that run kernel IR (sim, cuda, cuda-cpu): a program-level `Backend` seen as a `Target`.

Input: a cluster's graph and plan (`ProgramTarget.build`: lowered here, the kernels compiled by
the backend), or its `Lowered` kernels and an `Executable` over the program's buffers
(`cluster_run`). Output: a `ClusterRun` that flattens each graph input into its buffer, runs
the program and reshapes each output buffer to the graph output's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import Lowered, lower
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.base import Arrays, Backend, ClusterRun, Executable, Profile


def cluster_run(lowered: Lowered, graph: Graph, executable: Executable) -> ClusterRun:
    """The cluster's run by graph names over `executable`, which runs `lowered.kernels` by buffer names."""
    shapes = {name: graph.node(node_id).shape for name, node_id in graph.outputs}

    def run(inputs: Mapping[str, Any]) -> Arrays:
        raw = executable({buf: np.asarray(inputs[name]).reshape(-1) for name, buf in lowered.inputs})
        return {name: raw[buf].reshape(shapes[name]) for name, buf in lowered.outputs}

    return run


class ProgramTarget:
    """The `Target` of a backend that compiles kernel IR programs: lower the plan, compile, run by names."""

    def __init__(self, profile: Profile, backend: Backend) -> None:
        self.profile = profile
        self.backend = backend

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun:
        lowered = lower(graph, plan)
        return cluster_run(lowered, graph, self.backend.compile(lowered.kernels))
