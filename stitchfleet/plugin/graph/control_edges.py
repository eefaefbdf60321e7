"""Whether an outside TF op that waits for a cluster's ops (a control edge) only orders itself after them.

Input: Output: the ops downstream of given ops through data edges (`data_descendants`), whether an op's effect
depends on when it runs (`stateful`), and whether dropping a stateless op's control edges to the cluster
changes no value (`only_orders`). The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stitchfleet.plugin.graph import cluster_ops
from stitchfleet.plugin.graph.op_graph import downstream

if TYPE_CHECKING:
    import tensorflow as tf


def data_descendants(ops: list[tf.Operation]) -> set[str]:
    """The ops that read, through data edges, what `ops` compute: they run after them whatever the edges."""
    return set(downstream([r for op in ops for t in op.outputs for r in t.consumers()], control=False))


def only_orders(op: tf.Operation, after: set[str], inputs: list[tf.Tensor]) -> bool:
    """Whether dropping stateless `op`'s control edges to the cluster changes no value (see `stateful`)."""
    late = [found for name, found in downstream([op], control=True).items() if stateful(found) and name not in after]
    return not cluster_ops.writes_read_state(late, inputs)


def stateful(op: tf.Operation) -> bool:
    """Whether an op's effect depends on when it runs.

    A stateless op's control edge only orders it (TF's gradient functions put the incoming gradient
    before Square_grad's and Erf_grad's ops to bound memory; `tuple` gates an op's gradients), and the
    stateful ops after it, which TF orders through it (`control_dependencies` skips ops whose inputs
    already wait). So the edge is dropped (values stay as they were; moving it onto the stitched op
    closed a cycle and kept the demo's clusters 6 and 7 off) unless a stateful op after that op, not
    reading the cluster's results through data anyway, writes a variable read upstream of the
    cluster's inputs (`cluster_ops.writes_read_state`): that write must stay after the read. (Before,
    every such stateful op had to read the cluster's results: ResNet50's gated BiasAdd gradients
    then ordered the next convolution's weight update after the cluster and 48 of its 118 clusters
    were refused as cycles.)
    """
    return bool(op.op_def.is_stateful) if op.op_def is not None else True
