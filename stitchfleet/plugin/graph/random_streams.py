"""Random ops the stitched twin shares with the user's graph, so each draws once per step on either path.

Input: the TF graph (not finalized) and the twin's members (the ops it copies). Output: The rules in full:
docs/plugin/graph.md.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import Any, Protocol

import tensorflow as tf

from stitchfleet.plugin.graph.op_graph import downstream, upstream

log = logging.getLogger("stitchfleet.plugin")
SEEDS = frozenset({"seed", "seed2"})
# Ops whose output shape is the value of their input 0 (a shape vector): that value can be rebuilt from
# the shapes of shared tensors, so the op need not read the twin's members at all.
SHAPED = frozenset({"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt"})
FEEDS = ("Placeholder", "PlaceholderWithDefault", "IteratorGetNext", "IteratorGetNextSync", "QueueDequeueV2")


class ShapePairs(Protocol):
    """A tensor's shape under the job's shape signature and under a second one (`signatures.ShapeOracle`)."""

    def pair(self, tensor: tf.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None: ...


class SharingError(ValueError):
    """A random op cannot be shared by both paths; the message is the reason recorded for the job."""


def owns_stream(op: tf.Operation) -> bool:
    """A TF1 stateful random op (RandomUniform, TruncatedNormal, Multinomial...): its kernel holds the
    generator, so a copy of the op draws its own stream (seeded: the original's stream again)."""
    if op.op_def is None or not op.op_def.is_stateful:
        return False
    return {attr.name for attr in op.op_def.attr} >= SEEDS


def share(graph: tf.Graph, members: Collection[str], oracle: ShapePairs | None = None) -> list[str]:
    """Rewires every random op that `owns_stream` and reads an op of `members` so that the twin shares it.

    Control inputs from members are dropped (they order the draw, never change it); a shape input from
    members is rebuilt from shared tensors (`_shared_shape`; `oracle`: the job's `signatures.ShapeOracle`
    under a shape signature, for dimensions Grappler cannot relate); any other data input from members stays,
    so the twin's run computes that value on the original ops as plain TF does, allowed only when those
    ops hold no state (they would run beside their copies). Returns the names of the ops rewired."""
    rewired: list[str] = []
    randoms = [op for op in graph.get_operations() if op.name not in members and owns_stream(op)]
    reading = [op for op in randoms if _reads(op, members)]
    if not reading:
        return rewired
    properties: dict[str, Any] | None = None
    after = set(downstream(randoms, control=True))  # a shape source here would close a cycle
    for op in reading:
        kept = [c for c in op.control_inputs if c.name not in members]
        if len(kept) != len(op.control_inputs):
            op._remove_all_control_inputs()
            op._add_control_inputs(kept)
        if op.type in SHAPED and op.inputs[0].op.name in members:
            if properties is None:
                properties = _properties(graph, reading)
            op._update_input(0, _shared_shape(graph, op, properties, set(members) | after, oracle))
        left = [t for t in op.inputs if t.op.name in members]
        if left:
            stateful = [o.name for o in upstream([t.op for t in left]).values() if o.name in members and _holds(o)]
            if stateful:
                raise SharingError(
                    f"random op {op.name!r} reads {left[0].name}, computed after stateful op {stateful[0]!r}: "
                    "the stitched copy cannot share its stream"
                )
            log.info("stitchfleet: %s reads %s on the original ops on stitched steps too", op.name, left[0].name)
        rewired.append(op.name)
    return rewired


def _reads(op: Any, members: Collection[str]) -> bool:
    return any(t.op.name in members for t in op.inputs) or any(c.name in members for c in op.control_inputs)


def _holds(op: Any) -> bool:
    return op.op_def is not None and bool(op.op_def.is_stateful)


def _properties(graph: Any, roots: Iterable[Any]) -> dict[str, Any]:
    """Grappler's static shapes of every op upstream of `roots`: an unknown dimension known to equal
    another one carries the same negative id (< -1) in both."""
    from tensorflow.python.grappler import item as grappler_item

    meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    for op in roots:
        meta.collection_def["train_op"].node_list.value.append(op.name)
    return dict(grappler_item.Item(meta).GetOpProperties())


def _shared_shape(
    graph: Any, op: Any, properties: dict[str, Any], excluded: Collection[str], oracle: ShapePairs | None
) -> Any:
    """A tensor equal to `op`'s shape input on every step, computed from tensors outside `excluded`:
    constants for static dimensions, `Shape(t)[i]` of a shared tensor with the same symbolic dimension
    (Grappler's), else with the same size under both of the oracle's signatures."""
    if op._get_control_flow_context() is not None:
        raise SharingError(f"random op {op.name!r} inside TF control flow draws a shape computed by a cluster")
    try:
        parts = _symbolic_parts(graph, op, properties, excluded)
    except SharingError:
        if oracle is None:
            raise
        parts = _signature_parts(graph, op, oracle, excluded)
    dtype = op.inputs[0].dtype
    with graph.as_default(), tf.name_scope(f"{op.name}/stitchfleet_shape/"), tf.device(op.device):
        built = [
            tf.constant(part, dtype) if isinstance(part, int) else tf.compat.v1.shape(part[0], out_type=dtype)[part[1]]
            for part in parts
        ]
        return tf.stack(built) if built else tf.constant([], dtype)


Part = int | tuple[Any, int]  # a static size, or (tensor, axis) carrying a varying one


def _symbolic_parts(graph: Any, op: Any, properties: dict[str, Any], excluded: Collection[str]) -> list[Part]:
    """Per dimension of `op`'s draw: its size, or a shared tensor and axis with its Grappler symbolic id."""
    dims = _dims(properties.get(op.name, ()), 0)
    if dims is None or -1 in dims:
        raise SharingError(f"random op {op.name!r} draws a shape TF cannot relate to the job's inputs")
    sources = _sources(graph, properties, {d for d in dims if d < -1}, excluded)
    parts: list[Part] = []
    for d in dims:
        if d < 0 and d not in sources:
            raise SharingError(f"random op {op.name!r} draws a shape no tensor outside the clusters has")
        parts.append(d if d >= 0 else sources[d])
    return parts


def _signature_parts(graph: Any, op: Any, oracle: ShapePairs, excluded: Collection[str]) -> list[Part]:
    """Per dimension of `op`'s draw: its size when it is the same under both of the oracle's signatures, else a
    shared tensor and axis of the same size under both, the job's inputs first. Grappler loses the relation
    through an `Einsum` (Keras' MultiHeadAttention: its attention dropout draws `Shape(softmax)`, whose batch
    dimension Grappler gives a fresh id), and the job's setup failed: no cluster of it was stitched."""
    pair = oracle.pair(op.outputs[0])
    if pair is None:
        raise SharingError(f"random op {op.name!r} draws a shape the job's shape signature does not give")
    wanted = {(a, b) for a, b in zip(*pair, strict=True) if a != b}
    found: dict[tuple[int, int], tuple[Any, int]] = {}
    ops = [o for o in graph.get_operations() if o.name not in excluded and o.type != "Const"]
    ops.sort(key=lambda o: o.type not in FEEDS)  # stable: otherwise the graph's order
    for source in ops:
        if len(found) == len(wanted):
            break
        if source._get_control_flow_context() is not None:
            continue
        for tensor in source.outputs:
            sizes = oracle.pair(tensor) if tensor.dtype != tf.resource else None
            for axis, size in enumerate(zip(*sizes, strict=True) if sizes is not None else ()):
                if size in wanted and size not in found:
                    found[size] = (tensor, axis)
    parts: list[Part] = []
    for size in zip(*pair, strict=True):
        if size[0] != size[1] and size not in found:
            raise SharingError(f"random op {op.name!r} draws a shape no tensor outside the clusters has")
        parts.append(size[0] if size[0] == size[1] else found[size])
    return parts


def _dims(outputs: Any, index: int) -> list[int] | None:
    if len(outputs) <= index or outputs[index].shape.unknown_rank:
        return None
    return [int(d.size) for d in outputs[index].shape.dim]


def _sources(graph: Any, properties: dict[str, Any], wanted: set[int], excluded: Collection[str]) -> dict[int, Any]:
    """For each symbolic dimension wanted, a shared tensor and axis carrying it, the job's inputs first."""
    found: dict[int, Any] = {}
    ops = [op for op in graph.get_operations() if op.name not in excluded and op.name in properties]
    ops.sort(key=lambda op: op.type not in FEEDS)  # stable: otherwise the graph's order
    for op in ops:
        if len(found) == len(wanted):
            break
        if op._get_control_flow_context() is not None or op.type == "Const":
            continue
        for index, tensor in enumerate(op.outputs):
            for axis, d in enumerate(_dims(properties[op.name], index) or ()):
                if d in wanted and d not in found and tensor.dtype != tf.resource:
                    found[d] = (tensor, axis)
    return found
