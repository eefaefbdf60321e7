"""Dominant identification, merging and groups (AStitch §4.2 steps 2-3), before any mapping.

Input: a cluster as a standalone `Graph` (PARAMETERs are the cluster's inputs).
Output: `Grouping`: each group's dominant, tail (sub-dominants), inlined producers,
the values it exports to other groups, and the edges (producer group, consumer group,
value), with the reasons as `Choice` records.

Rules:
- Dominant candidates are reductions, and expensive element-wise ops whose result
  reaches a BROADCAST (one-to-many) through one-to-one ops only.
- A candidate reached from a dominant through one-to-one ops only joins that
  dominant's group as a sub-dominant ("a reduce wins"); so do the one-to-one ops on
  the way (the *tail*: computed once per result element, after the dominant).
- Every other op is inlined, recomputed by the threads of each group that needs it
  (local scheme); a cheap op duplicated costs nothing, an expensive one is recorded.
- A cluster output no group computes is the root of an OUTPUT group.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchfleet.compiler.ir import Graph, Kind, Node, Op
from stitchfleet.compiler.plan.model import Choice, GroupKind

_ONE_TO_ONE = frozenset({Kind.ELEMENTWISE_LIGHT, Kind.ELEMENTWISE_HEAVY, Kind.RESHAPE})


@dataclass(frozen=True)
class RawGroup:
    """A group before mapping: what it computes and what it reads from other groups."""

    id: int
    kind: GroupKind
    dominant: int
    tail: tuple[int, ...]
    inlined: tuple[int, ...]
    imports: tuple[tuple[int, int], ...]  # (producer group, value node)
    outputs: tuple[int, ...]
    reason: str

    @property
    def roots(self) -> tuple[int, ...]:
        return (self.dominant, *self.tail)


@dataclass(frozen=True)
class Grouping:
    groups: tuple[RawGroup, ...]
    owner: dict[int, int]  # node -> group for dominants and tails (not OUTPUT roots)
    exports: dict[int, tuple[int, ...]]  # group -> values other groups read
    choices: tuple[Choice, ...]


def _one_to_one(node: Node) -> bool:
    return node.op.kind in _ONE_TO_ONE


def _reaches_broadcast(graph: Graph, node_id: int) -> bool:
    stack, seen = [node_id], {node_id}
    while stack:
        for user in graph.consumers[stack.pop()]:
            op = graph.node(user).op
            if op is Op.BROADCAST:
                return True
            if _one_to_one(graph.node(user)) and user not in seen:
                seen.add(user)
                stack.append(user)
    return False


def _tail_owner(graph: Graph, node: Node, owner: dict[int, int], dependent: list[bool]) -> int | None:
    """The group whose tail `node` joins: all its dependent operands belong to that one group."""
    if not _one_to_one(node):
        return None
    groups = {owner.get(i) for i in node.inputs if dependent[i]}
    if len(groups) != 1 or None in groups:
        return None
    return groups.pop()


def _dominants(graph: Graph) -> tuple[dict[int, int], dict[int, list[int]], list[Choice]]:
    """owner (node -> dominant node id), tails per dominant, and the merge choices."""
    dependent: list[bool] = []  # whether a node is, or descends from, a dominant
    owner: dict[int, int] = {}
    tails: dict[int, list[int]] = {}
    choices: list[Choice] = []
    for node in graph.nodes:
        dependent.append(node.op.is_reduction or any(dependent[i] for i in node.inputs))
        if node.op.is_reduction:
            owner[node.id] = node.id
            tails[node.id] = []
            choices.append(Choice("dominant", node.label, "reduction"))
            continue
        group = _tail_owner(graph, node, owner, dependent)
        heavy = node.op.kind is Kind.ELEMENTWISE_HEAVY and _reaches_broadcast(graph, node.id)
        if group is not None:
            owner[node.id] = group
            tails[group].append(node.id)
            if heavy:
                what = f"joins the group of {graph.node(group).label} as a sub-dominant"
                choices.append(Choice("merge", node.label, f"{what}: linked to it only by one-to-one ops"))
        elif heavy:
            owner[node.id] = node.id
            tails[node.id] = []
            dependent[node.id] = True
            choices.append(Choice("dominant", node.label, "expensive op whose result is broadcast (one-to-many)"))
    return owner, tails, choices


def _prune_tails(graph: Graph, owner: dict[int, int], tails: dict[int, list[int]]) -> None:
    """Drops tail ops nothing needs per result element: a tail ends at its last op read elsewhere."""
    for dominant, tail in tails.items():
        kept = list(tail)
        for node_id in reversed(tail):
            users = graph.consumers[node_id]
            is_out = node_id in graph.output_ids
            if not is_out and all(owner.get(u) != dominant for u in users) and not _feeds_broadcast(graph, node_id):
                kept.remove(node_id)
                del owner[node_id]
        tails[dominant] = kept


def _feeds_broadcast(graph: Graph, node_id: int) -> bool:
    return any(graph.node(u).op is Op.BROADCAST for u in graph.consumers[node_id])


def _closure(graph: Graph, roots: tuple[int, ...], me: int, owner: dict[int, int]) -> tuple[list[int], list[int]]:
    """(inlined nodes, imported values) needed to compute `roots` in group `me`."""
    inlined: set[int] = set()
    imported: set[int] = set()
    stack = list(roots)
    seen = set(roots)
    while stack:
        for source in graph.node(stack.pop()).inputs:
            if source in seen:
                continue
            seen.add(source)
            if source in owner and owner[source] != me:
                imported.add(source)
            elif graph.node(source).op is not Op.PARAMETER:
                if source not in owner:
                    inlined.add(source)
                stack.append(source)
    return sorted(inlined), sorted(imported)


def group(graph: Graph) -> Grouping:
    """Groups of the cluster graph (see the module docstring)."""
    owner_node, tails, choices = _dominants(graph)
    _prune_tails(graph, owner_node, tails)
    sinks = [n for n in sorted(graph.output_ids) if n not in owner_node and graph.node(n).op is not Op.PARAMETER]
    dominants = sorted([*tails, *sinks])
    index = {d: i for i, d in enumerate(dominants)}
    # sinks are not stop points: a light output read by other groups is recomputed there, not waited for
    owner = {n: index[d] for n, d in owner_node.items()}
    raw: list[RawGroup] = []
    exports: dict[int, list[int]] = {i: [] for i in range(len(dominants))}
    for gid, dom in enumerate(dominants):
        tail = tuple(tails.get(dom, ()))
        inlined, imported = _closure(graph, (dom, *tail), gid, owner)
        imports = tuple((owner[v], v) for v in imported)
        for producer, value in imports:
            if value not in exports[producer]:
                exports[producer].append(value)
        outputs = tuple(n for n in (dom, *tail) if n in graph.output_ids)
        kind, reason = _kind(graph, dom, dom in tails)
        raw.append(RawGroup(gid, kind, dom, tail, tuple(inlined), imports, outputs, reason))
    choices += _duplicates(graph, raw)
    return Grouping(tuple(raw), owner, {k: tuple(sorted(v)) for k, v in exports.items()}, tuple(choices))


def _kind(graph: Graph, dominant: int, is_dominant: bool) -> tuple[GroupKind, str]:
    node = graph.node(dominant)
    if node.op.is_reduction:
        return GroupKind.REDUCE, f"dominated by the reduction {node.label}"
    if is_dominant:
        return GroupKind.ELEMENTWISE, f"dominated by the broadcast expensive op {node.label}"
    return GroupKind.OUTPUT, f"cluster output {node.label} computed by no dominant group"


def _duplicates(graph: Graph, groups: list[RawGroup]) -> list[Choice]:
    """Expensive ops recomputed by several groups: cheaper than a buffer when read one-to-one."""
    seen: dict[int, list[int]] = {}
    for g in groups:
        for n in g.inlined:
            if graph.node(n).op.kind is Kind.ELEMENTWISE_HEAVY:
                seen.setdefault(n, []).append(g.id)
    return [
        Choice("recompute", graph.node(n).label, f"read one-to-one by groups {ids}; recomputed in each, no buffer")
        for n, ids in seen.items()
        if len(ids) > 1
    ]
