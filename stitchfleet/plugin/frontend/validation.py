"""Checks a conversion against TensorFlow itself: the frontend's acceptance test.

Input: a TF session on the converted graph (variables initialised), the `Conversion` and the feeds for its
placeholders. Output: a `Comparison`. The rules in full: docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchfleet.compiler.evaluate import Array, evaluate_nodes
from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.tolerance import check
from stitchfleet.plugin.frontend.result import Conversion

if TYPE_CHECKING:
    import tensorflow as tf

BOUNDARY_OPS = (Op.PARAMETER, Op.OPAQUE)
# Looser than the backends' 8: the IR is evaluated along whole chains from TF's boundary values, so
# reduction-order differences (numpy pairwise vs Eigen's blocked sums) compound along a chain while
# TF's own error, the yardstick, is measured at each node.
FACTOR = 32.0


@dataclass
class Comparison:
    """How many IR values matched TF's, and the ones that did not (tensor name, reason)."""

    checked: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.failures

    def merge(self, other: Comparison) -> None:
        self.checked += other.checked
        self.failures += other.failures


def _as_ir(value: Any) -> Array:
    """TF hands bf16 as a numpy extension type; the IR holds bf16 in float32."""
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _fetch(session: Any, conversion: Conversion, ids: Sequence[int], feeds: Mapping[str, Any]) -> dict[int, Array]:
    names = sorted({conversion.origins[i].name for i in ids})
    values = session.run(names, feed_dict=dict(feeds))
    by_name = dict(zip(names, values, strict=True))
    return {i: _as_ir(by_name[conversion.origins[i].name]) for i in ids}


def _interior(graph: Graph) -> list[int]:
    return [n.id for n in graph.nodes if n.op not in BOUNDARY_OPS]


def _cut(graph: Graph, members: Sequence[int]) -> tuple[Graph, dict[int, int]]:
    """`members` extracted alone, and where each original node id landed in it."""
    cut = extract(graph, members)
    placed = {old: new for new, old in enumerate((*cut.metadata.get_ints("source_inputs"), *sorted(members)))}
    return cut, placed


def _inputs(cut: Graph, placed: Mapping[int, int], values: Mapping[int, Array]) -> dict[str, Array]:
    inverse = {new: old for old, new in placed.items()}
    return {str(p.attrs["name"]): values[inverse[p.id]] for p in cut.parameters}


def _judge(
    conversion: Conversion,
    ir_values: Mapping[int, Array],
    reference: Mapping[int, Array],
    tf_values: Mapping[int, Array],
    factor: float,
) -> Comparison:
    result = Comparison()
    for node_id, got in ir_values.items():
        if node_id not in tf_values:
            continue
        want = tf_values[node_id]
        bf16 = conversion.graph.node(node_id).dtype.value == "bf16"
        verdict = check(got, want, reference[node_id], factor=factor, bf16=bf16)
        result.checked += 1
        if not verdict.ok:
            result.failures.append((conversion.origins[node_id].name, verdict.reason))
    return result


@dataclass(frozen=True)
class _Run:
    """TF's values of every mapped IR node, and the IR's native and fp64 values between boundaries."""

    tf: dict[int, Array]
    native: dict[int, Array]
    exact: dict[int, Array]


def _run(session: Any, conversion: Conversion, feeds: Mapping[str, Any]) -> _Run | None:
    graph = conversion.graph
    members = _interior(graph)
    if not members:
        return None
    cut, placed = _cut(graph, members)
    mapped = [i for i in (*cut.metadata.get_ints("source_inputs"), *members) if i in conversion.origins]
    tf_values = _fetch(session, conversion, mapped, feeds)
    inputs = _inputs(cut, placed, tf_values)
    native, exact = evaluate_nodes(cut, inputs), evaluate_nodes(cut, inputs, "float64")
    return _Run(
        tf_values,
        {old: native[new] for old, new in placed.items()},
        {old: exact[new] for old, new in placed.items()},
    )


def compare(
    session: tf.compat.v1.Session, conversion: Conversion, feeds: Mapping[str, Array], factor: float = FACTOR
) -> Comparison:
    """Every mapped IR value between boundaries against TF (see the module docstring)."""
    run = _run(session, conversion, feeds)
    if run is None:
        return Comparison()
    members = set(_interior(conversion.graph))
    ir_values = {i: v for i, v in run.native.items() if i in members}
    return _judge(conversion, ir_values, run.exact, run.tf, factor)


def compare_clusters(
    session: tf.compat.v1.Session, conversion: Conversion, feeds: Mapping[str, Array], factor: float = FACTOR
) -> tuple[int, Comparison]:
    """Each stitch cluster evaluated alone on its inputs' values, against TF; (cluster count, comparison).

    A cluster input that stands for a TF tensor takes TF's value; one that does not (an
    intermediate of a decomposed op computed in another cluster) takes the IR's value.
    """
    graph = conversion.graph
    clusters = find_clusters(graph).clusters
    run = _run(session, conversion, feeds)
    result = Comparison()
    if run is None:
        return len(clusters), result
    sources = {**run.native, **run.tf}
    for cluster in clusters:
        cut, placed = _cut(graph, cluster.nodes)
        inputs = _inputs(cut, placed, sources)
        native, exact = evaluate_nodes(cut, inputs), evaluate_nodes(cut, inputs, "float64")
        outs = {i: native[placed[i]] for i in cluster.outputs}
        reference = {i: exact[placed[i]] for i in cluster.outputs}
        result.merge(_judge(conversion, outs, reference, run.tf, factor))
    return len(clusters), result


def compare_folded(session: tf.compat.v1.Session, conversion: Conversion, feeds: Mapping[str, Array]) -> Comparison:
    """Every constant-folded tensor against TF's value: they must be equal (shape arithmetic is exact)."""
    names = sorted(conversion.folded)
    result = Comparison()
    for name, value in zip(names, session.run(names, feed_dict=dict(feeds)) if names else [], strict=True):
        result.checked += 1
        want = _as_ir(value)
        if want.shape != conversion.folded[name].shape or not np.allclose(
            want, conversion.folded[name], equal_nan=True
        ):
            result.failures.append((name, f"folded {conversion.folded[name]!r}, TF computes {want!r}"))
    return result


def random_feeds(graph: tf.Graph, seed: int = 0) -> dict[str, Array]:
    """Standard-normal values (small ints, fair bools) for every placeholder of a TF graph."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, Array] = {}
    for op in graph.get_operations():
        if op.type != "Placeholder":
            continue
        tensor = op.outputs[0]
        shape, dtype = tensor.shape.as_list(), tensor.dtype.as_numpy_dtype
        if dtype is np.bool_:
            feeds[tensor.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[tensor.name] = rng.integers(0, 8, shape).astype(dtype)
        else:
            feeds[tensor.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
