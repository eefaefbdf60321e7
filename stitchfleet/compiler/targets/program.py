"""A program-level executable seen as a cluster run: graph-shaped inputs and outputs by name.

Input: a cluster's `Lowered` kernels, its graph and an `Executable` over the program's
buffers (sim, cuda, cuda-cpu). Output: a `ClusterRun` that flattens each graph input into its
buffer, runs the program and reshapes each output buffer to the graph output's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.targets.base import Arrays, ClusterRun, Executable


def cluster_run(lowered: Lowered, graph: Graph, executable: Executable) -> ClusterRun:
    """The cluster's run by graph names over `executable`, which runs `lowered.kernels` by buffer names."""
    shapes = {name: graph.node(node_id).shape for name, node_id in graph.outputs}

    def run(inputs: Mapping[str, Any]) -> Arrays:
        raw = executable({buf: np.asarray(inputs[name]).reshape(-1) for name, buf in lowered.inputs})
        return {name: raw[buf].reshape(shapes[name]) for name, buf in lowered.outputs}

    return run
