"""Shapes a cluster's TF ops recompute per call under a shape signature, instead of folded constants.

Input: a mapped `Site` whose `varying` names the folded tensors whose values depend on the job's shape
signature (`signatures.Specialisation.mark`) and whose `oracle` tells which tensors share a shape whatever the
signature. Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import op_def_pb2

from stitchfleet.plugin.graph.mapping import FOLDS_SHAPES, Site
from stitchfleet.plugin.graph.op_graph import downstream

FEEDABLE_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
REBUILT = frozenset({"Shape", "Size"})  # readers whose value `rebuilt` computes from other tensors' dimensions
# a static size, or (tensor, axis, times, over, plus): its size there * times / over + plus
Size = int | tuple[Any, int, int, int, int]


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
            if tensor.name in known or tensor.op.name in have:
                continue
            if op.type in FOLDS_SHAPES and tensor.op.type not in ("Const", *FOLDS_SHAPES):
                shaped[tensor.name] = tensor
                continue
            todo.append(tensor.op)  # its value is read: computed here, even where another op reads its shape
    # A tensor computed here is read as it is by its shape readers too. A rename applies to every read of the
    # tensor in the clone: one that also stood for a recomputed value replaced that value (word2vec's NCE loss:
    # the labels `ones_like(logits) / num_true` became the sampler's expected counts, of the same shape).
    shaped = {name: tensor for name, tensor in shaped.items() if tensor.op.name not in found}
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
                held_here = [t for t in reader.inputs if t.name in known or t.op.name in have or t.op.name in found]
                built, values = rebuilt(site, reader, held_here, originals or {}, candidates)
                made += built
                renamed.update({output.name: value for output, value in zip(reader.outputs, values, strict=True)})
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


def rebuilt(
    site: Site,
    reader: tf.Operation,
    held_here: Sequence[tf.Tensor],
    originals: Mapping[str, str],
    candidates: Sequence[tf.Tensor],
) -> tuple[list[Made], list[str]]:
    """The ops computing `reader`'s value (a `Shape` or `Size`, or a `ShapeN`) without reading the tensors whose
    shapes it reads, except those the clone holds (`held_here`: read as they are), from the candidates' dimensions
    (`originals`: earlier clusters' switched outputs -> the tensors they replaced, whose shapes the oracle knows),
    and the name of each output's value; ValueError when a dimension that varies relates to none of the
    candidates. A dimension varying with the signature is a candidate's
    dimension of the same size under both of the oracle's signatures, else one in the same ratio to it under both
    (a Tensordot's `[batch * tokens, width]` for a `[batch, tokens, width]` input: Keras' Dense under a `None`
    batch, whose gradient reshapes to its input's shape); a static dimension is a constant (a convolution
    gradient's `ShapeN` of a varying image and a variable's kernel: the kernel's shape). Any dtype stands in: only
    dimensions are read (`same_shape` keeps the dtype for the reader's `T`)."""
    if reader.type not in (*REBUILT, "ShapeN"):
        raise ValueError(
            f"the shape of {reader.inputs[0].name!r} depends on the job's shape signature and no tensor at hand has it"
        )
    graph, held_names = reader.graph, {t.name for t in held_here}
    scratch, reads = tf.Graph(), dict[str, str]()
    stand_ins: dict[str, Any] = {}

    def stand_in(source: tf.Tensor) -> Any:
        if source.name not in stand_ins:
            stand_ins[source.name] = tf.compat.v1.placeholder(source.dtype.base_dtype, name=f"in_{len(stand_ins)}")
            reads[stand_ins[source.name].name] = source.name
        return stand_ins[source.name]

    kind, out_type, values = ("Size" if reader.type == "Size" else "Shape"), reader.get_attr("out_type"), []
    reads_of = reader.inputs if reader.type == "ShapeN" else reader.inputs[:1]
    with scratch.as_default(), tf.name_scope(f"{reader.name}/stitchfleet_rebuilt/"):
        for k, read in enumerate(reads_of):
            with tf.name_scope(f"output_{k}") if reader.type == "ShapeN" else contextlib.nullcontext():
                if read.name in held_names:
                    measure = tf.compat.v1.size if kind == "Size" else tf.compat.v1.shape
                    value = measure(stand_in(read), out_type=out_type, name="value")
                else:
                    original = graph.get_tensor_by_name(originals.get(read.name, read.name))
                    value = shape_value(dimensions(site, original, candidates), kind, out_type, stand_in)
            values.append(value.name)
    return [Made(op, reads) for op in scratch.get_operations() if op.type != "Placeholder"], values


def dimensions(site: Site, tensor: tf.Tensor, candidates: Sequence[tf.Tensor]) -> list[Size]:
    """`tensor`'s dimensions as `rebuilt` reads them: per axis a static size or a candidate's dimension (times a
    ratio); ValueError when a dimension that varies relates to none of the candidates."""
    pair = site.oracle.pair(tensor) if site.oracle is not None else None
    found = [_size(site, first, second, candidates) for first, second in zip(*pair, strict=True)] if pair else [None]
    sizes = [size for size in found if size is not None]
    if len(sizes) != len(found):
        raise ValueError(
            f"the shape of {tensor.name!r} depends on the job's shape signature and no tensor at hand has it"
        )
    return sizes


def shape_value(
    sizes: Sequence[Size], kind: str, out_type: tf.DType, source: Callable[[tf.Tensor], tf.Tensor]
) -> tf.Tensor:
    """Ops in the default graph computing a `Shape` (`kind`: the dimensions) or a `Size` (their product), in
    `out_type`, from `sizes` (`dimensions`), reading each candidate's shape from `source(candidate)`: a stand-in in
    `rebuilt`'s scratch graph, the live tensor itself for a reader outside a cluster (`rewrite`)."""
    parts = []
    for size in sizes:
        if isinstance(size, int):
            parts.append(tf.constant(size, tf.int64))
            continue
        candidate, axis, times, over, plus = size
        part = tf.compat.v1.shape(source(candidate), out_type=tf.int64)[axis]
        part = part * times // over if (times, over) != (1, 1) else part
        parts.append(part + plus if plus else part)
    shape = tf.stack(parts) if parts else tf.constant([], tf.int64)
    value = tf.reduce_prod(shape) if kind == "Size" else shape
    return tf.cast(value, out_type, name="value")


def _size(site: Site, first: int, second: int, candidates: Sequence[Any]) -> Size | None:
    """A dimension of sizes `first`, `second` under the oracle's two signatures: the size when they agree, else a
    candidate's dimension equal to it under both (preferred), else in the same ratio to it under both (the rule
    since session 9), else a constant apart from it under both (word2vec's gathered NCE weights, `[batch +
    num_sampled, width]`, for a `[batch, width]` input); None if none is. On one candidate's dimension the last two
    cannot both fit; on two candidates' they can, and two signatures cannot tell which relation is true: the ratio
    is kept, as before the offset rule was added."""
    if first == second:
        return first
    if site.oracle is None:  # one signature only: no candidate's dimension can be told to vary alike
        return None
    ratio: Size | None = None
    offset: Size | None = None
    for candidate in candidates:
        pair = site.oracle.pair(candidate)
        for axis, (a, b) in enumerate(zip(*pair, strict=True) if pair else ()):
            if (a, b) == (first, second):
                return candidate, axis, 1, 1, 0
            if ratio is None and a != b and a * second == b * first and a * first > 0:
                common = math.gcd(first, a)
                ratio = (candidate, axis, first // common, a // common, 0)
            if offset is None and a != b and first - a == second - b:
                offset = (candidate, axis, 1, 1, first - a)
    return ratio if ratio is not None else offset


def graph_of(site: Site) -> tf.Graph:
    return (site.internal or site.outputs)[0].graph
