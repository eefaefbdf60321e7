"""Constant folding: the value of a TF op computed at conversion time, in numpy.

Input: a `Site` whose operands are all known constants (or, for Shape, Size and Rank, have static shapes).
Output: the values of the op's outputs, or None when the op is not foldable here. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir import DType
from stitchfleet.plugin.frontend.context import Array, Site
from stitchfleet.plugin.frontend.structure import axes_of, strided_index

FOLD_LIMIT = 1 << 16
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

_Folder = Callable[[Site, list[Array]], list[Array]]

_UNARY: dict[str, Callable[[Array], Array]] = {
    "Neg": np.negative,
    "Abs": np.abs,
    "Square": np.square,
    "Sqrt": np.sqrt,
    "Rsqrt": lambda x: 1 / np.sqrt(x),
    "Exp": np.exp,
    "Log": np.log,
    "Reciprocal": lambda x: 1 / x,
    "LogicalNot": np.logical_not,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Identity": lambda x: x,
    "StopGradient": lambda x: x,
    "Snapshot": lambda x: x,
    "PreventGradient": lambda x: x,
    "ZerosLike": np.zeros_like,
    "OnesLike": np.ones_like,
    "InvertPermutation": np.argsort,
}
_BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "Add": np.add,
    "AddV2": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "RealDiv": np.true_divide,
    "Div": lambda x, y: np.trunc(x / y) if x.dtype.kind in "iu" else x / y,
    "FloorDiv": np.floor_divide,
    "FloorMod": np.mod,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
    "Pow": np.power,
    "Equal": np.equal,
    "NotEqual": np.not_equal,
    "Greater": np.greater,
    "GreaterEqual": np.greater_equal,
    "Less": np.less,
    "LessEqual": np.less_equal,
    "LogicalAnd": np.logical_and,
    "LogicalOr": np.logical_or,
}
_REDUCE: dict[str, Callable[..., Array]] = {
    "Sum": np.sum,
    "Prod": np.prod,
    "Max": np.max,
    "Min": np.min,
    "Mean": np.mean,
}


def _shape(site: Site, known: list[Array]) -> list[Array]:
    return [np.asarray(a.shape) for a in site.args]


def _size(site: Site, known: list[Array]) -> list[Array]:
    shape = site.args[0].shape or ()
    return [np.asarray(int(np.prod(shape)) if site.type == "Size" else len(shape))]


def _reduce(site: Site, known: list[Array]) -> list[Array]:
    x, axes = known
    keep = bool(site.attr("keep_dims", False))
    return [_REDUCE[site.type](x, axis=axes_of(axes, x.ndim), keepdims=keep)]


def _broadcast_gradient_args(site: Site, known: list[Array]) -> list[Array]:
    """TF's BCast reduction indices: dims where one side is 1 (both sides when both are 1)."""
    s0, s1 = (list(map(int, k)) for k in known)
    if s0 == s1:
        return [np.zeros(0, np.int64), np.zeros(0, np.int64)]
    rank = max(len(s0), len(s1))
    x, y = [1] * (rank - len(s0)) + s0, [1] * (rank - len(s1)) + s1
    r0 = [i for i in range(rank) if x[i] == 1 and (y[i] != 1 or x[i] == y[i])]
    r1 = [i for i in range(rank) if y[i] == 1 and (x[i] != 1 or x[i] == y[i])]
    return [np.asarray(r0, np.int64), np.asarray(r1, np.int64)]


def _dynamic_stitch(site: Site, known: list[Array]) -> list[Array]:
    half = len(known) // 2
    indices, data = known[:half], known[half:]
    size = 1 + max((int(np.max(i)) for i in indices if i.size), default=-1)
    inner = data[0].shape[indices[0].ndim :]
    merged = np.zeros((size, *inner), dtype=data[0].dtype)
    for idx, values in zip(indices, data, strict=True):
        merged[idx.ravel()] = values.reshape(-1, *inner)
    return [merged]


def _strided_slice(site: Site, known: list[Array]) -> list[Array]:
    x, begin, end, strides = known
    index: Any = tuple(strided_index(site, begin, end, strides))
    return [np.asarray(x[index])]


def _slice(site: Site, known: list[Array]) -> list[Array]:
    x, begin, size = known
    index = tuple(slice(int(b), None if int(n) == -1 else int(b) + int(n)) for b, n in zip(begin, size, strict=True))
    return [x[index]]


def _concat(site: Site, known: list[Array]) -> list[Array]:
    axis, values = (known[0], known[1:]) if site.type == "Concat" else (known[-1], known[:-1])
    return [np.concatenate(values, axis=int(axis))]


def _squeeze(site: Site, known: list[Array]) -> list[Array]:
    dims = site.integers("squeeze_dims")
    return [np.squeeze(known[0], axis=tuple(dims)) if dims else np.squeeze(known[0])]


def _list_diff(site: Site, known: list[Array]) -> list[Array]:
    x, y = known
    keep = [i for i, v in enumerate(x) if v not in set(y.tolist())]
    return [x[keep], np.asarray(keep)]


def _concat_offset(site: Site, known: list[Array]) -> list[Array]:
    axis, shapes = int(known[0]), known[1:]
    starts = np.cumsum([0] + [int(s[axis]) for s in shapes[:-1]])
    offsets = []
    for start in starts:
        offset = np.zeros_like(shapes[0])
        offset[axis] = start
        offsets.append(offset)
    return offsets


_FOLDERS: dict[str, _Folder] = {
    "ListDiff": _list_diff,
    "ConcatOffset": _concat_offset,
    **dict.fromkeys(("Shape", "ShapeN"), _shape),
    **dict.fromkeys(("Size", "Rank"), _size),
    **{name: (lambda s, k, f=f: [f(k[0])]) for name, f in _UNARY.items()},  # type: ignore[misc]
    **{name: (lambda s, k, f=f: [f(k[0], k[1])]) for name, f in _BINARY.items()},  # type: ignore[misc]
    **dict.fromkeys(_REDUCE, _reduce),
    "BroadcastGradientArgs": _broadcast_gradient_args,
    "DynamicStitch": _dynamic_stitch,
    "ParallelDynamicStitch": _dynamic_stitch,
    "StridedSlice": _strided_slice,
    "Slice": _slice,
    "ConcatV2": _concat,
    "Concat": _concat,
    "Pack": lambda s, k: [np.stack(k, axis=s.integer("axis"))],
    "Unpack": lambda s, k: list(np.moveaxis(k[0], s.integer("axis"), 0)),
    "Reshape": lambda s, k: [k[0].reshape([int(d) for d in k[1]])],
    "ExpandDims": lambda s, k: [np.expand_dims(k[0], int(k[1]))],
    "Squeeze": _squeeze,
    "Cast": lambda s, k: [k[0]],
    "Fill": lambda s, k: [np.full([int(d) for d in k[0]], k[1])],
    "Range": lambda s, k: [np.arange(k[0], k[1], k[2])],
    "Transpose": lambda s, k: [np.transpose(k[0], [int(p) for p in k[1]])],
    "Tile": lambda s, k: [np.tile(k[0], [int(m) for m in k[1]])],
    "BroadcastTo": lambda s, k: [np.broadcast_to(k[0], [int(d) for d in k[1]])],
    "GatherV2": lambda s, k: [np.take(k[0], k[1], axis=int(k[2]))],
    "Select": lambda s, k: [np.where(k[0], k[1], k[2])],
    "SelectV2": lambda s, k: [np.where(k[0], k[1], k[2])],
}


def _as_type(array: Array, dtype: DType) -> Array:
    """Stored as TF stores `dtype` (bf16 rounded, held in float32 like the IR does)."""
    converted = array.astype(dtype.numpy)
    return round_bf16(converted) if dtype is DType.BF16 else converted


def foldable(site: Site) -> bool:
    """Whether `fold` may compute this op: a folder exists and every operand it reads is known."""
    if site.type not in _FOLDERS or not site.outs or len(site.outs) != len(site.op.outputs):
        return False
    if site.type in SHAPE_OPS:
        return all(a.is_static for a in site.args)
    return all(a.known is not None for a in site.args)


def fold(site: Site) -> list[Array] | None:
    """The op's output values, cast to TF's output dtypes, or None when not foldable or too large."""
    if not foldable(site):
        return None
    if any(-1 not in out.shape and int(np.prod(out.shape)) > FOLD_LIMIT for out in site.outs):
        return None
    known = [a.known if a.known is not None else np.zeros(0) for a in site.args]
    with np.errstate(all="ignore"):
        results = _FOLDERS[site.type](site, known)
    arrays = [_as_type(np.asarray(r), out.dtype) for r, out in zip(results, site.outs, strict=True)]
    if any(a.size > FOLD_LIMIT for a in arrays):
        return None
    if any(a.shape != out.shape for a, out in zip(arrays, site.outs, strict=True) if -1 not in out.shape):
        return None
    return arrays
