"""Rebinding: a job's clusters compiled again for the shapes its first training step feeds, bound to their ops.

Input: the user's graph as `begin` saw it (a GraphDef, before the rewrite), the signature a training
step fed (`signatures.Signature`), the installed clusters (the controller's `Cluster`, the rewrite's
`Installed` in the twin, the `Site` in the user's graph), the native bridge op and the settings.
Output: `Rebound`, per cluster whether its dispatch op now runs a kernel built for those shapes
(`bridge_op.BridgeOp.bind`) or why it keeps the one built at `begin` (whose calls of other shapes
run TF's own ops), and the seconds it took.

Why: a TF1 graph is finalized after `begin`, before the first feed shows a `None` batch size, so
`begin` builds the clusters for a guessed or recorded signature; the ops, already in the graph, take
a kernel for the real shapes at run time. Each cluster is mapped again by its TF ops' names in a
copy of the graph whose placeholders have the fed shapes, planned, compiled, checked against its TF
ops (`translation`) and only then bound, so a cluster that cannot be rebuilt exactly as installed
keeps running TF's ops for those calls. The guard then judges the bound kernel (`Installed.site`
carries its graph). Only native CPU kernels rebind; the Python bridge and GPU kernels keep theirs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import CpuExecutable
from stitchfleet.plugin.bridge_op import BridgeOp
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.kernels import ClusterKernel
from stitchfleet.plugin.rewrite import Installed
from stitchfleet.plugin.signatures import Signature, Specialisation, shaped_copy
from stitchfleet.plugin.sites import Site, UnmappableError, site_of
from stitchfleet.plugin.translation import check_sites

log = logging.getLogger("stitchfleet.plugin")


@dataclass
class Rebound:
    bound: list[int] = field(default_factory=list)  # cluster indices now running kernels for the fed shapes
    left: dict[int, str] = field(default_factory=dict)  # cluster index -> why it keeps its kernel
    seconds: float = 0.0


def remap(tf_graph: Any, conversion: Conversion, site: Site) -> Site:
    """The same TF ops as `site` (by name) in another conversion of the same graph, e.g. under other shapes:
    their IR, inputs and outputs; UnmappableError when they do not make the same inputs and outputs."""
    names = site.internal_names
    # The conversion under other shapes numbers its IR nodes alike (same ops, same rules): the members are
    # the same nodes; the names checked below catch a conversion that differs.
    members = frozenset(site.graph.metadata.get_ints("source_nodes"))
    if not members or max(members) >= len(conversion.graph.nodes):
        raise UnmappableError("the graph converts to other IR under these shapes")
    found = site_of(tf_graph, conversion, site.index, site.graph, members, fresh=True)
    for role, mine, theirs in (("inputs", found.inputs, site.inputs), ("outputs", found.outputs, site.outputs)):
        if [t.name for t in mine] != [t.name for t in theirs]:
            raise UnmappableError(f"the cluster's {role} differ under these shapes ({len(mine)} for {len(theirs)})")
    if found.internal_names != names:
        raise UnmappableError("the cluster holds other TF ops under these shapes")
    return found


class _Ops:
    """The ops of `graph` named `names`, in that order: the frontend then numbers its IR as it did at `begin`."""

    def __init__(self, graph: Any, names: Sequence[str]) -> None:
        self.ops = [graph.get_operation_by_name(name) for name in names]

    def get_operations(self) -> list[Any]:
        return self.ops


def rebind(
    shapes: Specialisation,
    signature: Signature,
    installed: Sequence[tuple[Any, Installed]],
    originals: dict[int, Site],
    *,
    bridge: BridgeOp,
    current: settings_module.Settings,
) -> Rebound:
    """Builds and binds each installed cluster for `signature` (see the module docstring); never raises."""
    started, done = time.perf_counter(), Rebound()
    try:
        if shapes.graph_def is None:
            raise ValueError("the graph was not kept at begin")
        copy = shaped_copy(shapes.graph_def, signature)
        conversion = convert(_Ops(copy, shapes.op_names), name="rebind")
    except Exception as err:  # the job keeps its kernels; calls of these shapes run TF's ops
        done.left = {c.index: f"not rebuilt for {signature.key}: {type(err).__name__}: {err}" for c, _ in installed}
        done.seconds = time.perf_counter() - started
        return done
    for cluster, install in installed:
        why = _rebind_one(
            copy, conversion, cluster, install, site=originals[cluster.index], bridge=bridge, current=current
        )
        if why is None:
            done.bound.append(cluster.index)
        else:
            done.left[cluster.index] = f"not rebuilt for {signature.key}: {why}"
            log.info("stitchfleet: cluster %d keeps its kernel (its calls run TF's ops): %s", cluster.index, why)
    done.seconds = time.perf_counter() - started
    log.info(
        "stitchfleet: %d cluster(s) rebuilt for the fed shapes %s in %.1f s, %d kept as built",
        len(done.bound),
        signature.key,
        done.seconds,
        len(done.left),
    )
    return done


def _rebind_one(
    copy: Any,
    conversion: Conversion,
    cluster: Any,
    install: Installed,
    *,
    site: Site,
    bridge: BridgeOp,
    current: settings_module.Settings,
) -> str | None:
    """Why `cluster` could not be rebuilt and bound, None when it was."""
    old = getattr(cluster.kernel, "executable", None)
    if not isinstance(old, CpuExecutable) or site.plan is None:
        return "only native CPU kernels are rebuilt"
    try:
        new_site = remap(copy, conversion, site)
        plan = plan_cluster(new_site.graph, site.plan.cluster, PlanOptions(device=site.plan.device))
        kernel = ClusterKernel(new_site.graph, plan, "cpu", current.cache_dir)
        if current.translation_check:
            refused = check_sites(copy, [new_site], current.tolerance_factor, current.cache_dir)
            if refused:
                return f"translation check: {refused[new_site.index]}"
        if not isinstance(kernel.executable, CpuExecutable):
            return "no native kernel"
        bridge.bind(old.source.entry, kernel.executable, signature.key)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    install.site = replace(install.site, graph=new_site.graph)  # what the guard judges from now on
    return None
