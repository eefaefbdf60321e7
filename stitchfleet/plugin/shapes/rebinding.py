"""Rebinding: a job's clusters compiled again for a shape signature it feeds, for its dispatch ops to bind.

The rules in full: docs/plugin/shapes.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.pipeline import compile_cluster
from stitchfleet.compiler.plan import PlanOptions
from stitchfleet.compiler.targets.base import NativeKernel
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.mapping import Site, UnmappableError, keep_outputs, site_of
from stitchfleet.plugin.guard.translation import check_sites
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.native.kernels import ClusterKernel
from stitchfleet.plugin.shapes.signatures import Signature, Specialisation, shaped_copy

if TYPE_CHECKING:
    import tensorflow as tf


@dataclass
class Built:
    kernels: dict[int, tuple[NativeKernel, Graph]] = field(default_factory=dict)  # cluster index -> kernel, IR
    left: dict[int, str] = field(default_factory=dict)  # cluster index -> why it has no kernel for the signature
    seconds: float = 0.0


def remap(tf_graph: tf.Graph, conversion: Conversion, site: Site) -> Site:
    """The same TF ops as `site` (by name) in another conversion of the same graph, e.g. under other shapes:
    their IR, inputs and outputs; UnmappableError when they do not make the same inputs and outputs."""
    names = site.internal_names
    # The conversion under other shapes numbers its IR nodes alike (same ops, same rules): the members are
    # the same nodes; the names checked below catch a conversion that differs.
    members = frozenset(site.graph.metadata.get_ints("source_nodes"))
    if not members or max(members) >= len(conversion.graph.nodes):
        raise UnmappableError("the graph converts to other IR under these shapes")
    found = site_of(tf_graph, conversion, site.index, site.graph, members, fresh=True)
    outputs = {t.name for t in site.outputs}
    keep_outputs(found, lambda t: t.name in outputs, "no op of a training step reads them")  # as `site` at begin
    for role, mine, theirs in (("inputs", found.inputs, site.inputs), ("outputs", found.outputs, site.outputs)):
        if [t.name for t in mine] != [t.name for t in theirs]:
            raise UnmappableError(f"the cluster's {role} differ under these shapes ({len(mine)} for {len(theirs)})")
    if found.internal_names != names:
        raise UnmappableError("the cluster holds other TF ops under these shapes")
    return found


class _Ops:
    """The ops of `graph` named `names`, in that order: the frontend then numbers its IR as it did at `begin`."""

    def __init__(self, graph: tf.Graph, names: Sequence[str]) -> None:
        self.ops = [graph.get_operation_by_name(name) for name in names]

    def get_operations(self) -> list[tf.Operation]:
        return self.ops


def build(
    shapes: Specialisation,
    signature: Signature,
    clusters: Sequence[tuple[Cluster, Site]],
    *,
    current: settings_module.Settings,
    fault: tuple[Fault, int] | None = None,
) -> Built:
    """Builds each cluster (with its site in the user's graph) for `signature` (see the module docstring).
    `fault`: the test-only fault and this rank (`Fault.signature` names the signature it corrupts)."""
    started, done = time.perf_counter(), Built()
    try:
        if shapes.graph_def is None:
            raise ValueError("the graph was not kept at begin")
        copy = shaped_copy(shapes.graph_def, signature)
        conversion = convert(_Ops(copy, shapes.op_names), name="rebind", marks=shapes.marks)
    except Exception as err:  # that signature's calls run TF's ops
        done.left = {c.index: f"not rebuilt for {signature.key}: {type(err).__name__}: {err}" for c, _ in clusters}
        done.seconds = time.perf_counter() - started
        return done
    for cluster, site in clusters:
        try:
            injected = fault[0] if fault and fault[0].applies(cluster.index, fault[1], signature.key) else None
            done.kernels[cluster.index] = _build_one(copy, conversion, cluster, site, current=current, fault=injected)
        except Exception as err:
            done.left[cluster.index] = f"not rebuilt for {signature.key}: {type(err).__name__}: {err}"
    done.seconds = time.perf_counter() - started
    return done


class NotRebuiltError(Exception):
    """A cluster that cannot get a native kernel for the signature; the message says why."""


def _build_one(
    copy: Any,
    conversion: Conversion,
    cluster: Any,
    site: Site,
    *,
    current: settings_module.Settings,
    fault: Fault | None,
) -> tuple[NativeKernel, Graph]:
    old: NativeKernel | None = getattr(cluster.kernel, "executable", None)
    if old is None or not old.binds or site.plan is None:
        raise NotRebuiltError("only native kernels the op binds beside its own (CPU entries) are rebuilt")
    new_site = remap(copy, conversion, site)
    # A new signature's cluster graph enters the compiler through its one re-entry, like any changed cluster.
    plan = compile_cluster(new_site.graph, site.plan.cluster, PlanOptions(device=site.plan.device))
    kernel = ClusterKernel(new_site.graph, plan, cluster.kernel.backend, current.cache_dir, fault)
    if current.translation_check:
        refused = check_sites(copy, [new_site], current.tolerance_factor, current.cache_dir)
        if refused:
            raise NotRebuiltError(f"translation check: {refused[new_site.index]}")
    if kernel.executable is None or not kernel.executable.binds:
        raise NotRebuiltError("no native kernel")
    return kernel.executable, new_site.graph


def symbol(cluster: Cluster) -> str:
    """The dispatch op's symbol of a cluster (its begin kernel's entry); "" when it has no native kernel."""
    executable: NativeKernel | None = getattr(cluster.kernel, "executable", None)
    return executable.symbol if executable is not None and executable.binds else ""


def inputs(executable: NativeKernel) -> tuple[tuple[int, ...], ...]:
    """The input shapes a native kernel reads (what the dispatch op matches a call's inputs against)."""
    return tuple(tuple(int(d) for d in shape) for shape in executable.input_shapes)
