"""A cluster as a standalone graph, so it can be saved, fingerprinted and benchmarked alone.

Input: a `Graph` and a set of its node ids. Output: a verified `Graph` whose
PARAMETERs are the cluster's external inputs (named after the producing nodes) and
whose outputs are every member value consumed outside the set or that is a graph
output, then any `extra_outputs` the caller asks for (members read by something the graph
does not show, such as a TF op that only needs a tensor's shape; a node may be listed twice).
Metadata records which source nodes each parameter and output stands for. `without_outputs`
drops outputs nobody will read (and the nodes only they needed), keeping every parameter.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from stitchfleet.compiler.ir import Attrs, Graph, IRError, Node, Op, fingerprint


def _unique(name: str, taken: set[str]) -> str:
    candidate, suffix = name or "value", 1
    while candidate in taken:
        suffix += 1
        candidate = f"{name}_{suffix}"
    taken.add(candidate)
    return candidate


def boundary(graph: Graph, members: Collection[int]) -> tuple[list[int], list[int]]:
    """(external inputs, outputs) of a node set, both in node order; constants are never outputs."""
    inputs = sorted({i for m in members for i in graph.node(m).inputs if i not in members})
    outputs = sorted(
        m
        for m in members
        if graph.node(m).op is not Op.CONSTANT
        and (m in graph.output_ids or any(u not in members for u in graph.consumers[m]))
    )
    return inputs, outputs


def extract(graph: Graph, members: Collection[int], extra_outputs: Sequence[int] = ()) -> Graph:
    """The standalone graph of `members` (see the module docstring)."""
    chosen = set(members)
    if not chosen or not chosen <= set(range(len(graph.nodes))):
        raise IRError(f"cannot extract nodes {sorted(chosen)}: not a non-empty set of this graph's node ids")
    if not set(extra_outputs) <= chosen:
        raise IRError(f"extra outputs {sorted(set(extra_outputs) - chosen)} are not members of the extracted set")
    inputs, outputs = boundary(graph, chosen)
    outputs += list(extra_outputs)
    names: set[str] = set()
    nodes: list[Node] = []
    new_id: dict[int, int] = {}
    for source in inputs:
        origin = graph.node(source)
        name = _unique(origin.name, names)
        new_id[source] = len(nodes)
        nodes.append(Node(len(nodes), Op.PARAMETER, (), origin.shape, origin.dtype, name, Attrs(name=name)))
    for member in sorted(chosen):
        node = graph.node(member)
        new_id[member] = len(nodes)
        operands = tuple(new_id[i] for i in node.inputs)
        nodes.append(Node(len(nodes), node.op, operands, node.shape, node.dtype, node.name, node.attrs))
    out_names: set[str] = set()
    named_outputs = {_unique(graph.node(o).name, out_names): new_id[o] for o in outputs}
    metadata = {
        "source_fingerprint": fingerprint(graph),
        "source_inputs": tuple(inputs),
        "source_outputs": tuple(outputs),
        "source_nodes": tuple(sorted(chosen)),
    }
    return Graph.create(nodes, named_outputs, metadata)


def without_outputs(graph: Graph, dropped: Collection[int]) -> Graph:
    """`graph` without the outputs at positions `dropped` and the non-parameter nodes only they needed.

    Every PARAMETER stays, in place (a caller's inputs are matched to them by position; one nothing reads
    any more is an input the kernel ignores), and a `source_outputs` metadata entry loses the same positions.
    Why: a host may know that some outputs are never read (TF prunes their readers from the step), and a
    kernel storing them pays their memory traffic for nothing.
    """
    drop = set(dropped)
    if not drop <= set(range(len(graph.outputs))) or len(drop) == len(graph.outputs):
        raise IRError(f"cannot drop outputs {sorted(drop)} of {len(graph.outputs)}: at least one must stay")
    outputs = [out for k, out in enumerate(graph.outputs) if k not in drop]
    live = {node_id for _, node_id in outputs} | {n.id for n in graph.nodes if n.op is Op.PARAMETER}
    for node in reversed(graph.nodes):  # nodes are topologically sorted: readers come after what they read
        if node.id in live:
            live.update(node.inputs)
    new_id = {old: new for new, old in enumerate(sorted(live))}
    nodes = [
        Node(new_id[n.id], n.op, tuple(new_id[i] for i in n.inputs), n.shape, n.dtype, n.name, n.attrs)
        for n in graph.nodes
        if n.id in live
    ]
    metadata = dict(graph.metadata)
    if "source_outputs" in metadata:
        sources = graph.metadata.get_ints("source_outputs")
        metadata["source_outputs"] = tuple(n for k, n in enumerate(sources) if k not in drop)
    return Graph.create(nodes, {name: new_id[i] for name, i in outputs}, metadata)
