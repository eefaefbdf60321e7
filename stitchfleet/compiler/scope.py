"""Stitch scope: which nodes are compiled together (clusters), and why the others are not.

Input: a `Graph` and the remote stitching budget (most connected regions merged into
one stitch op; the caller reads it from settings). Output: a `Scope` of clusters,
exclusions with reasons and decisions.

Rules (AStitch §4, DESIGN.md §2):
1. Candidates are memory-intensive ops with static shapes. PARAMETER and OPAQUE
   (compute-intensive or unsupported) ops are boundaries; a dynamic shape excludes an op.
2. Connected candidates are merged edge by edge in topological order, unless a path
   leaves one region, runs through a node outside both and comes back: the merged
   region would then need the outside op in its middle (a cycle), so the merge is refused.
3. A lone reshape or broadcast is dropped ("single trivial op").
4. Remote stitching: independent regions (no path between them in either direction)
   are merged into one cluster, at most `budget` regions per cluster. A cluster that
   still holds a single op has nothing to fuse and is dropped.
5. CONSTANT nodes join every cluster that consumes them (a constant is rematerialised,
   never passed between kernels), so constants may belong to several clusters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from stitchfleet.compiler.decision import Decision, Exclusion
from stitchfleet.compiler.ir import Graph, Kind, Node, Op
from stitchfleet.compiler.subgraph import boundary

STAGE = "clusters"
_FREE_KINDS = frozenset({Kind.BROADCAST, Kind.RESHAPE})


@dataclass(frozen=True)
class Cluster:
    """A set of nodes compiled as one stitch op."""

    id: int
    nodes: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of ops, constants not counted."""
        return sum(len(p) for p in self.parts)


@dataclass(frozen=True)
class Scope:
    clusters: tuple[Cluster, ...]
    excluded: tuple[Exclusion, ...]
    decisions: tuple[Decision, ...] = field(default=())


def boundary_reason(graph: Graph, node: Node) -> str | None:
    """Why `node` can never be in a cluster, or None when it is a candidate."""
    if node.op is Op.PARAMETER:
        return "graph input"
    if node.op is Op.OPAQUE:
        kind = node.attrs.get_str("type", "?")
        reason = node.attrs.get_str("reason", "")
        if reason.startswith("unsupported"):
            return f"unsupported op {kind}"
        return f"opaque: {kind}" + (f" ({reason})" if reason else "")
    if not node.is_static or any(not graph.node(i).is_static for i in node.inputs):
        return "dynamic shape"
    return None


class _Regions:
    """Union-find over node ids, with member sets and the cycle test that guards every merge."""

    def __init__(self, graph: Graph, ids: Iterable[int]) -> None:
        self.graph = graph
        self.parent = list(range(len(graph.nodes)))
        self.sets: dict[int, set[int]] = {i: {i} for i in ids}

    def find(self, node_id: int) -> int:
        while self.parent[node_id] != node_id:
            self.parent[node_id] = self.parent[self.parent[node_id]]
            node_id = self.parent[node_id]
        return node_id

    def of(self, node_id: int) -> set[int]:
        return self.sets[self.find(node_id)]

    def union(self, a: int, b: int) -> None:
        keep, gone = sorted((self.find(a), self.find(b)))
        self.parent[gone] = keep
        self.sets[keep] |= self.sets.pop(gone)

    def detour(self, sources: set[int], targets: set[int]) -> int | None:
        """An outside node on a path sources -> outside -> ... -> targets, or None.

        Node ids are topological, so nothing after the last target can lead back to it.
        """
        inside = sources | targets
        limit = max(targets)
        stack = [(c, c) for s in sources for c in self.graph.consumers[s] if c not in inside and c < limit]
        seen = {node for node, _ in stack}
        while stack:
            node, origin = stack.pop()
            for user in self.graph.consumers[node]:
                if user in targets:
                    return origin
                if user < limit and user not in seen:
                    seen.add(user)
                    stack.append((user, origin))
        return None

    def regions(self) -> list[set[int]]:
        return [self.sets[root] for root in sorted(self.sets)]


def _classify(graph: Graph) -> tuple[list[int], list[int], list[Exclusion]]:
    candidates, constants, excluded = [], [], []
    for node in graph.nodes:
        reason = boundary_reason(graph, node)
        if reason is not None:
            excluded.append(Exclusion.of(node, reason))
        elif node.op is Op.CONSTANT:
            constants.append(node.id)
        else:
            candidates.append(node.id)
    return candidates, constants, excluded


def _connect(graph: Graph, candidates: list[int], decisions: list[Decision]) -> tuple[_Regions, dict[int, str]]:
    regions, refused = _Regions(graph, candidates), dict[int, str]()
    wanted = set(candidates)
    for node_id in candidates:
        for source in dict.fromkeys(graph.node(node_id).inputs):
            if source not in wanted or regions.find(source) == regions.find(node_id):
                continue
            a, b = regions.of(source), regions.of(node_id)
            via = regions.detour(a, b)
            via = regions.detour(b, a) if via is None else via
            if via is None:
                regions.union(source, node_id)
                continue
            why = f"would create cycle through {graph.node(via).label}"
            refused.setdefault(node_id, why)
            subject = f"{graph.node(source).label} -> {graph.node(node_id).label}"
            decisions.append(Decision(STAGE, "refuse merge", subject, why))
    return regions, refused


def _drop_free_singletons(graph: Graph, regions: list[set[int]], excluded: list[Exclusion]) -> list[set[int]]:
    """Lone reshapes and broadcasts compute nothing: not worth a place in a stitch op."""
    kept = []
    for region in regions:
        if len(region) == 1 and graph.node(min(region)).op.kind in _FREE_KINDS:
            excluded.append(Exclusion.of(graph.node(min(region)), "single trivial op"))
        else:
            kept.append(region)
    return kept


def _drop_single_ops(
    graph: Graph, groups: list[list[set[int]]], refused: dict[int, str], excluded: list[Exclusion]
) -> list[list[set[int]]]:
    """A cluster of one op (even after remote stitching) has nothing to fuse."""
    kept = []
    for group in groups:
        if len(group) > 1 or len(group[0]) > 1:
            kept.append(group)
            continue
        only = min(group[0])
        excluded.append(Exclusion.of(graph.node(only), refused.get(only, "single op: nothing to fuse")))
    return kept


def _remote_stitch(
    regions: _Regions, parts: list[set[int]], budget: int, decisions: list[Decision]
) -> list[list[set[int]]]:
    groups: list[list[set[int]]] = []
    for part in sorted(parts, key=min):
        target = _independent_group(regions, groups, part, budget)
        subject = f"region at node {min(part)} ({len(part)} ops)"
        if target is None:
            groups.append([part])
            if len(groups) > 1:
                decisions.append(Decision(STAGE, "new cluster", subject, "dependent on, or full: every open cluster"))
            continue
        target.append(part)
        decisions.append(
            Decision(STAGE, "remote stitch", subject, f"independent of the cluster starting at node {min(target[0])}")
        )
    return groups


def _independent_group(
    regions: _Regions, groups: list[list[set[int]]], part: set[int], budget: int
) -> list[set[int]] | None:
    for group in groups:
        if len(group) >= budget:
            continue
        members = set().union(*group)
        if regions.detour(members, part) is None and regions.detour(part, members) is None:
            return group
    return None


TENSOR_CONSTANT = "tensor constant: read as a cluster input (kernels embed scalars and splats only)"


def embedded_constant(node: Node) -> bool:
    """A constant a kernel holds in its code (a scalar or a splat); a tensor constant is an input."""
    return node.op is Op.CONSTANT and not isinstance(node.attrs.get("value"), tuple)


def _attach_constants(graph: Graph, constants: list[int], groups: list[set[int]], excluded: list[Exclusion]) -> None:
    for const in constants:
        if not embedded_constant(graph.node(const)):
            excluded.append(Exclusion.of(graph.node(const), TENSOR_CONSTANT))
            continue
        homes = [g for g in groups if any(user in g for user in graph.consumers[const])]
        for home in homes:
            home.add(const)
        if not homes:
            excluded.append(Exclusion.of(graph.node(const), "constant feeds no cluster"))


def _cluster(graph: Graph, index: int, parts: list[set[int]], members: set[int]) -> Cluster:
    inputs, outputs = boundary(graph, members)
    ordered = tuple(tuple(sorted(p)) for p in parts)
    return Cluster(index, tuple(sorted(members)), ordered, tuple(inputs), tuple(outputs))


def find_clusters(graph: Graph, remote_budget: int = 8) -> Scope:
    """Clusters of `graph`; see the module docstring for the rules."""
    if remote_budget < 1:
        raise ValueError(f"remote stitch budget must be >= 1, got {remote_budget}")
    decisions: list[Decision] = []
    candidates, constants, excluded = _classify(graph)
    regions, refused = _connect(graph, candidates, decisions)
    parts = _drop_free_singletons(graph, regions.regions(), excluded)
    groups = _drop_single_ops(graph, _remote_stitch(regions, parts, remote_budget, decisions), refused, excluded)
    merged = [set().union(*group) for group in groups]
    _attach_constants(graph, constants, merged, excluded)
    clusters = tuple(_cluster(graph, i, groups[i], merged[i]) for i in range(len(groups)))
    return Scope(clusters, tuple(sorted(excluded, key=lambda e: e.node)), tuple(decisions))
