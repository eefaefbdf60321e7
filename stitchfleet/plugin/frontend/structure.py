"""Lowering rules for TF's data-movement ops, reductions and the decomposed softmax family.

Input: a `Site`. Output: the IR values of the op's outputs. The rules in full: docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stitchfleet.compiler.ir import Op, Shape, Value
from stitchfleet.plugin.frontend.context import Array, LoweringError, Rule, Site

REDUCTIONS = {
    "Sum": Op.REDUCE_SUM,
    "Mean": Op.REDUCE_MEAN,
    "Max": Op.REDUCE_MAX,
    "Min": Op.REDUCE_MIN,
    "Prod": Op.REDUCE_PROD,
}


def axes_of(array: Array, rank: int) -> tuple[int, ...]:
    """Axis operand values normalised to 0..rank-1, sorted, without repeats."""
    axes = [int(a) for a in np.ravel(array)]
    bad = [a for a in axes if not -max(rank, 1) <= a < max(rank, 1)]
    if bad:
        raise LoweringError(f"axis {bad[0]} is out of range for rank {rank}")
    return tuple(sorted({a % rank for a in axes})) if rank else ()


def _reshape(site: Site) -> list[Value]:
    return [site.b.reshape(site.value(0), site.out.shape)]


def _reduce(site: Site) -> list[Value]:
    x = site.value(0)
    axes = axes_of(site.const(1, "reduction axes"), len(x.shape))
    if not axes:
        return [x]
    return [site.b.reduce(REDUCTIONS[site.type], x, axes, keepdims=bool(site.attr("keep_dims", False)))]


def _transpose(site: Site) -> list[Value]:
    perm = tuple(int(p) for p in site.const(1, "permutation"))
    x = site.value(0)
    return [x if perm == tuple(range(len(perm))) else site.b.transpose(x, perm)]


def _tile(site: Site) -> list[Value]:
    b, x, out = site.b, site.value(0), site.out.shape
    if any(d == 0 for d in x.shape):
        raise LoweringError("tiling an empty tensor")
    multiples = [o // d for o, d in zip(out, x.shape, strict=True)]
    if all(m == 1 or d == 1 for m, d in zip(multiples, x.shape, strict=True)):
        return [b.broadcast(x, out, tuple(range(len(out))))]
    # result[i] = x[i % d]: broadcast x into a leading "copy" axis per dim, then merge the pairs
    pairs = tuple(v for m, d in zip(multiples, x.shape, strict=True) for v in (m, d))
    spread = b.broadcast(x, pairs, tuple(range(1, len(pairs), 2)))
    return [b.reshape(spread, out)]


def _broadcast_to(site: Site) -> list[Value]:
    return [site.b.broadcast_to(site.value(0), site.out.shape)]


def _fill(site: Site) -> list[Value]:
    return [site.b.broadcast_to(site.value(1), site.out.shape)]


def _zeros_like(site: Site) -> list[Value]:
    fill = 0.0 if site.type == "ZerosLike" else 1.0
    return [site.b.splat(fill, site.out.shape, site.out.dtype)]


def strided_index(site: Site, begin: Array, end: Array, strides: Array) -> list[object]:
    """The numpy index StridedSlice's operands and masks describe (Ellipsis, None, ints, slices)."""
    masks = {m: site.integer(f"{m}_mask") for m in ("begin", "end", "ellipsis", "new_axis", "shrink_axis")}
    index: list[object] = []
    for i in range(len(begin)):
        bit = 1 << i
        if masks["ellipsis"] & bit:
            index.append(Ellipsis)
        elif masks["new_axis"] & bit:
            index.append(None)
        elif masks["shrink_axis"] & bit:
            index.append(int(begin[i]))
        else:
            lo = None if masks["begin"] & bit else int(begin[i])
            hi = None if masks["end"] & bit else int(end[i])
            index.append(slice(lo, hi, int(strides[i])))
    return index


def _expand_ellipsis(index: list[object], rank: int) -> list[object]:
    if Ellipsis not in index:
        index = [*index, Ellipsis]
    at = index.index(Ellipsis)
    used = sum(1 for item in index if item is not None and item is not Ellipsis)
    return [*index[:at], *([slice(None)] * (rank - used)), *index[at + 1 :]]


def _bounds(item: object, dim: int) -> tuple[int, int, int]:
    if isinstance(item, int):
        start = item + dim if item < 0 else item
        return start, start + 1, 1
    assert isinstance(item, slice)
    start, stop, step = item.indices(dim)
    count = len(range(start, stop, step))
    if step < 1:
        raise LoweringError("slice with a negative stride")
    if count == 0:
        raise LoweringError("empty slice")
    return start, start + (count - 1) * step + 1, step


def slice_value(site: Site, x: Value, index: Sequence[object]) -> Value:
    """IR SLICE (plus a RESHAPE for new and removed axes) of a numpy-style basic index."""
    items = [item for item in _expand_ellipsis(list(index), len(x.shape)) if item is not None]
    bounds = [_bounds(item, dim) for item, dim in zip(items, x.shape, strict=True)]
    begin, end, steps = (tuple(col) for col in zip(*bounds, strict=True)) if bounds else ((), (), ())
    whole = begin == (0,) * len(x.shape) and end == x.shape and steps == (1,) * len(x.shape)
    sliced = x if whole else site.b.slice(x, begin, end, steps)
    return site.b.reshape(sliced, site.out.shape)


def pad(site: Site, x: Value, before: Sequence[int], after: Sequence[int], fill: Value | None = None) -> Value:
    """`x` with `before[i]`/`after[i]` elements of `fill` (default 0) added on each side of axis i."""
    b = site.b
    for axis, (lo, hi) in enumerate(zip(before, after, strict=True)):
        parts = []
        for count in (lo, hi):
            shape = (*x.shape[:axis], count, *x.shape[axis + 1 :])
            filler = b.splat(0.0, shape, x.dtype) if fill is None else b.broadcast_to(fill, shape)
            parts.append([filler] if count else [])
        if lo or hi:
            x = b.concat([*parts[0], x, *parts[1]], axis)
    return x


def _pad(site: Site) -> list[Value]:
    paddings = site.const(1, "paddings").reshape(-1, 2)
    if (paddings < 0).any():
        raise LoweringError("negative padding")
    fill = site.value(2) if site.type == "PadV2" else None
    return [pad(site, site.value(0), [int(p) for p in paddings[:, 0]], [int(p) for p in paddings[:, 1]], fill)]


def _spread(site: Site, x: Value, axis: int, step: int) -> Value:
    """Puts step-1 zeros after every element of `x` along `axis` (the last run trimmed)."""
    b, count = site.b, x.shape[axis]
    column = (*x.shape[: axis + 1], 1, *x.shape[axis + 1 :])
    zeros = b.splat(0.0, (*x.shape[: axis + 1], step - 1, *x.shape[axis + 1 :]), x.dtype)
    woven = b.concat([b.reshape(x, column), zeros], axis + 1)
    flat = b.reshape(woven, (*x.shape[:axis], count * step, *x.shape[axis + 1 :]))
    end = [*flat.shape]
    end[axis] = (count - 1) * step + 1
    return b.slice(flat, (0,) * len(end), end)


def _strided_slice_grad(site: Site) -> list[Value]:
    full = tuple(int(d) for d in site.const(0, "gradient shape"))
    index = strided_index(site, site.const(1, "slice begin"), site.const(2, "slice end"), site.const(3, "strides"))
    items = [item for item in _expand_ellipsis(index, len(full)) if item is not None]
    bounds = [_bounds(item, dim) for item, dim in zip(items, full, strict=True)]
    counts = [len(range(lo, hi, step)) for lo, hi, step in bounds]
    grad = site.b.reshape(site.value(4), counts)
    for axis, (_, _, step) in enumerate(bounds):
        if step > 1:
            grad = _spread(site, grad, axis, step)
    before = [lo for lo, _, _ in bounds]
    tail = [dim - lo - grad.shape[axis] for axis, (dim, lo) in enumerate(zip(full, before, strict=True))]
    return [pad(site, grad, before, tail)]


def _strided_slice(site: Site) -> list[Value]:
    begin, end = site.const(1, "slice begin"), site.const(2, "slice end")
    index = strided_index(site, begin, end, site.const(3, "slice strides"))
    return [slice_value(site, site.value(0), index)]


def _slice(site: Site) -> list[Value]:
    begin, size = site.const(1, "slice begin"), site.const(2, "slice size")
    index = [slice(int(lo), None if int(n) == -1 else int(lo) + int(n)) for lo, n in zip(begin, size, strict=True)]
    return [slice_value(site, site.value(0), index)]


def _concat(site: Site) -> list[Value]:
    axis_at = 0 if site.type == "Concat" else len(site.args) - 1
    values = [site.value(i) for i in range(len(site.args)) if i != axis_at]
    (axis,) = axes_of(site.const(axis_at, "concat axis"), len(values[0].shape))
    return [values[0] if len(values) == 1 else site.b.concat(values, axis)]


def _pack(site: Site) -> list[Value]:
    out = site.out.shape
    axis = site.integer("axis") % len(out)
    piece = (*out[:axis], 1, *out[axis + 1 :])
    values = [site.b.reshape(v, piece) for v in site.values()]
    return [values[0] if len(values) == 1 else site.b.concat(values, axis)]


def _pieces(site: Site, x: Value, axis: int) -> list[Value]:
    """Consecutive slices of `x` along `axis`, sized like the op's outputs."""
    pieces, start = [], 0
    for out in site.outs:
        size = out.shape[axis] if len(out.shape) == len(x.shape) else 1
        index: list[object] = [slice(None)] * len(x.shape)
        index[axis] = slice(start, start + size)
        pieces.append(slice_value(Site(site.op, site.args, [out], site.lowering), x, index))
        start += size
    return pieces


def _split(site: Site) -> list[Value]:
    value_at, axis_at = (1, 0) if site.type == "Split" else (0, 2)
    x = site.value(value_at)
    (axis,) = axes_of(site.const(axis_at, "split axis"), len(x.shape))
    return _pieces(site, x, axis)


def _unpack(site: Site) -> list[Value]:
    x = site.value(0)
    return _pieces(site, x, site.integer("axis") % len(x.shape))


def _shifted(site: Site, x: Value) -> tuple[Value, Value, Value]:
    """(x - max(x), exp of that, its sum) over the last axis, the sum keeping dims."""
    b, last = site.b, (len(x.shape) - 1,)
    shifted = x - b.reduce_max(x, last, keepdims=True)
    exps = b.exp(shifted)
    return shifted, exps, b.reduce_sum(exps, last, keepdims=True)


def _softmax(site: Site) -> list[Value]:
    b = site.b
    shifted, exps, total = _shifted(site, site.value(0))
    if site.type == "LogSoftmax":
        return [shifted - b.log(total)]
    return [exps / total]


def _softmax_xent(site: Site) -> list[Value]:
    b = site.b
    logits, labels = site.value(0), site.value(1)
    shifted, exps, total = _shifted(site, logits)
    labels = b.broadcast_to(labels, shifted.shape)
    loss = b.reduce_sum(labels * (b.log(total) - shifted), (len(shifted.shape) - 1,))
    return [loss, exps / total - labels]


def _need_rank(rule: Rule, minimum: int) -> Rule:
    def checked(site: Site) -> list[Value]:
        shape: Shape | None = site.args[0].shape if site.args else None
        if shape is None or len(shape) < minimum:
            raise LoweringError(f"{site.type} needs an operand of rank >= {minimum}")
        return rule(site)

    return checked


# Rules that take the result shape from TF's static inference rather than from their operands.
NEEDS_RESULT_SHAPE = frozenset(
    {"Reshape", "ExpandDims", "Squeeze", "EnsureShape", "Tile", "BroadcastTo", "Fill", "ZerosLike", "OnesLike"}
    | {"StridedSlice", "Slice", "Pack", "Split", "SplitV", "Unpack"}
)

RULES: dict[str, Rule] = {
    **dict.fromkeys(("Reshape", "ExpandDims", "Squeeze", "EnsureShape"), _reshape),
    **dict.fromkeys(REDUCTIONS, _reduce),
    "Transpose": _transpose,
    "ConjugateTranspose": _transpose,
    "Tile": _tile,
    "BroadcastTo": _broadcast_to,
    "Fill": _fill,
    "ZerosLike": _zeros_like,
    "OnesLike": _zeros_like,
    "StridedSlice": _strided_slice,
    "StridedSliceGrad": _strided_slice_grad,
    "Pad": _pad,
    "PadV2": _pad,
    "Slice": _slice,
    "ConcatV2": _concat,
    "Concat": _concat,
    "Pack": _pack,
    "Split": _split,
    "SplitV": _split,
    "Unpack": _unpack,
    "Softmax": _need_rank(_softmax, 1),
    "LogSoftmax": _need_rank(_softmax, 1),
    "SoftmaxCrossEntropyWithLogits": _need_rank(_softmax_xent, 2),
}
