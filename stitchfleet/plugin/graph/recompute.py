"""Shapes a cluster's TF ops recompute per call under a shape signature, instead of folded constants.

Input: a mapped `Site` whose `varying` names the folded tensors whose values depend on the job's shape
signature (`signatures.Specialisation.mark`) and whose `oracle` tells which tensors share a shape whatever the
signature. Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import op_def_pb2

from stitchfleet.plugin.graph.mapping import FOLDS_SHAPES, Site
from stitchfleet.plugin.graph.op_graph import downstream

FEEDABLE_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
REBUILT = frozenset({"Shape", "Size"})  # readers whose value `rebuilt` computes from other tensors' dimensions
Size = int | tuple[Any, int, int, int]  # a static size, or (tensor, axis, times, over): its size there * times / over


def recomputed(
    site: Site, known: Collection[str], originals: Mapping[str, str] | None = None
) -> tuple[list[tf.Operation | Made], dict[str, str]]:
    """The ops computing the site's varying folded tensors (shapes under a shape signature: a gradient's
    `Reshape` to `Shape(x)`) from constants and shapes, so the clone computes them for whatever shapes a
    call has instead of reading the signature's constants, and the renames of the tensors whose shapes
    they read that the clone does not hold (to a held tensor of the same shape whatever the signature, else to
    ops computing the reader's value from held tensors' dimensions: `rebuilt`); ValueError when there is none.
    `originals`: earlier clusters' switched outputs -> the tensors they replaced (whose shapes the oracle knows)."""
    have = site.internal_names
    found: dict[str, Any] = {}
    shaped: dict[str, Any] = {}  # tensors whose shape only is read, by a recomputed op
    todo = [graph_of(site).get_tensor_by_name(name).op for name in sorted(site.varying)]
    while todo:
        op = todo.pop()
        if op.name in found or op.name in have:
            continue
        if op.op_def.is_stateful or op.type in FEEDABLE_OPS:
            raise ValueError(f"{op.name!r} ({op.type}) computes a shape that depends on the job's shape signature")
        found[op.name] = op
        for tensor in op.inputs:
            if tensor.name in known or tensor.op.name in have or tensor.name in shaped:
                continue
            if op.type in FOLDS_SHAPES and tensor.op.type not in ("Const", *FOLDS_SHAPES):
                shaped[tensor.name] = tensor
                continue
            todo.append(tensor.op)
    # only after the walk: a held tensor computed from a recomputed shape cannot stand in (`held`)
    candidates = [*site.inputs, *held(site, found)]
    renamed: dict[str, str] = {}
    made: list[Made] = []
    graph = graph_of(site)
    for name, tensor in shaped.items():
        original = graph.get_tensor_by_name(originals[name]) if originals and name in originals else tensor
        try:
            renamed[name] = same_shape(site, original, candidates).name
        except ValueError:
            # no tensor at hand has its shape: its readers' values from the dimensions of those that relate
            readers = [op for op in found.values() if any(t is tensor for t in op.inputs)]
            for reader in readers:
                built = rebuilt(site, reader, original, candidates)
                made += built
                renamed[reader.outputs[0].name] = f"{built[-1].name}:0"
                del found[reader.name]
    return [*found.values(), *made], renamed


def held(site: Site, found: Mapping[str, tf.Operation | Made]) -> list[tf.Tensor]:
    """The tensors the cluster holds that it computes without any value recomputed here (the varying tensors and
    the ops `found` to recompute them): only these may stand for a shape the recomputing ops read. One computed
    from such a value closed a cycle (a `[None, None, 64]` input's Dense: the Tensordot's Reshape to its
    recomputed shape stood for the input whose shape the recomputation reads; Mean's gradient: its BroadcastTo
    to the recomputed `Shape(x)` has x's shape), and the cluster's TF function failed its first call ('56 nodes
    in a cycle')."""
    names = site.internal_names
    readers = [op for op in site.internal if any(t.name in site.varying or t.op.name in found for t in op.inputs)]
    after = downstream(readers, control=False, skip=lambda op: op.name not in names)
    return [t for op in site.internal if op.name not in after for t in op.outputs]


def same_shape(site: Site, tensor: tf.Tensor, candidates: Sequence[tf.Tensor]) -> tf.Tensor:
    """A tensor of `candidates` with `tensor`'s dtype and its shape under every signature (the site's oracle), else
    ValueError. The dtype too: the reader (`Shape`, `Size`...) is typed by its input (its `T`), and a tensor of
    the same shape but another dtype (the float16 input of a cluster that casts to float32, as Keras' layer
    normalization does under mixed precision) made a graph TF refuses when the session is created."""
    if site.oracle is not None:
        for candidate in candidates:
            if candidate.dtype.base_dtype == tensor.dtype.base_dtype and site.oracle.same(tensor, candidate):
                return candidate
    raise ValueError(f"the shape of {tensor.name!r} depends on the job's shape signature and no tensor at hand has it")


@dataclass(frozen=True)
class Made:
    """An op computing a shape reader's value from the dimensions of other tensors: built in a scratch graph,
    it reads the cluster's tensors by their names (`reads`: scratch tensor name -> the cluster's). It has what
    the clone and the fallback function read of a TF op: its name, NodeDef, OpDef and attributes."""

    op: tf.Operation
    reads: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.op.name)

    @property
    def node_def(self) -> tf.compat.v1.NodeDef:
        node = self.op.node_def
        kept = [self.reads.get(n if ":" in n else f"{n}:0", n) for n in node.input]
        del node.input[:]
        node.input.extend(kept)
        return node

    @property
    def op_def(self) -> op_def_pb2.OpDef:
        return self.op.op_def

    def get_attr(self, name: str) -> object:
        return self.op.get_attr(name)


def rebuilt(site: Site, reader: tf.Operation, tensor: tf.Tensor, candidates: Sequence[tf.Tensor]) -> list[Made]:
    """The ops computing `reader`'s value (a `Shape` or `Size` of `tensor`, whose shape no candidate has) from the
    candidates' dimensions, its output last; ValueError when a dimension that varies relates to none of them.
    A dimension varying with the signature is a candidate's dimension of the same size under both of the oracle's
    signatures, else one in the same ratio to it under both (a Tensordot's `[batch * tokens, width]` for a
    `[batch, tokens, width]` input: Keras' Dense under a `None` batch, whose gradient reshapes to its input's
    shape). Any dtype stands in: only dimensions are read (`same_shape` keeps the dtype for the reader's `T`)."""
    pair = site.oracle.pair(tensor) if reader.type in REBUILT and site.oracle is not None else None
    found = [_size(site, first, second, candidates) for first, second in zip(*pair, strict=True)] if pair else [None]
    sizes = [size for size in found if size is not None]
    if len(sizes) != len(found):
        raise ValueError(
            f"the shape of {tensor.name!r} depends on the job's shape signature and no tensor at hand has it"
        )
    scratch, reads = tf.Graph(), dict[str, str]()
    with scratch.as_default(), tf.name_scope(f"{reader.name}/stitchfleet_rebuilt/"):
        stand_ins: dict[str, Any] = {}
        parts = []
        for size in sizes:
            if isinstance(size, int):
                parts.append(tf.constant(size, tf.int64))
                continue
            source, axis, times, over = size
            if source.name not in stand_ins:
                stand_ins[source.name] = tf.compat.v1.placeholder(source.dtype.base_dtype, name=f"in_{len(stand_ins)}")
                reads[stand_ins[source.name].name] = source.name
            part = tf.compat.v1.shape(stand_ins[source.name], out_type=tf.int64)[axis]
            parts.append(part * times // over if (times, over) != (1, 1) else part)
        shape = tf.stack(parts) if parts else tf.constant([], tf.int64)
        value = tf.reduce_prod(shape) if reader.type == "Size" else shape
        tf.cast(value, reader.get_attr("out_type"), name="value")
    return [Made(op, reads) for op in scratch.get_operations() if op.type != "Placeholder"]


def _size(site: Site, first: int, second: int, candidates: Sequence[Any]) -> Size | None:
    """A dimension of sizes `first`, `second` under the oracle's two signatures: the size when they agree, else a
    candidate's dimension equal to it under both (preferred) or in the same ratio under both; None if none is."""
    if first == second:
        return first
    if site.oracle is None:  # one signature only: no candidate's dimension can be told to vary alike
        return None
    ratio: Size | None = None
    for candidate in candidates:
        pair = site.oracle.pair(candidate)
        for axis, (a, b) in enumerate(zip(*pair, strict=True) if pair else ()):
            if (a, b) == (first, second):
                return candidate, axis, 1, 1
            if ratio is None and a != b and a * second == b * first and a * first > 0:
                common = math.gcd(first, a)
                ratio = (candidate, axis, first // common, a // common)
    return ratio


def graph_of(site: Site) -> tf.Graph:
    return (site.internal or site.outputs)[0].graph
