"""The epilogues a target's TF library fuses with their compute op, found in a conversion: kept out of clusters.

Input: a `Conversion` and the target profile's `LibraryFusion`s. Output: `held`, IR node id -> reason, for the
scope pass (`Options.held`): what grappler's remapper fuses into the op before it with the kernel library TF
runs here (`kernel_library`), and dead readers that would stop the fusion once stitched. Rules: docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.targets.base import LibraryFusion
from stitchfleet.plugin.frontend import kernel_library
from stitchfleet.plugin.frontend.result import Conversion

_NOT_OWNED = (Op.CONSTANT, Op.PARAMETER)  # shared or another op's: never part of the TF op that reads them


def op_nodes(conversion: Conversion) -> dict[str, set[int]]:
    """Per TF op name, the IR nodes that compute it: its output nodes (origins) and the intermediates only
    it reads (nodes without an origin, found walking up from its outputs)."""
    graph, origins = conversion.graph, conversion.origins
    found: dict[str, set[int]] = {}
    for node, ref in origins.items():
        mine = found.setdefault(ref.op, set())
        stack = [node]
        while stack:
            current = stack.pop()
            if current in mine:
                continue
            mine.add(current)
            for source in graph.node(current).inputs:
                if source not in origins and graph.node(source).op not in _NOT_OWNED:
                    stack.append(source)
    return found


def _readers(
    graph: Graph, outputs: Iterable[int], op_of: Mapping[int, str], live: Collection[str] | None
) -> tuple[str | None, set[str]]:
    """The one live TF op that reads `outputs` (None when none or several do: the library fuses only a sole
    reader) and the dead readers, which grappler prunes first (the gradient of a product by a constant,
    tied to the step by a control edge only): stitched, they would be live readers and cut the fusion."""
    readers = {op_of.get(user, "") for out in outputs for user in graph.consumers[out]}
    dead = {r for r in readers if live is not None and r not in live and r}
    alive = readers - dead
    return (next(iter(alive)) if len(alive) == 1 and "" not in alive else None), dead


def _dead_below(
    graph: Graph,
    dead: Iterable[str],
    op_of: Mapping[int, str],
    nodes_of: Mapping[str, set[int]],
    live: Collection[str] | None,
) -> set[str]:
    """The dead readers and every dead TF op reading them, transitively (a dead reader's Sum and Reshape):
    a cluster holding any of them would read, and so run, the dead reader."""
    found: set[str] = set()
    stack = list(dead)
    while stack:
        name = stack.pop()
        if name in found:
            continue
        found.add(name)
        users = {op_of.get(user, "") for n in nodes_of.get(name, ()) for user in graph.consumers[n]}
        stack += [u for u in users if u and u != name and live is not None and u not in live]
    return found


def _constant_operands(graph: Graph, nodes: set[int], outputs: set[int]) -> bool:
    """Whether every operand of the op besides `outputs` (the stage before) is a constant."""
    outside = {s for n in nodes for s in graph.node(n).inputs if s not in nodes and s not in outputs}
    return all(graph.node(s).op is Op.CONSTANT for s in outside)


def held(
    conversion: Conversion, fusions: Iterable[LibraryFusion], live: Collection[str] | None = None
) -> dict[int, str]:
    """IR node id -> why it stays with TF, for every epilogue op of `fusions` (see the module docstring);
    `live`: the TF ops a training step runs (`training_path`; None: every op counts as a reader)."""
    graph, ops = conversion.graph, conversion.ops
    nodes_of = op_nodes(conversion)
    op_of = {n: name for name, nodes in nodes_of.items() for n in nodes}
    found: dict[int, str] = {}
    onednn = kernel_library.onednn()
    for fusion in fusions:
        # TF's Eigen CPU kernels (oneDNN off) fuse fewer epilogues: held, the others would only lose stitching
        stages = fusion.stages if onednn or fusion.without_onednn is None else fusion.without_onednn
        for node in graph.nodes:
            kind = node.attrs.get_str("type", "") if node.op is Op.OPAQUE else ""
            if not stages or kind not in fusion.compute or node.id not in op_of:
                continue
            why = fusion.reason.format(compute=kind, library="oneDNN" if onednn else "Eigen")
            outputs = {n for n in nodes_of[op_of[node.id]] if n in conversion.origins}
            for index, types in enumerate(stages):
                reader, dead = _readers(graph, outputs, op_of, live)
                if reader is None or reader not in ops or ops[reader].op_type not in types:
                    break
                if index in fusion.constant_operand and not _constant_operands(graph, nodes_of[reader], outputs):
                    break
                found.update(dict.fromkeys(nodes_of[reader], why))
                for name in _dead_below(graph, dead, op_of, nodes_of, live):
                    # not stitched: a dead reader a cluster made live would cut the fusion, and so would a cluster
                    # holding an op of what only the dead reader feeds (its Sum, remote-stitched, read it)
                    found.update(dict.fromkeys(nodes_of[name], f"{why}: a dead reader grappler prunes"))
                outputs = {n for n in nodes_of[reader] if n in conversion.origins}
    return found
