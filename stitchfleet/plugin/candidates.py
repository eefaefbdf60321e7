"""Which of the compiler's clusters the hook installs: each mapped onto the TF graph and built, or left to TF.

Input: the TF graph, the frontend's `Conversion`, the compiler's artifacts, the backend, the
fleet's reverted fingerprints, the settings, an optional test `Fault`, the rank and whether
Horovod ranks must agree on the installed set. Output: `Candidates`: the sites and built
clusters to install, every mapped site (built or not: the twin copies what depends on them,
which must be the same on every rank whatever each compiled), and the clusters left to TF as
(index, fingerprint, reason): decisions as data, which the hook records.

A cluster is left to TF when the planner refused it, when Horovod ranks could not agree on it
(past the agreement vector's slots), when it cannot be mapped onto TF tensors, when an op of it
is placed where no backend can run it (a GPU while the GPU op cannot run here, or several devices:
`placement.route`), when no variable update depends on it (evals
and metrics run as written), when the compile budget is spent, or when its compile fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler import targets
from stitchfleet.compiler.decision import Decision
from stitchfleet.plugin import bridge_op, placement
from stitchfleet.plugin.agreement import SLOTS
from stitchfleet.plugin.controller import Cluster
from stitchfleet.plugin.faults import Fault
from stitchfleet.plugin.kernels import ClusterKernel, gpu_op_unavailable
from stitchfleet.plugin.sites import Site, UnmappableError, map_cluster
from stitchfleet.plugin.training_steps import training_path


@dataclass
class Candidates:
    sites: list[Site] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    mapped: list[Site] = field(default_factory=list)
    left: list[tuple[int, str, str]] = field(default_factory=list)  # (index, fingerprint, reason)


def _left_to_tf(site: Site, path: frozenset[str], where: placement.Route) -> str | None:
    """Why a mapped cluster stays with TF before any rewrite: its placement (no backend for its device,
    or it spans devices: `placement.route`), off the training path, or a TF fault in its fallback."""
    if where.backend is None:
        return where.reason
    if not any(op.name in path for op in site.internal):
        return "not on the training path (no variable update depends on it): evals and metrics run it as written"
    return fallback_hazard(site.internal, onednn=where.backend == "cpu" and _onednn())


# Activations grappler's remapper fuses into a FusedBatchNorm on oneDNN CPUs (Relu6 measured fine).
FUSED_ACTIVATIONS = frozenset({"Relu", "Elu", "LeakyRelu"})


def fallback_hazard(ops: Any, *, onednn: bool) -> str | None:
    """Why the cluster's TF ops cannot run as a graph function here, or None. On a oneDNN build (TF's
    default on x86 CPUs), grappler fuses a FusedBatchNorm whose output 0 feeds an activation (directly,
    or through an Add of a side input) inside a function into one op that then fails every call
    ("Missing 0-th output from FusedBatchNormV3"): every Keras CNN job (ResNet50, Xception,
    DenseNet121, NASNetMobile) failed its first twin step and reverted. The same ops in the user's
    graph run fine. Judged on the cluster's own ops, as the function holds them."""
    if not onednn:
        return None
    inside = {op.name for op in ops}
    for op in ops:
        if not op.type.startswith("FusedBatchNorm") or "Grad" in op.type:
            continue
        readers = [r for r in op.outputs[0].consumers() if r.name in inside]
        sums = [r for r in readers if r.type in ("Add", "AddV2")]
        readers += [after for r in sums for after in r.outputs[0].consumers() if after.name in inside]
        fused = next((r for r in readers if r.type in FUSED_ACTIVATIONS), None)
        if fused is not None:
            why = f"{op.type} {op.name!r} feeds a {fused.type}"
            return f"left to TF: {why}, which TF's oneDNN remapper breaks inside the fallback function"
    return None


def _onednn() -> bool:
    """Whether this TF runs with oneDNN's graph rewrites (TF_ENABLE_ONEDNN_OPTS, on by default on x86)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return False
    return bool(_pywrap_util_port.IsMklEnabled())


def _mapped(
    graph: Any, conversion: Any, index: int, compiled: tuple[Any, Any], path: frozenset[str], *, routes: Any
) -> tuple[Site, str] | str:
    """The cluster's site (from its compiled graph and plan) and its backend, or why it is left to TF."""
    try:
        site = map_cluster(graph, conversion, index, *compiled)  # may redraw it at TF op granularity
        where = routes(site.internal)
        left = _left_to_tf(site, path, where)
    except UnmappableError as err:
        return f"not mapped: {err}"
    except Exception as err:
        return f"not mapped: {type(err).__name__}: {err}"
    return (site, where.backend) if left is None else left


def _router(backend: str, current: settings_module.Settings) -> Any:
    """ops -> placement.Route for this job. `cpu` is also what `auto` resolves to: the setting tells them
    apart. Whether the GPU op can run is asked on the first GPU-placed cluster only."""
    setting = current.backend if backend == "cpu" and current.backend in ("auto", "cpu") else backend
    visible = placement.gpu_visible()
    gpu_op: list[str | None] = []

    def routes(ops: Any) -> placement.Route:
        ops = list(ops)
        where = placement.route(ops, setting, visible, None)  # as if the GPU op could run here
        if where.backend == "cuda":
            if not gpu_op:
                gpu_op.append(gpu_op_unavailable(current.cache_dir, current.bridge))
            where = placement.route(ops, setting, visible, gpu_op[0])
        return where

    return routes


def choose(
    graph: Any,
    conversion: Any,
    art: Any,
    *,
    backend: str,
    known_bad: set[str],
    current: settings_module.Settings,
    fault: Fault | None = None,
    rank: int = 0,
    agreeing: bool = False,
) -> Candidates:
    """Maps and builds every cluster of `art` (see the module docstring)."""
    if current.bridge != "python" and targets.profile(backend).native_op:
        bridge_op.warm(current.cache_dir)  # the op's build overlaps the cluster compiles below
    found = Candidates()
    path = training_path(graph)
    routes = _router(backend, current)
    deadline = time.perf_counter() + current.compile_budget
    for i, (cg, plan, summary) in enumerate(zip(art.cluster_graphs, art.stitch, art.report.clusters, strict=True)):
        fingerprint = summary.fingerprint
        if isinstance(plan, Decision):
            found.left.append((i, fingerprint, plan.reason))
            continue
        if agreeing and i >= SLOTS:
            found.left.append((i, fingerprint, f"cluster {i} is past the {SLOTS} clusters Horovod ranks can agree on"))
            continue
        mapped = _mapped(graph, conversion, i, (cg, plan), path, routes=routes)
        if isinstance(mapped, str):
            found.left.append((i, fingerprint, mapped))
            continue
        site, site_backend = mapped
        found.mapped.append(site)
        if time.perf_counter() > deadline:
            reason = f"compile budget spent: {current.compile_budget:g} s of compiles in begin"
            found.left.append((i, fingerprint, reason))
            continue
        try:
            injected = fault if fault is not None and fault.applies(i, rank) else None
            kernel = ClusterKernel(site.graph, site.plan or plan, site_backend, current.cache_dir, injected)
        except Exception as err:
            found.left.append((i, fingerprint, f"{site_backend} compile failed: {type(err).__name__}: {err}"))
            continue
        found.sites.append(site)
        found.clusters.append(Cluster(i, fingerprint, kernel, len(cg.nodes), fingerprint not in known_bad))
    return found
