"""Where a compiled cluster lives in the TF graph: its input and output tensors and its TF ops.

Input: the `tf.Graph`, the frontend's `Conversion`, one cluster graph from the compiler (its metadata names
the IR nodes its parameters and outputs stand for) and, from a caller that can compile a changed cluster, its
stitch plan. The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.granularity import RegroupError, cyclic, downstream, hull, regroup
from stitchfleet.compiler.ir import DType, Graph, IRError, Op
from stitchfleet.compiler.pipeline import compile_cluster
from stitchfleet.compiler.plan import PlanOptions, StitchPlan
from stitchfleet.compiler.scope import boundary_reason
from stitchfleet.compiler.subgraph import extract, without_outputs
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.graph import cluster_ops, control_edges
from stitchfleet.plugin.graph.cluster_ops import computed_by, walk, with_unread
from stitchfleet.plugin.graph.op_graph import ancestors
from stitchfleet.plugin.native import gpu_device

if TYPE_CHECKING:
    import tensorflow as tf

UnmappableError = cluster_ops.UnmappableError  # what `map_cluster` raises (defined beside the walk that raises it too)
MAX_ABSORPTIONS = 16  # rounds of inputs closing a cycle pulled into the cluster
FOLDS_SHAPES = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})
STAGE = "sites"  # the stage named in the decisions that say why a site's cluster differs from the compiler's


class SignatureShapes(Protocol):
    """Tensors' shapes under the job's shape signature and a second one (`shapes.signatures.ShapeOracle`)."""

    def shape(self, tensor: tf.Tensor) -> tuple[int, ...] | None: ...

    def same(self, a: tf.Tensor, b: tf.Tensor) -> bool: ...

    def pair(self, tensor: tf.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None: ...


@dataclass
class Site:
    index: int
    graph: Graph
    inputs: list[tf.Tensor]
    outputs: list[tf.Tensor]
    internal: list[tf.Operation]
    folded: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)
    shape_readers: list[tf.Operation] = field(default_factory=list)
    control_readers: list[tf.Operation] = field(default_factory=list)  # stateful: their edges move to the stitched op
    ordering_readers: list[tf.Operation] = field(default_factory=list)  # stateless: their edges to its ops are dropped
    plan: StitchPlan | None = None  # the plan of `graph`, when the caller passed one to map_cluster
    varying: frozenset[str] = frozenset()  # folded tensors whose values depend on the job's shape signature
    oracle: SignatureShapes | None = None  # signatures.ShapeOracle: which tensors share a shape whatever the signature
    changes: list[Decision] = field(default_factory=list)  # why `graph` differs from the compiler's, in order

    @property
    def internal_names(self) -> set[str]:
        return {op.name for op in self.internal}


def _tensor(tf_graph: Any, conversion: Conversion, node: int, role: str) -> Any:
    ref = conversion.origins.get(node)
    if ref is None:
        raise UnmappableError(f"{role} node {node} is part of a TF op split across the cluster boundary")
    return tf_graph.get_tensor_by_name(ref.name)


def _outside_reads(site: Site, folded: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(interior tensor, outside op reading it) for every data read of the cluster's ops from outside
    that is neither of a cluster output nor of shapes only (those readers become folded constants)."""
    names = site.internal_names
    out_names = {t.name for t in site.outputs}
    reads: list[tuple[Any, Any]] = []
    for op in site.internal:
        for t in op.outputs:
            if t.name in out_names:
                continue
            for reader in t.consumers():
                if reader.name in names or (reader.outputs and all(o.name in folded for o in reader.outputs)):
                    continue
                reads.append((t, reader))
    return reads


def _extra_outputs(site: Site, conversion: Conversion, members: frozenset[int], folded: dict[str, Any]) -> list[Any]:
    """Interior tensors the cluster computes and outside ops read: they become extra outputs.

    A tensor the cluster's IR does not compute (another output of a multi-output op it
    clones) is left to the original op, which keeps running for its readers.
    """
    extra: dict[str, Any] = {}
    for tensor, _ in _outside_reads(site, folded):
        if conversion.tensors.get(tensor.name) in members:
            extra.setdefault(tensor.name, tensor)
    return list(extra.values())


def _readers(site: Site, folded: dict[str, Any]) -> None:
    """Sorts the outside ops that read the cluster's tensors' shapes or wait for its ops."""
    names = site.internal_names
    shape_readers: dict[str, Any] = {}
    for op in site.internal:
        for t in op.outputs:
            for reader in t.consumers():
                if reader.name not in names and reader.outputs and all(o.name in folded for o in reader.outputs):
                    shape_readers[reader.name] = reader
    site.shape_readers = list(shape_readers.values())
    # the rewrite replaces their outputs by these constants (regression: a reader no interior op reads
    # back, a Shape of batch norm's output, got a scalar in place of its [4] and the rewrite failed)
    site.folded.update({t.name: folded[t.name] for op in site.shape_readers for t in op.outputs})
    # The ops waiting for the cluster's ops, from their control outputs (a scan of every op of the graph for
    # each cluster was 2-3 ms of the demo's setup per cluster), in the graph's order as a scan finds them.
    waiting_by_name = {w.name: w for op in site.internal for w in op._control_outputs if w.name not in names}
    waiting = sorted(waiting_by_name.values(), key=lambda op: op._id) if site.outputs else []
    after = control_edges.data_descendants(site.internal)
    only = [
        op for op in waiting if not control_edges.stateful(op) and control_edges.only_orders(op, after, site.inputs)
    ]
    site.ordering_readers = only
    site.control_readers = [op for op in waiting if op not in only]


@dataclass(frozen=True)
class Closure:
    """A path out of a cluster back into it: `start` (an outside op that reads the cluster's outputs
    or waits for its ops, as `how` says) leads to `tensor`, one of the cluster's inputs."""

    tensor: tf.Tensor
    start: str
    how: str

    @property
    def reason(self) -> str:
        return f"a cycle: outside TF op {self.start!r} {self.how} and leads to {self.tensor.op.name!r}, an input"


def closures(site: Site, inputs: list[tf.Tensor] | None = None) -> list[Closure]:
    """Every input (default: the site's own) that its outputs reach through outside TF ops.

    The IR cannot show every such path: control edges (moved onto the stitched op when
    rewired), and the readers of one cluster's outputs once another cluster feeds them.
    Shape readers do not count: their results become constants.
    """
    names = site.internal_names
    producers: dict[str, list[Any]] = {}
    for tensor in site.inputs if inputs is None else inputs:
        producers.setdefault(tensor.op.name, []).append(tensor)
    stack = [(r, r.name, "reads its outputs") for t in site.outputs for r in t.consumers() if r.name not in names]
    stack += [(r, r.name, "waits for its ops") for r in site.control_readers]
    seen = names | {op.name for op in site.shape_readers}  # an outside op feeds internal ops only via inputs
    found: list[Closure] = []
    while stack:
        op, start, how = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        found += [Closure(t, start, how) for t in producers.get(op.name, ())]
        stack += [(r, start, how) for t in op.outputs for r in t.consumers()]
        stack += [(c, start, how) for c in op._control_outputs]
    return found


def check_acyclic(site: Site, inputs: list[tf.Tensor] | None = None) -> None:
    """UnmappableError (a ValueError) naming the first path that closes a cycle, if any (see `closures`)."""
    found = closures(site, inputs)
    if found:
        raise UnmappableError(found[0].reason)


def topological(ops: dict[str, tf.Operation]) -> list[tf.Operation]:
    """The ops in an order where every op follows the ops of the set it reads (data edges)."""
    order: list[Any] = []
    state: dict[str, bool] = {}
    for root in ops.values():
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                state[op.name] = True
                order.append(op)
                continue
            if op.name in state:
                continue
            state[op.name] = False
            stack.append((op, True))
            stack += [(t.op, False) for t in op.inputs if t.op.name in ops and t.op.name not in state]
    return order


def _cluster_graph(conversion: Conversion, members: frozenset[int], like: Graph, extra: list[int]) -> Graph:
    """The cluster graph of `members` (plus `extra` outputs), keeping `like`'s cluster id, marked `regrouped`."""
    try:
        graph = extract(conversion.graph, members, extra)
    except IRError as err:
        raise UnmappableError(f"cluster graph at TF op granularity is malformed: {err}") from None
    return graph.with_metadata(cluster=like.metadata.get("cluster", 0), regrouped=True)


def _check_types(graph: Graph) -> None:
    if any(n.dtype is DType.BF16 for n in graph.nodes):
        raise UnmappableError("bf16 values cannot cross tf.numpy_function")


def _members(conversion: Conversion, graph: Graph, changes: list[Decision]) -> frozenset[int]:
    drawn = frozenset(graph.metadata.get_ints("source_nodes"))
    try:
        members = regroup(conversion.graph, conversion.origins.keys(), drawn)
    except RegroupError as err:
        raise UnmappableError(str(err)) from None
    if members != drawn:
        changed = len(members ^ drawn)
        changes.append(_change(graph, "redraw", f"drawn through a TF op: {changed} node(s) joined or left it"))
    return members


def _change(graph: Graph, action: str, reason: str) -> Decision:
    return Decision(STAGE, action, f"cluster {graph.metadata.get('cluster', 0)}", reason)


def _site(tf_graph: Any, conversion: Conversion, index: int, graph: Graph) -> tuple[Site, list[Any]]:
    """The site of cluster graph `graph` and its unread inputs (`interior`), not yet in the site."""
    sources = graph.metadata.get_ints("source_inputs")
    inputs = [_tensor(tf_graph, conversion, n, "input") for n in sources]
    outputs = [_tensor(tf_graph, conversion, n, "output") for n in graph.metadata.get_ints("source_outputs")]
    folded = dict(conversion.folded)
    members = frozenset(graph.metadata.get_ints("source_nodes"))
    found = walk(outputs, {t.name for t in inputs}, folded, computed_by(conversion, members, frozenset(sources)))
    site = Site(index, graph, inputs, outputs, topological(found.ops), {n: folded[n] for n in sorted(found.reads)})
    return site, [found.unread[name] for name in sorted(found.unread)]


def _plan(site: Site, original: Graph, plan: StitchPlan | None) -> StitchPlan | None:
    """The plan of the site's graph: the compiler's when the cluster is unchanged, else the compiler's
    re-entry's (`pipeline.compile_cluster`) for the changed graph (`site.changes` say why)."""
    if site.graph is original:
        return plan
    if plan is None:
        raise UnmappableError("the cluster must change at TF op granularity and the caller cannot re-plan it")
    try:
        return compile_cluster(site.graph, plan.cluster, PlanOptions(device=plan.device))
    except ValueError as err:
        raise UnmappableError(f"the cluster at TF op granularity cannot be planned: {err}") from None


def site_of(
    tf_graph: tf.Graph,
    conversion: Conversion,
    index: int,
    graph: Graph,
    members: frozenset[int],
    *,
    fresh: bool = False,
) -> Site:
    """The site of `members` (`graph` when they are its members, unless `fresh`: `graph` is of another
    conversion), interior tensors read outside added as outputs, outside tensors its TF ops read and its
    IR does not as inputs (`cluster_ops.with_unread`)."""
    same = not fresh and members == frozenset(graph.metadata.get_ints("source_nodes"))
    site, unread = _site(tf_graph, conversion, index, graph if same else _cluster_graph(conversion, members, graph, []))
    folded = dict(conversion.folded)
    extra = _extra_outputs(site, conversion, members, folded)
    if extra:
        site.graph = _cluster_graph(conversion, members, graph, [conversion.tensors[t.name] for t in extra])
        site.outputs += extra
        names = ", ".join(t.name for t in extra)
        site.changes.append(_change(graph, "extra outputs", f"interior tensors outside TF ops read: {names}"))
    site.graph = with_unread(site.graph, unread)
    site.inputs += unread
    if unread:
        why = f"outside tensors its TF ops read but its IR does not: {', '.join(t.name for t in unread)}"
        site.changes.append(_change(graph, "extra inputs", why))
    _check_types(site.graph)  # regrouping may have added nodes
    _readers(site, folded)
    return site


def _absorb(conversion: Conversion, members: frozenset[int], found: list[Closure]) -> frozenset[int]:
    """`members` with the IR nodes of the inputs that close a cycle (their TF ops move into the cluster).

    TF's gradient functions order their ops after the incoming gradient with control edges
    (Square_grad, Erf_grad): once those wait for the stitched op, an input computed by them
    closes a cycle. Inside the cluster they are ordered by data alone.
    """
    source = conversion.graph
    nodes = {conversion.tensors.get(c.tensor.name) for c in found}
    if None in nodes:
        raise UnmappableError(found[0].reason)
    grown = hull(source, members | {n for n in nodes if n is not None})
    if any(boundary_reason(source, source.node(n)) is not None for n in grown - members):
        raise UnmappableError(found[0].reason)
    try:
        return regroup(source, conversion.origins.keys(), grown)
    except RegroupError:
        raise UnmappableError(found[0].reason) from None


def _shed(conversion: Conversion, members: frozenset[int], found: list[Closure]) -> frozenset[int]:
    """`members` without the nodes that read the inputs closing a cycle, and those downstream of them.

    The scope pass stitches independent regions together (remote stitching) from data edges alone:
    Adam's beta-power update in TF waits (control edges) for every variable update, so once joined
    to a forward batch norm it reads an input computed after the cluster's own outputs are used.
    Dropping that region leaves the rest a cluster TF can run; when nothing of it reads such an
    input, or the rest would close a cycle itself, the first closure stays the reason.
    """
    source = conversion.graph
    nodes = {conversion.tensors.get(c.tensor.name) for c in found}
    dropped = downstream(source, {n for n in nodes if n is not None}, members)
    # constants are shared with outside ops (a 6.0 of two ReLU6s): paths through them are no cycles
    kept = frozenset(n for n in members - dropped if source.node(n).op is not Op.CONSTANT)
    if not dropped or cyclic(source, kept):
        raise UnmappableError(found[0].reason)
    try:
        return regroup(source, conversion.origins.keys(), kept)
    except RegroupError:
        raise UnmappableError(found[0].reason) from None


def read_outside(site: Site, read: Collection[str]) -> Callable[[tf.Tensor], bool]:
    """Whether an op named in `read` (the ops a training step runs) reads a tensor outside the site, its
    shape readers aside (their values become constants)."""
    names = site.internal_names | {op.name for op in site.shape_readers}
    return lambda t: any(r.name in read and r.name not in names for r in t.consumers())


def keep_outputs(site: Site, wanted: Callable[[tf.Tensor], bool], why: str) -> None:
    """The site without the outputs `wanted` refuses (unless it refuses all), one change saying `why`. A kernel
    stored each for nothing (the dead halves of tf.gradients, which grappler prunes, read them: a seventh of the
    Transformer's kernel time). Their readers keep reading the TF ops, which run only if something needs them."""
    dropped = [k for k, t in enumerate(site.outputs) if not wanted(t)]
    if dropped and len(dropped) < len(site.outputs):
        names = ", ".join(site.outputs[k].name for k in dropped)
        site.graph = without_outputs(site.graph, dropped)
        site.outputs = [t for k, t in enumerate(site.outputs) if k not in dropped]
        site.changes.append(_change(site.graph, "unread outputs", f"{why}: {names}"))


def map_cluster(
    tf_graph: tf.Graph,
    conversion: Conversion,
    index: int,
    graph: Graph,
    plan: StitchPlan | None = None,
    *,
    read: Collection[str] | None = None,
) -> Site:
    """The `Site` of cluster graph `graph`; `UnmappableError` with the reason when there is none.

    Without `plan`, only a cluster that needs no change is mapped (the caller compiles `graph`);
    with it, `site.graph` and `site.plan` are what to compile. An input closing a cycle joins the
    cluster when it can (`_absorb`), else what reads it leaves it (`_shed`). `site.changes` says why
    the cluster differs from the compiler's, one Decision per change. With `read` (the TF ops a training step
    runs), outputs none of them reads are dropped (`keep_outputs`).
    """
    _check_types(graph)
    changes: list[Decision] = []
    members = _members(conversion, graph, changes)
    site = site_of(tf_graph, conversion, index, graph, members)
    found = closures(site)
    for _ in range(MAX_ABSORPTIONS):
        if not found:
            break
        try:
            members = _absorb(conversion, members, found)
            changes.append(_change(graph, "absorb", f"its input closed {found[0].reason}"))
        except UnmappableError:
            members = _shed(conversion, members, found)
            changes.append(_change(graph, "shed", f"its members read an input closing {found[0].reason}"))
        site = site_of(tf_graph, conversion, index, graph, members)
        found = closures(site)
    if found:  # the closures of the site kept (walked once: each walk reaches what depends on the cluster)
        raise UnmappableError(found[0].reason)
    cluster_ops.check_device_specific(site.outputs, gpu_device.gpu_visible)
    site.changes[:0] = changes
    if read is not None:
        keep_outputs(site, read_outside(site, read), "no op of a training step reads them")
    site.plan = _plan(site, graph, plan)
    return site


class StepOps:
    """The ops a training step may run: all but those only variable initialisers need.

    Stitching initialisers would gain nothing and, rerouted, they would read variables
    before those exist. Quacks like a tf.Graph for the frontend (`get_operations`).
    """

    def __init__(self, graph: tf.Graph) -> None:
        import tensorflow as tf

        self.graph = graph
        with graph.as_default():
            variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        init = ancestors([v.initializer for v in variables])
        ops = graph.get_operations()
        needed = ancestors([op for op in ops if op.name not in init])
        self.ops = [op for op in ops if op.name not in init or op.name in needed]

    def get_operations(self) -> list[tf.Operation]:
        return self.ops
