"""Where a compiled cluster lives in the TF graph: its input and output tensors and its TF ops.

Input: the `tf.Graph`, the frontend's `Conversion` and one cluster graph from the compiler
(its metadata names the IR nodes its parameters and outputs stand for). Output: a `Site`
(input tensors, output tensors, the TF ops computing the outputs from the inputs in
topological order, the constant-folded tensors they read, and the outside ops whose data
or control edges must be rerouted), or the reason why the cluster cannot be mapped cleanly
onto TF tensors (it then stays off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from stitchfleet.compiler.ir import DType, Graph
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import CONTROL_FLOW, FEEDABLE

MAX_OPS = 5000
FOLDS_SHAPES = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})


class UnmappableError(ValueError):
    """The cluster cannot be rewired in TF; the message is the reason recorded for it."""


@dataclass
class Site:
    index: int
    graph: Graph
    inputs: list[Any]
    outputs: list[Any]
    internal: list[Any]
    folded: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    shape_readers: list[Any] = field(default_factory=list)
    control_readers: list[Any] = field(default_factory=list)

    @property
    def internal_names(self) -> set[str]:
        return {op.name for op in self.internal}


def _tensor(tf_graph: Any, conversion: Conversion, node: int, role: str) -> Any:
    ref = conversion.origins.get(node)
    if ref is None:
        raise UnmappableError(f"{role} node {node} is part of a TF op split across the cluster boundary")
    return tf_graph.get_tensor_by_name(ref.name)


def _check_op(op: Any) -> None:
    if op.op_def.is_stateful or op.type in FEEDABLE or op.type in CONTROL_FLOW:
        raise UnmappableError(f"reaches {op.type} op {op.name!r} outside its inputs")
    if getattr(op, "_control_flow_context", None) is not None:
        raise UnmappableError(f"op {op.name!r} is inside TF control flow")


def _walk(outputs: list[Any], inputs: set[str], folded: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The TF ops between the inputs and the outputs, and the folded tensors they read."""
    internal: dict[str, Any] = {}
    reads: set[str] = set()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.name in internal:
            continue
        _check_op(op)
        internal[op.name] = op
        if len(internal) > MAX_OPS:
            raise UnmappableError(f"more than {MAX_OPS} TF ops")
        for t in op.inputs:
            if t.name in inputs:
                continue
            if t.name in folded:
                reads.add(t.name)
                continue
            stack.append(t.op)
    return internal, reads


def _readers(site: Site, folded: dict[str, Any]) -> None:
    """Sorts the outside ops that read the cluster's tensors; refuses data reads of interior tensors."""
    names = site.internal_names
    out_names = {t.name for t in site.outputs}
    shape_readers: dict[str, Any] = {}
    for op in site.internal:
        for t in op.outputs:
            for reader in t.consumers():
                if reader.name in names or t.name in out_names:
                    continue
                if reader.outputs and all(o.name in folded for o in reader.outputs):
                    shape_readers[reader.name] = reader
                    continue
                raise UnmappableError(f"interior tensor {t.name} feeds outside op {reader.name!r}")
    site.shape_readers = list(shape_readers.values())
    graph_ops = site.outputs[0].graph.get_operations() if site.outputs else []
    site.control_readers = [
        op for op in graph_ops if op.name not in names and any(c.name in names for c in op.control_inputs)
    ]


def topological(ops: dict[str, Any]) -> list[Any]:
    """The ops in an order where every op follows the ops of the set it reads (data edges)."""
    order: list[Any] = []
    state: dict[str, bool] = {}
    for root in ops.values():
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                state[op.name] = True
                order.append(op)
                continue
            if op.name in state:
                continue
            state[op.name] = False
            stack.append((op, True))
            stack += [(t.op, False) for t in op.inputs if t.op.name in ops and t.op.name not in state]
    return order


def map_cluster(tf_graph: Any, conversion: Conversion, index: int, graph: Graph) -> Site:
    """The `Site` of cluster graph `graph`; `UnmappableError` with the reason when there is none."""
    if any(n.dtype is DType.BF16 for n in graph.nodes):
        raise UnmappableError("bf16 values cannot cross tf.numpy_function")
    inputs = [_tensor(tf_graph, conversion, n, "input") for n in graph.metadata.get_ints("source_inputs")]
    outputs = [_tensor(tf_graph, conversion, n, "output") for n in graph.metadata.get_ints("source_outputs")]
    folded = dict(conversion.folded)
    internal, reads = _walk(outputs, {t.name for t in inputs}, folded)
    site = Site(index, graph, inputs, outputs, topological(internal), {n: folded[n] for n in reads})
    _readers(site, folded)
    return site


def _ancestors(roots: list[Any]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack += [t.op for t in op.inputs] + list(op.control_inputs)
    return seen


class StepOps:
    """The ops a training step may run: all but those only variable initialisers need.

    Stitching initialisers would gain nothing and, rerouted, they would read variables
    before those exist. Quacks like a tf.Graph for the frontend (`get_operations`).
    """

    def __init__(self, graph: Any) -> None:
        import tensorflow as tf

        with graph.as_default():
            variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        init = _ancestors([v.initializer for v in variables])
        ops = graph.get_operations()
        needed = _ancestors([op for op in ops if op.name not in init])
        self.ops = [op for op in ops if op.name not in init or op.name in needed]

    def get_operations(self) -> list[Any]:
        return self.ops
