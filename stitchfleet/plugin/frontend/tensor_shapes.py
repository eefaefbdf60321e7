"""Static shapes of TF tensors as the frontend reads them.

Input: a TF tensor, and for the conversion running in this context the shapes a caller knows where TF's
are partial (`known_shapes`: a job's shape signature, `plugin/shapes/signatures.py`). Output: `tensor_shape`,
the shape with -1 for an unknown dimension (None for an unknown rank).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import tensorflow as tf

# Shapes a caller knows where TF's are partial (`signatures.concrete_shapes`: a `None` batch dimension
# under the sizes a job feeds), for the one conversion running in this context.
_KNOWN_SHAPES: ContextVar[Mapping[str, tuple[int, ...]] | None] = ContextVar("known_shapes", default=None)


def tensor_shape(tensor: tf.Tensor) -> tuple[int, ...] | None:
    """The tensor's static shape (-1 for an unknown dimension, None for an unknown rank): TF's, else the one
    the running conversion was given (`known_shapes`), else what its op's attributes declare."""
    shape = tensor.shape
    if not shape.is_fully_defined():
        known = (_KNOWN_SHAPES.get() or {}).get(tensor.name)
        if known is not None:
            return known
        # functional control flow (If, While, calls) declares its output shapes, from its bodies,
        # in an attribute that TF's shape inference does not always carry over to the tensors
        declared = _declared_shape(tensor)
        shape = shape.merge_with(declared) if shape.is_compatible_with(declared) else shape
    dims = shape.as_list() if shape.rank is not None else None
    return None if dims is None else tuple(-1 if d is None else int(d) for d in dims)


def _declared_shape(tensor: Any) -> Any:
    """The shape an op's `output_shapes` / `_output_shapes` attribute declares for the tensor (unknown if none)."""
    for name in ("output_shapes", "_output_shapes"):
        try:
            shapes = tensor.op.get_attr(name)
        except ValueError:
            continue
        if len(shapes) == len(tensor.op.outputs):
            return tf.TensorShape(shapes[tensor.value_index])
    return tf.TensorShape(None)


@contextmanager
def known_shapes(shapes: Mapping[str, tuple[int, ...]] | None) -> Iterator[None]:
    """Within the block, `tensor_shape` reads `shapes` (tensor name -> shape) where TF's shape is partial."""
    token = _KNOWN_SHAPES.set(shapes)
    try:
        yield
    finally:
        _KNOWN_SHAPES.reset(token)
