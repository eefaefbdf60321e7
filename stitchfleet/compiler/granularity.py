"""Clusters redrawn at the frontend's op granularity: a boundary runs along whole frontend ops, never through one.

Input: an IR graph, its `origins` (the ids of the IR nodes that hold a whole frontend op's output:
a TF tensor, as the TF frontend records them; the pipeline gets them as `Options.origins`) and a
`Scope` (or one cluster's member ids). Output: the `Scope` whose every cluster's inputs and outputs
are such nodes (`redraw`: the pipeline's `op_clusters` stage, with a decision per cluster it changed
or refused), or one member set (`regroup`), or `RegroupError` saying why none is left.

Why: the frontend lowers some TF ops into several IR nodes (Unpack and Split into a slice and
a reshape per output, SoftmaxCrossEntropyWithLogits into a max, a shift, an exp, a sum...).
Only the nodes that hold a whole TF tensor have an origin; an intermediate has none, and only
nodes of the same TF op read it. The scope pass draws clusters without knowing TF ops, so a
cluster may end or begin on an intermediate, which TF cannot feed or fetch. Redrawing here,
before the clusters are planned, plans each cluster once, as TF can compute it.

Rule: nodes joined by edges out of an origin-less node form an *atom* (the piece of one TF op
that computes some of its outputs); a cluster TF can compute is a union of whole atoms plus
the constants its members read. A split atom is completed (its other nodes join the cluster)
when they are all cluster candidates and the cluster stays free of cycles (no path leaves it
and comes back, or the stitched op would need its own result); otherwise its nodes leave the
cluster, and when that alone opens a cycle, so do the members downstream of them. Each step
keeps the cluster acyclic; rounds repeat until no atom is split. Node semantics never change:
only membership does. A cluster with no cluster of whole ops left keeps its slot and id (ids are
the plugin's cluster indices) with `Cluster.refused` saying why. `hull` gives the nodes a set must
take in to stay acyclic when a node joins it from outside (the plugin pulls in inputs whose TF
ops wait for the cluster).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping

from stitchfleet.compiler.decision import Decision, Exclusion
from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.scope import UNREAD_CONSTANT, Cluster, Scope, boundary_reason, embedded_constant
from stitchfleet.compiler.subgraph import boundary

MAX_ROUNDS = 64
STAGE = "op_clusters"
LEFT = "left its cluster at op granularity (its frontend op could not join whole, or it reads one that left)"


class RegroupError(ValueError):
    """No cluster of whole TF ops is left; the message says why."""


_LAST_ATOMS: list[tuple[Graph, frozenset[int], dict[int, frozenset[int]]]] = []


def atoms(graph: Graph, origins: Collection[int]) -> dict[int, frozenset[int]]:
    """Every non-constant node's atom (see the module docstring), keyed by node id. The last graph's
    atoms are kept: the plugin regroups each of a graph's clusters in turn (DenseNet121's 245 clusters
    spent 10 s recomputing them)."""
    given = frozenset(origins)
    for known, known_origins, found in _LAST_ATOMS:
        if known is graph and known_origins == given:
            return found
    found = _atoms(graph, given)
    _LAST_ATOMS[:] = [(graph, given, found)]
    return found


def _atoms(graph: Graph, origins: frozenset[int]) -> dict[int, frozenset[int]]:
    parent = list(range(len(graph.nodes)))

    def find(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node in graph.nodes:
        for source in node.inputs:
            if source not in origins and graph.node(source).op is not Op.CONSTANT:
                parent[find(source)] = find(node.id)
    groups: dict[int, set[int]] = {}
    for node in graph.nodes:
        if node.op is not Op.CONSTANT:
            groups.setdefault(find(node.id), set()).add(node.id)
    frozen = [frozenset(group) for group in groups.values()]
    return {n: atom for atom in frozen for n in atom}


def cyclic(graph: Graph, members: Collection[int]) -> bool:
    """Whether a path leaves `members` and comes back (node ids are topological, so it ends below the last)."""
    last = max(members, default=-1)
    stack = [u for m in members for u in graph.consumers[m] if u not in members and u < last]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for user in graph.consumers[node]:
            if user in members:
                return True
            if user < last:
                stack.append(user)
    return False


def hull(graph: Graph, members: Collection[int]) -> frozenset[int]:
    """`members` and every node on a path between two of them: the smallest cycle-free superset."""
    if not members:
        return frozenset()
    first, last = min(members), max(members)
    below = _reach(graph, members, lambda n: graph.consumers[n], lambda n: n < last)
    above = _reach(graph, members, lambda n: graph.node(n).inputs, lambda n: n > first)
    return frozenset(members) | (below & above)


def _reach(
    graph: Graph, roots: Iterable[int], step: Callable[[int], Iterable[int]], keep: Callable[[int], bool]
) -> set[int]:
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for nxt in step(stack.pop()):
            if keep(nxt) and nxt not in found:
                found.add(nxt)
                stack.append(nxt)
    return found


def downstream(graph: Graph, roots: Iterable[int], within: Collection[int]) -> set[int]:
    """The nodes of `within` reachable from `roots` along edges between nodes of `within` or `roots`."""
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for user in graph.consumers[stack.pop()]:
            if user in within and user not in found:
                found.add(user)
                stack.append(user)
    return found


def _settle(graph: Graph, chosen: set[int], atom: frozenset[int]) -> set[int]:
    """`chosen` with `atom` either wholly in or wholly out (see the module docstring)."""
    joining = atom - chosen
    grown = chosen | atom
    if all(boundary_reason(graph, graph.node(n)) is None for n in joining) and not cyclic(graph, grown):
        return grown
    shrunk = chosen - atom
    if not cyclic(graph, shrunk):
        return shrunk
    return shrunk - downstream(graph, atom & chosen, chosen)


def _split(chosen: set[int], atom_of: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    """The atoms that have some but not all of their nodes in `chosen`, in node order."""
    split: dict[frozenset[int], None] = {}
    for node in sorted(chosen):
        atom = atom_of[node]
        if not atom <= chosen:
            split.setdefault(atom)
    return list(split)


def _with_constants(graph: Graph, chosen: set[int]) -> frozenset[int]:
    constants = {i for m in chosen for i in graph.node(m).inputs if embedded_constant(graph.node(i))}
    return frozenset(chosen | constants)


def regroup(graph: Graph, origins: Collection[int], members: Collection[int]) -> frozenset[int]:
    """The members of the cluster at TF granularity (see the module docstring)."""
    atom_of = atoms(graph, origins)
    chosen = {m for m in members if graph.node(m).op is not Op.CONSTANT}
    for _ in range(MAX_ROUNDS):
        split = _split(chosen, atom_of)
        if not split:
            break
        for atom in split:
            if not atom <= chosen and atom & chosen:
                chosen = _settle(graph, chosen, atom)
    else:
        raise RegroupError(f"no stable cluster of whole TF ops after {MAX_ROUNDS} rounds")
    if len(chosen) < 2:
        raise RegroupError("at TF op granularity at most one op is left, nothing to stitch")
    return _with_constants(graph, chosen)


def _parts(graph: Graph, members: frozenset[int]) -> tuple[tuple[int, ...], ...]:
    """The connected pieces of a redrawn cluster's ops (constants not counted), by first node: its regions
    (remote-stitched regions share no edge; a region whose ops left may fall apart into several)."""
    ops = {m for m in members if graph.node(m).op is not Op.CONSTANT}
    parts: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for start in sorted(ops):
        if start in seen:
            continue
        piece, stack = {start}, [start]
        while stack:
            node = stack.pop()
            for near in (*graph.node(node).inputs, *graph.consumers[node]):
                if near in ops and near not in piece:
                    piece.add(near)
                    stack.append(near)
        seen |= piece
        parts.append(tuple(sorted(piece)))
    return tuple(parts)


def _redrawn(graph: Graph, cluster: Cluster, members: frozenset[int]) -> tuple[Cluster, Decision]:
    inputs, outputs = boundary(graph, members)
    joined, left = sorted(members - set(cluster.nodes)), sorted(set(cluster.nodes) - members)
    why = f"its boundary ran through a frontend op: {len(joined)} node(s) joined {joined}, {len(left)} left {left}"
    redrawn = Cluster(cluster.id, tuple(sorted(members)), _parts(graph, members), tuple(inputs), tuple(outputs))
    return redrawn, Decision(STAGE, "redraw", f"cluster {cluster.id}", why)


def _why_out(graph: Graph, node: int) -> str:
    # a constant belongs to the clusters of its readers (the scope pass's rule 5): its readers left
    return UNREAD_CONSTANT if graph.node(node).op is Op.CONSTANT else LEFT


def redraw(graph: Graph, origins: Collection[int], scope: Scope) -> Scope:
    """`scope` with every cluster at the frontend's op granularity (see the module docstring): same ids and
    order; the exclusions follow the nodes that left every cluster or joined one."""
    clusters: list[Cluster] = []
    decisions = list(scope.decisions)
    for cluster in scope.clusters:
        try:
            members = regroup(graph, origins, cluster.nodes)
        except RegroupError as err:
            why = f"not stitched, keeps its original ops: {err}"
            clusters.append(dataclasses.replace(cluster, refused=why))
            decisions.append(Decision(STAGE, "refuse", f"cluster {cluster.id}", why))
            continue
        if members == frozenset(cluster.nodes):
            clusters.append(cluster)
            continue
        redrawn, decision = _redrawn(graph, cluster, members)
        clusters.append(redrawn)
        decisions.append(decision)
    inside = {n for c in clusters for n in c.nodes}
    before = {n for c in scope.clusters for n in c.nodes}
    excluded = [e for e in scope.excluded if e.node not in inside]
    excluded += [Exclusion.of(graph.node(n), _why_out(graph, n)) for n in sorted(before - inside)]
    return Scope(tuple(clusters), tuple(sorted(excluded, key=lambda e: e.node)), tuple(decisions))
