"""Shared by the site tests: stitch a TF training graph the way the hook does, then train it both ways.

Input: a model name and size from stitchfleet.demo.models (or any graph with a `loss` and a
`train_op`). Output: `Stitched` (the conversion, the sites mapped, the refusals with their
reasons, the rewired graph and kernels) and the per-step losses of a training run with every
cluster switch off or on, from the same initial variables and feeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.pipeline import Options, compile_graph
from stitchfleet.demo import models
from stitchfleet.plugin.frontend import Conversion, pruned_ops
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.mapping import Site, StepOps, UnmappableError, map_cluster
from stitchfleet.plugin.graph.rewrite import Installed, Rewired, rewire
from stitchfleet.plugin.graph.training_steps import step_values, update_path
from stitchfleet.plugin.native.kernels import ClusterKernel

CACHE = Path(__file__).resolve().parents[2] / ".pytest_cache" / "stitchfleet-cpu"


@dataclass
class Stitched:
    graph: Any
    conversion: Conversion
    sites: list[Site] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    kernels: list[ClusterKernel] = field(default_factory=list)
    rewired: Rewired | None = None

    @property
    def installed(self) -> list[Installed]:
        assert self.rewired is not None
        return [c for c in self.rewired.clusters if isinstance(c, Installed)]


def map_all(graph: Any, *, job: bool = False) -> Stitched:
    """Converts and compiles `graph` and maps every planned cluster (what the hook's begin does). `job`: as the
    hook's setup does, what plain TF's step prunes is held out of clusters and outputs no step op reads dropped."""
    conversion = convert(StepOps(graph))
    held = pruned_ops.held(conversion, update_path(graph)) if job else {}
    read = step_values(graph) if job else None
    art = compile_graph(conversion.graph, Options(origins=frozenset(conversion.origins), held=held))
    stitched = Stitched(graph, conversion)
    for i, (cluster_graph, plan) in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)):
        if isinstance(plan, Decision):
            stitched.refused[i] = f"planner: {plan.reason}"
            continue
        try:
            stitched.sites.append(map_cluster(graph, conversion, i, cluster_graph, plan, read=read))
        except UnmappableError as err:
            stitched.refused[i] = f"not mapped: {err}"
    return stitched


def stitch(graph: Any, *, job: bool = False) -> Stitched:
    """`map_all`, then every site compiled for the cpu backend and rewired into `graph`."""
    stitched = map_all(graph, job=job)
    compiled = []
    for site in stitched.sites:
        assert site.plan is not None
        try:
            stitched.kernels.append(ClusterKernel(site.graph, site.plan, "cpu", CACHE))
        except NotImplementedError as err:  # a cpu backend limit: the hook leaves the cluster off too
            stitched.refused[site.index] = f"cpu compile failed: {err}"
            continue
        compiled.append(site)
    stitched.sites = compiled
    stitched.rewired = rewire(graph, stitched.sites, stitched.kernels)
    for site, done in zip(stitched.sites, stitched.rewired.clusters, strict=True):
        if isinstance(done, str):
            stitched.refused[site.index] = done
    return stitched


def feeds(graph: Any, seed: int = 0) -> dict[Any, Any]:
    """Random values in [0, 1) for every placeholder (labels and masks included)."""
    rng = np.random.default_rng(seed)
    return {
        op.outputs[0]: rng.random(op.outputs[0].shape.as_list()).astype(np.float32)
        for op in graph.get_operations()
        if op.type == "Placeholder"
    }


def train(stitched: Stitched, steps: int, on: bool) -> list[float]:
    """Losses of `steps` training steps from the seeded initial variables, every switch `on` or off."""
    graph, rewired = stitched.graph, stitched.rewired
    assert rewired is not None
    with graph.as_default():
        loss, train_op = rewired.current(graph.get_tensor_by_name("loss:0")), graph.get_operation_by_name("train_op")
        values = feeds(graph)
        values[rewired.switches] = np.full(len(stitched.installed), on)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        return [float(session.run([loss, train_op], values)[0]) for _ in range(steps)]


def model_graph(name: str, size: str) -> Any:
    return models.build(name, size, seed=1)
