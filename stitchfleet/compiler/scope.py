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
6. Held nodes (`held`: node id -> reason, from the caller: e.g. a matmul's epilogue that the
   target's TF library runs fused with it) are boundaries with the caller's reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    # why a later stage keeps the cluster's original ops (it keeps its id: ids are the plugin's indices)
    refused: str = ""

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


def _classify(graph: Graph, held: Mapping[int, str]) -> tuple[list[int], list[int], list[Exclusion]]:
    candidates, constants, excluded = [], [], []
    for node in graph.nodes:
        reason = boundary_reason(graph, node) or held.get(node.id)
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


class _Reach:
    """Descendants and ancestors of every node as bit masks over node ids, for the remote-stitch test.

    `_Regions.detour` walks the graph once per question; remote stitching asks it for every pair of
    (open cluster, region), which on DenseNet121's training graph (10k nodes, 249 regions) was 43k
    walks and 17 s of a job's setup. With masks the same question is a few big-integer ANDs: a path
    from A through an outside node to B exists iff some node outside A and B descends from A and is
    an ancestor of B (regions themselves have no such path out of and back into them).
    """

    def __init__(self, graph: Graph) -> None:
        count = len(graph.nodes)
        self.down, self.up = [0] * count, [0] * count
        for node in reversed(graph.nodes):
            mask = 0
            for user in graph.consumers[node.id]:
                mask |= self.down[user] | (1 << user)
            self.down[node.id] = mask
        for node in graph.nodes:
            mask = 0
            for source in dict.fromkeys(node.inputs):
                mask |= self.up[source] | (1 << source)
            self.up[node.id] = mask

    def of(self, ids: Iterable[int]) -> tuple[int, int, int]:
        """(members, descendants, ancestors) of a node set, as masks."""
        members = down = up = 0
        for i in ids:
            members, down, up = members | (1 << i), down | self.down[i], up | self.up[i]
        return members, down, up


def _detour_free(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """No path a -> outside -> b nor b -> outside -> a (masks from `_Reach.of`)."""
    outside = ~(a[0] | b[0])
    return not (a[1] & b[2] & outside) and not (b[1] & a[2] & outside)


def _remote_stitch(
    regions: _Regions, parts: list[set[int]], budget: int, decisions: list[Decision]
) -> list[list[set[int]]]:
    groups: list[list[set[int]]] = []
    reach = _Reach(regions.graph) if len(parts) > 1 and budget > 1 else None  # budget 1: no pairs to test
    masks: list[tuple[int, int, int]] = []  # per group, its members' masks (see `_Reach.of`)
    for part in sorted(parts, key=min):
        mine = reach.of(part) if reach is not None else (0, 0, 0)
        target = _independent_group(groups, masks, mine, budget)
        subject = f"region at node {min(part)} ({len(part)} ops)"
        if target is None:
            groups.append([part])
            masks.append(mine)
            if len(groups) > 1:
                decisions.append(Decision(STAGE, "new cluster", subject, "dependent on, or full: every open cluster"))
            continue
        groups[target].append(part)
        masks[target] = (masks[target][0] | mine[0], masks[target][1] | mine[1], masks[target][2] | mine[2])
        why = f"independent of the cluster starting at node {min(groups[target][0])}"
        decisions.append(Decision(STAGE, "remote stitch", subject, why))
    return groups


def _independent_group(
    groups: list[list[set[int]]], masks: list[tuple[int, int, int]], part: tuple[int, int, int], budget: int
) -> int | None:
    """The first open cluster that `part` can join without a path through an outside node, or None."""
    for index, group in enumerate(groups):
        if len(group) < budget and _detour_free(masks[index], part):
            return index
    return None


UNREAD_CONSTANT = "constant feeds no cluster"
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
            excluded.append(Exclusion.of(graph.node(const), UNREAD_CONSTANT))


def _cluster(graph: Graph, index: int, parts: list[set[int]], members: set[int]) -> Cluster:
    inputs, outputs = boundary(graph, members)
    ordered = tuple(tuple(sorted(p)) for p in parts)
    return Cluster(index, tuple(sorted(members)), ordered, tuple(inputs), tuple(outputs))


def find_clusters(graph: Graph, remote_budget: int = 8, held: Mapping[int, str] | None = None) -> Scope:
    """Clusters of `graph`; see the module docstring for the rules (`held`: rule 6)."""
    if remote_budget < 1:
        raise ValueError(f"remote stitch budget must be >= 1, got {remote_budget}")
    decisions: list[Decision] = []
    candidates, constants, excluded = _classify(graph, held or {})
    regions, refused = _connect(graph, candidates, decisions)
    parts = _drop_free_singletons(graph, regions.regions(), excluded)
    groups = _drop_single_ops(graph, _remote_stitch(regions, parts, remote_budget, decisions), refused, excluded)
    merged = [set().union(*group) for group in groups]
    _attach_constants(graph, constants, merged, excluded)
    clusters = tuple(_cluster(graph, i, groups[i], merged[i]) for i in range(len(groups)))
    return Scope(clusters, tuple(sorted(excluded, key=lambda e: e.node)), tuple(decisions))
