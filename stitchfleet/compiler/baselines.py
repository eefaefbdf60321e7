"""Baseline kernel plans on the same clusters the stitch planner gets: `per_op` and `xla_style`.

Input: a `Graph` and a `Cluster`. Output: a `Plan`, the kernels (node groups) each
planner would launch for the cluster, each kernel with the reason it ends where it does.

per_op (plain TensorFlow): one kernel per op, except ops that launch nothing: CONSTANT
(embedded), RESHAPE (a metadata change) and BROADCAST (TensorFlow's element-wise
kernels broadcast their operands themselves; the frontend turns that implicit
broadcasting into BROADCAST nodes). Where TensorFlow has a fused primitive that the
frontend decomposed (Softmax, FusedBatchNorm...), this counts more kernels than TF runs.

xla_style (XLA GPU classic fusion: instruction fusion + sibling multi-output fusion):
- Fusion pulls producers into consumers: element-wise ops, broadcasts, reshapes,
  transposes, slices, concats and constants fuse into whatever consumes them; element-wise
  producers of a reduction fuse into it (input fusion).
- A reduction is never fused into its consumer: it ends a kernel, and its broadcast
  consumers start a new one.
- A cheap producer with several consumers is duplicated into each; an expensive one
  (transcendental, division, pow) with several consumers is not: it ends its own kernel.
- A value used outside the cluster (or a graph output) is materialised: it ends a kernel.
- Sibling reductions reading a common input with the same input shape and reduced dims
  share one multi-output kernel, unless one depends on the other.
Size limits on fusions (operand counts, code size) are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stitchfleet.compiler.ir import Graph, Kind, Node, Op
from stitchfleet.compiler.scope import Cluster

_FREE_IN_TF = frozenset({Op.CONSTANT, Op.RESHAPE, Op.BROADCAST})


@dataclass(frozen=True)
class Kernel:
    """One launch: the nodes it computes (constants included) and what ends it."""

    nodes: tuple[int, ...]
    roots: tuple[int, ...]
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"nodes": list(self.nodes), "roots": list(self.roots), "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    planner: str
    cluster: int
    kernels: tuple[Kernel, ...]

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)


def per_op(graph: Graph, cluster: Cluster) -> Plan:
    """One kernel per op that launches one in TensorFlow (see the module docstring)."""
    kernels = tuple(
        Kernel((n,), (n,), f"one kernel per op ({graph.node(n).op.value})")
        for n in cluster.nodes
        if graph.node(n).op not in _FREE_IN_TF
    )
    return Plan("per_op", cluster.id, kernels)


def _root_reason(graph: Graph, node: Node, members: frozenset[int]) -> str | None:
    """Why `node` ends an XLA kernel, or None when it fuses into all its consumers."""
    if node.op is Op.CONSTANT:
        return None
    if node.op.is_reduction:
        return "reduction ends a kernel"
    users = graph.consumers[node.id]
    if node.id in graph.output_ids or any(u not in members for u in users):
        return "value used outside the cluster is materialised"
    if node.op.kind is Kind.ELEMENTWISE_HEAVY and len(users) > 1:
        return f"expensive {node.op.value} with {len(users)} consumers is not duplicated"
    return None


def _fused_producers(graph: Graph, root: int, roots: dict[int, str], members: frozenset[int]) -> set[int]:
    body, stack = {root}, [root]
    while stack:
        for source in graph.node(stack.pop()).inputs:
            if source in members and source not in roots and source not in body:
                body.add(source)
                stack.append(source)
    return body


def _loop_and_input_fusion(graph: Graph, cluster: Cluster) -> list[Kernel]:
    members = frozenset(cluster.nodes)
    roots = {n: r for n in cluster.nodes if (r := _root_reason(graph, graph.node(n), members)) is not None}
    return [Kernel(tuple(sorted(_fused_producers(graph, r, roots, members))), (r,), roots[r]) for r in sorted(roots)]


def _kernel_inputs(graph: Graph, kernel: Kernel) -> set[int]:
    return {i for n in kernel.nodes for i in graph.node(n).inputs if i not in kernel.nodes}


def _depends(graph: Graph, later: Kernel, earlier: Kernel, kernels: list[Kernel]) -> bool:
    """Whether `later` needs a value `earlier` produces, directly or through other kernels."""
    producers = {root: k for k in kernels for root in k.roots}
    stack, seen = [later], {id(later)}
    while stack:
        for source in _kernel_inputs(graph, stack.pop()):
            if source in earlier.roots:
                return True
            kernel = producers.get(source)
            if kernel is not None and id(kernel) not in seen:
                seen.add(id(kernel))
                stack.append(kernel)
    return False


def _sibling_key(graph: Graph, kernel: Kernel) -> tuple[object, ...] | None:
    if len(kernel.roots) != 1 or not graph.node(kernel.roots[0]).op.is_reduction:
        return None
    reduce = graph.node(kernel.roots[0])
    return (graph.node(reduce.inputs[0]).shape, reduce.attrs.get_ints("axes"))


def _can_join(graph: Graph, a: Kernel, b: Kernel, kernels: list[Kernel]) -> bool:
    key = _sibling_key(graph, b)
    shares = bool(_kernel_inputs(graph, a) & _kernel_inputs(graph, b))
    independent = not _depends(graph, a, b, kernels) and not _depends(graph, b, a, kernels)
    return key is not None and key == _sibling_key(graph, a) and shares and independent


def _multi_output_fusion(graph: Graph, kernels: list[Kernel]) -> list[Kernel]:
    merged = list(kernels)
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(merged):
            partner = next((b for b in merged[i + 1 :] if _can_join(graph, a, b, merged)), None)
            if partner is None:
                continue
            nodes = tuple(sorted(set(a.nodes) | set(partner.nodes)))
            joined = Kernel(nodes, a.roots + partner.roots, "multi-output fusion of sibling reductions")
            merged = [joined if k is a else k for k in merged if k is not partner]
            changed = True
            break
    return merged


def xla_style(graph: Graph, cluster: Cluster) -> Plan:
    """XLA's classic fusion decisions on the cluster (see the module docstring)."""
    kernels = _multi_output_fusion(graph, _loop_and_input_fusion(graph, cluster))
    return Plan("xla_style", cluster.id, tuple(kernels))


PLANNERS: dict[str, Callable[[Graph, Cluster], Plan]] = {"per_op": per_op, "xla_style": xla_style}
