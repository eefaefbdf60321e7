"""The TF ops inside a mapped cluster and the outside values they read.

Input: the TF tensors a cluster outputs and reads (its IR's inputs), the tensors the frontend folded, and
which TF tensors the cluster's IR computes (`computed_by`). Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import Graph, IRError, Node, Op
from stitchfleet.compiler.ir.attrs import Attrs
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.batchnorm import FORWARD, RESERVE_OUTPUTS, unbound_rank
from stitchfleet.plugin.frontend.converter import CONTROL_FLOW, FEEDABLE, ir_dtype
from stitchfleet.plugin.graph.op_graph import upstream
from stitchfleet.plugin.graph.placement import device_fields
from stitchfleet.plugin.native import gpu_device

if TYPE_CHECKING:
    import tensorflow as tf

MAX_OPS = 5000
UNREAD_KEY = "unread_inputs"  # cluster graph metadata: how many trailing PARAMETERs nothing reads
DEVICE_SPECIFIC = dict.fromkeys(FORWARD, frozenset(RESERVE_OUTPUTS))  # outputs whose content TF's GPU kernel differs in


class UnmappableError(ValueError):
    """The cluster cannot be rewired in TF; the message is the reason recorded for it."""


@dataclass
class Interior:
    ops: dict[str, tf.Operation] = field(default_factory=dict)  # the cluster's TF ops by name
    reads: set[str] = field(default_factory=set)  # folded tensors they read
    unread: dict[str, tf.Tensor] = field(default_factory=dict)  # outside tensors they read and the IR does not


def check_op(op: tf.Operation) -> None:
    """UnmappableError when `op` cannot be cloned into a cluster's TF fallback."""
    if op.op_def.is_stateful or op.type in FEEDABLE or op.type in CONTROL_FLOW:
        raise UnmappableError(f"reaches {op.type} op {op.name!r} outside its inputs")
    if getattr(op, "_control_flow_context", None) is not None:
        raise UnmappableError(f"op {op.name!r} is inside TF control flow")


def computed_by(
    conversion: Conversion, members: Collection[int], inputs: Collection[int]
) -> Callable[[tf.Tensor], bool]:
    """Whether the cluster of IR nodes `members` (reading IR nodes `inputs`) computes a TF tensor: its IR
    node is a member, or it is another output of a TF op the cluster clones (Unpack's other slices, batch
    norm's reserve spaces), or an alias (Identity) of an input, whose walk ends at that input."""
    tensors = conversion.tensors

    def computes(tensor: Any) -> bool:
        node = tensors.get(tensor.name)
        if node is not None and (node in members or node in inputs):
            return True
        return any(tensors.get(t.name) in members for t in tensor.op.outputs)

    return computes


def walk(
    outputs: list[tf.Tensor], inputs: set[str], folded: Mapping[str, object], computes: Callable[[tf.Tensor], bool]
) -> Interior:
    """The TF ops between the inputs and the outputs (see the module docstring)."""
    found = Interior()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.name in found.ops:
            continue
        check_op(op)
        found.ops[op.name] = op
        if len(found.ops) > MAX_OPS:
            raise UnmappableError(f"more than {MAX_OPS} TF ops")
        for t in op.inputs:
            if t.name in inputs:
                continue
            if t.name in folded:
                found.reads.add(t.name)
            elif computes(t):
                stack.append(t.op)
            else:
                found.unread.setdefault(t.name, _checked_unread(t, op))
    return found


def _checked_unread(tensor: Any, reader: Any) -> Any:
    """`tensor` when it can be a cluster input (an IR type, a known rank), else UnmappableError."""
    if ir_dtype(tensor.dtype) is None or input_shape(tensor) is None:
        what = f"a {tensor.dtype.name} value of shape {tensor.shape}"
        raise UnmappableError(f"TF op {reader.name!r} reads {tensor.name} ({what}), which cannot be a cluster input")
    return tensor


def input_shape(tensor: tf.Tensor) -> tuple[int, ...] | None:
    """The shape of an unread input's PARAMETER: TF's static shape with -1 for unknown dimensions, or -1
    for every dimension of the rank the kernel that runs the op returns when TF knows no rank
    (`batchnorm.unbound_rank`: nothing reads the value, so only its rank must be right, which the dispatch
    op matches); None when the rank is unknown."""
    shape = tensor.shape
    if shape.rank is not None:
        return tuple(-1 if d is None else int(d) for d in shape.as_list())
    on_gpu = device_fields(tensor.op.device, gpu_device.gpu_visible())["device"].startswith("GPU")
    rank = unbound_rank(tensor.op.type, tensor.value_index, on_gpu=on_gpu)
    return None if rank is None else (-1,) * rank


def ignored_value(tensor: tf.Tensor) -> npt.NDArray[np.generic] | None:
    """What may stand for `tensor` where only a CPU kernel reads it: for an output TF gives no rank that its
    reader ignores there (FusedBatchNormV3's reserve_space_3: CPU gradient kernels never read it, checked with
    TF 2.15, oneDNN on and off), zeros of the rank the kernel returns; None for any other tensor. Why: a cluster
    handing it to its TF clone made TF run the forward op a stitched twin no longer runs, and all that feeds it."""
    if tensor.shape.rank is not None:
        return None
    if device_fields(tensor.op.device, gpu_device.gpu_visible())["device"].startswith("GPU"):  # cuDNN's workspace
        return None
    rank = unbound_rank(tensor.op.type, tensor.value_index, on_gpu=False)
    return None if rank is None else np.zeros((0,) * rank, tensor.dtype.as_numpy_dtype)


def with_unread(graph: Graph, tensors: list[tf.Tensor]) -> Graph:
    """`graph` with one PARAMETER per tensor after its own (in order; nothing reads them), `UNREAD_KEY` set."""
    if not tensors:
        return graph
    nodes = list(graph.nodes)
    taken = {str(n.attrs.get("name", n.name)) for n in graph.parameters}
    for tensor in tensors:
        dtype, shape = ir_dtype(tensor.dtype), input_shape(tensor)
        if dtype is None or shape is None:
            raise UnmappableError(
                f"{tensor.name} ({tensor.dtype.name}, shape {tensor.shape}) cannot be a cluster input"
            )
        name = _unique(tensor.name, taken)
        nodes.append(Node(len(nodes), Op.PARAMETER, (), shape, dtype, name, Attrs(name=name)))
    metadata = {**graph.metadata, UNREAD_KEY: len(tensors)}
    try:
        return Graph.create(nodes, graph.output_map, metadata)
    except IRError as err:
        raise UnmappableError(f"cluster graph with its unread inputs is malformed: {err}") from None


def _unique(name: str, taken: set[str]) -> str:
    candidate, suffix = name, 1
    while candidate in taken:
        suffix += 1
        candidate = f"{name}_{suffix}"
    taken.add(candidate)
    return candidate


def check_device_specific(outputs: list[tf.Tensor], gpu_visible: Callable[[], bool]) -> None:
    """UnmappableError when the cluster would hand an outside op a batch-norm reserve space on a GPU.

    The IR computes the reserve spaces as TF's CPU kernel does (batch mean, biased variance); on a GPU
    TF's forward keeps cuDNN's (an inverse standard deviation) and TF's gradient reads them as such, so
    stitched values there would be silently wrong. On the CPU they are exactly TF's.
    """
    for tensor in outputs:
        if tensor.value_index not in DEVICE_SPECIFIC.get(tensor.op.type, ()):
            continue
        if device_fields(tensor.op.device, gpu_visible())["device"].startswith("GPU"):
            raise UnmappableError(
                f"outputs {tensor.name}, a batch-norm reserve space: on a GPU TF's gradient reads cuDNN's "
                "content there (an inverse standard deviation), not the IR's variance"
            )


def writes_read_state(late: list[tf.Operation], inputs: list[tf.Tensor]) -> bool:
    """Whether a stateful op of `late` writes a resource (a variable) that an op upstream of the cluster's
    `inputs` reads, while nothing but the control edge being dropped orders it after that read.

    `late`: the stateful ops that would no longer wait for the cluster once a stateless op's control
    edge to it is dropped. TF's gradient code gates an op's gradients (`tuple`'s group_deps) and so
    orders whole parts of the backward pass after a cluster; the values they compute never depend on
    that edge, only the order of reads and writes of state does: a write must stay after the reads
    the cluster's inputs come from, unless it reads (through data) what those reads produced anyway.
    """
    written = {s.name: _handles(s) for s in late}
    every = set().union(*written.values()) if written else set()
    if not every:
        return False
    reads = [op for op in upstream([t.op for t in inputs], control=True).values() if _handles(op) & every]
    late_names = set(written)
    for writer in late:
        before = {r.name for r in reads if r.name not in late_names and _handles(r) & written[writer.name]}
        if before and not before <= set(upstream([writer], control=False)):
            return True
    return False


def _handles(op: Any) -> set[str]:
    """The resource tensors (variable handles) an op takes."""
    return {t.name for t in op.inputs if t.dtype.name == "resource"}
