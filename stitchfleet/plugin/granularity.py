"""A compiled cluster redrawn at TF granularity: its boundary runs along TF tensors, never through a TF op.

Input: the frontend's IR graph, its `origins` (IR node -> the TF tensor it holds) and the
member node ids of one cluster the compiler's scope pass drew. Output: the member set of a
cluster whose every input and output holds a TF tensor (the same set when it already was
one), or `RegroupError` saying why none is left.

Why: the frontend lowers some TF ops into several IR nodes (Unpack and Split into a slice and
a reshape per output, SoftmaxCrossEntropyWithLogits into a max, a shift, an exp, a sum...).
Only the nodes that hold a whole TF tensor have an origin; an intermediate has none, and only
nodes of the same TF op read it. The scope pass draws clusters without knowing TF ops, so a
cluster may end or begin on an intermediate, which TF cannot feed or fetch.

Rule: nodes joined by edges out of an origin-less node form an *atom* (the piece of one TF op
that computes some of its outputs); a cluster TF can compute is a union of whole atoms plus
the constants its members read. A split atom is completed (its other nodes join the cluster)
when they are all cluster candidates and the cluster stays free of cycles (no path leaves it
and comes back, or the stitched op would need its own result); otherwise its nodes leave the
cluster, and when that alone opens a cycle, so do the members downstream of them. Each step
keeps the cluster acyclic; rounds repeat until no atom is split. Node semantics never change:
only membership does. `hull` gives the nodes a set must take in to stay acyclic when a node
joins it from outside (the plugin pulls in inputs whose TF ops wait for the cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.scope import boundary_reason, embedded_constant

MAX_ROUNDS = 64


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
