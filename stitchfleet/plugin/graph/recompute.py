"""Shapes a cluster's TF ops recompute per call under a shape signature, instead of folded constants.

Input: a mapped `Site` whose `varying` names the folded tensors whose values depend on the job's shape
signature (`signatures.Specialisation.mark`) and whose `oracle` tells which tensors share a shape whatever the
signature. Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from stitchfleet.plugin.graph.mapping import FOLDS_SHAPES, Site
from stitchfleet.plugin.graph.op_graph import downstream

FEEDABLE_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})


def recomputed(site: Site, known: Collection[str]) -> tuple[list[Any], dict[str, str]]:
    """The ops computing the site's varying folded tensors (shapes under a shape signature: a gradient's
    `Reshape` to `Shape(x)`) from constants and shapes, so the clone computes them for whatever shapes a
    call has instead of reading the signature's constants, and the renames of the tensors whose shapes
    they read that the clone does not hold (to a held tensor of the same shape whatever the signature);
    ValueError when there is none."""
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
    renamed = {
        name: same_shape(site, tensor, [*site.inputs, *held(site, found)]).name for name, tensor in shaped.items()
    }
    return list(found.values()), renamed


def held(site: Site, found: Mapping[str, Any]) -> list[Any]:
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


def same_shape(site: Site, tensor: Any, candidates: Sequence[Any]) -> Any:
    """A tensor of `candidates` with `tensor`'s dtype and its shape under every signature (the site's oracle), else
    ValueError. The dtype too: the reader (`Shape`, `Size`...) is typed by its input (its `T`), and a tensor of
    the same shape but another dtype (the float16 input of a cluster that casts to float32, as Keras' layer
    normalization does under mixed precision) made a graph TF refuses when the session is created."""
    for candidate in candidates if site.oracle is not None else ():
        if candidate.dtype.base_dtype == tensor.dtype.base_dtype and site.oracle.same(tensor, candidate):
            return candidate
    raise ValueError(f"the shape of {tensor.name!r} depends on the job's shape signature and no tensor at hand has it")


def graph_of(site: Site) -> Any:
    return (site.internal or site.outputs)[0].graph
