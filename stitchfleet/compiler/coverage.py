"""How much of a graph's memory-intensive work ends up inside stitched clusters.

Input: the compiled `Artifacts` (the IR graph, its clusters and each cluster's plan or
decision). Output: `Coverage`: the memory-intensive op instances of the graph, how many
of them lie in a cluster that got a stitch plan, and the most common reasons for the rest.
Counted on IR nodes: an element-wise, reduction or data-movement node is memory-intensive;
so is an OPAQUE node (a TF op the frontend kept as a boundary) unless its TF type is a
GEMM or convolution, graph I/O, a variable or optimizer update, a random draw, control flow,
shape metadata or an Identity (TF forwards the buffer: no data moves). Constants and
parameters are not ops. A TF op the frontend decomposed counts once per IR node it became.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stitchfleet.compiler import ir
from stitchfleet.compiler.ir import Kind, Op

# TF op types (prefixes) that are not memory-intensive work the stitcher could take
NOT_MEMORY_INTENSIVE = (
    "MatMul",
    "BatchMatMul",
    "Einsum",
    "Conv",
    "DepthwiseConv",
    "Placeholder",
    "Const",
    "VarHandleOp",
    "VariableV2",
    "ReadVariableOp",
    "Assign",
    "ResourceApply",
    "Apply",
    "Random",
    "StatelessRandom",
    "TruncatedNormal",
    "StatelessTruncatedNormal",
    "Multinomial",
    "If",
    "StatelessIf",
    "While",
    "StatelessWhile",
    "Case",
    "PartitionedCall",
    "StatefulPartitionedCall",
    "NoOp",
    "Identity",
    "IdentityN",
    "StopGradient",
    "PreventGradient",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
    "Save",
    "Restore",
)
TOP_REASONS = 5


@dataclass(frozen=True)
class Coverage:
    memory_intensive: int
    stitched: int
    left_out: tuple[tuple[str, int], ...]  # (reason, node count), most common first

    @property
    def share(self) -> float:
        return self.stitched / self.memory_intensive if self.memory_intensive else 1.0

    def to_json(self) -> dict[str, object]:
        return {
            "memory_intensive": self.memory_intensive,
            "stitched": self.stitched,
            "share": round(self.share, 4),
            "left_out": [{"reason": r, "nodes": n} for r, n in self.left_out],
        }

    def line(self) -> str:
        top = "; ".join(f"{r} ({n})" for r, n in self.left_out[:3])
        tail = f"; left out: {top}" if top else ""
        share = f"{self.stitched}/{self.memory_intensive} memory-intensive ops stitched ({self.share:.1%})"
        return f"coverage: {share}{tail}"


def is_memory_intensive(node: ir.Node) -> bool:
    """Whether one IR node is memory-intensive work (see the module docstring)."""
    if node.op is Op.OPAQUE:
        tf_type = node.attrs.get_str("type", "")
        return not tf_type.startswith(NOT_MEMORY_INTENSIVE)
    return node.op.kind not in (Kind.PARAMETER, Kind.CONSTANT)


def _reason(node: ir.Node, decided: Mapping[int, str], excluded: Mapping[int, str]) -> str:
    if node.op is Op.OPAQUE:
        return f"{node.attrs.get_str('type', '?')}: {node.attrs.get_str('reason', 'opaque')}"
    if node.id in decided:
        return f"cluster not stitched: {decided[node.id]}"
    return f"excluded: {excluded.get(node.id, 'in no cluster')}"


def measure(
    graph: ir.Graph, clusters: Sequence[tuple[Sequence[int], str | None]], excluded: Mapping[int, str]
) -> Coverage:
    """`clusters`: each cluster's node ids with None when it got a stitch plan, else the decision's reason;
    `excluded`: the clusterer's reason for each node it left out of every cluster."""
    stitched_ids = {n for nodes, why in clusters if why is None for n in nodes}
    decided = {n: why for nodes, why in clusters if why is not None for n in nodes}
    counted = [n for n in graph.nodes if is_memory_intensive(n)]
    reasons = Counter(_reason(n, decided, excluded) for n in counted if n.id not in stitched_ids)
    stitched = sum(1 for n in counted if n.id in stitched_ids)
    return Coverage(len(counted), stitched, tuple(reasons.most_common(TOP_REASONS)))
