"""Check-step copies of the inputs a cluster reads out of TF1 ref variables' buffers.

Input: a cluster's input tensors (as the stitched op reads them) and the `checking` flag (a bool placeholder
the hook feeds True on check steps). Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.python.ops import control_flow_ops

ALIASES = frozenset({"Identity", "RefIdentity"})  # forward their input's buffer: no copy


def aliases_ref(tensor: tf.Tensor) -> bool:
    """Whether `tensor` is a TF1 ref variable's buffer itself (a float_ref tensor, or its `read` Identity):
    an update later in the step (ApplyGradientDescent, Assign) changes it in place."""
    while True:
        if tensor.dtype._is_ref_dtype:
            return True
        if tensor.op.type not in ALIASES or not tensor.op.inputs:
            return False
        tensor = tensor.op.inputs[0]


def taken(
    inputs: Sequence[tf.Tensor], checking: tf.Tensor, shared: dict[str, tf.Tensor] | None = None
) -> tuple[list[tf.Tensor], list[int]]:
    """`inputs` with each ref alias replaced by `Merge(Switch(x))`: its buffer as before on other steps,
    a copy (`Snapshot`) on check steps, taken before the stitched op reads it; the positions replaced.
    Ops inside TF control flow are left as they are (a Switch there would need its frame).

    `shared` (tensor name -> its Merge) holds one copy per ref alias for every cluster of the graph:
    clusters overlap (a variable's `read` Identity inside several of them), and a shared interior op can
    read only one copy; with one per alias, every cluster's kernel and TF ops read the same value."""
    read, moved = list(inputs), []
    shared = {} if shared is None else shared
    for position, tensor in enumerate(inputs):
        if not aliases_ref(tensor) or tensor.op._get_control_flow_context() is not None:
            continue
        if tensor.name in shared:
            read[position] = shared[tensor.name]
            moved.append(position)
            continue
        with tf.name_scope("check_read"):
            value = tf.identity(tensor)  # a ref is read here (RefSwitch would forward the ref itself)
            other, check = control_flow_ops.switch(value, checking)
            copied = tf.raw_ops.Snapshot(input=check)
            merged, _ = control_flow_ops.merge([other, copied])
        merged.set_shape(tensor.shape)
        shared[tensor.name] = read[position] = merged
        moved.append(position)
    return read, moved
