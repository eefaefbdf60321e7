"""How a split reduction combines across blocks: per-task partials and a finalize loop, or atomics.

Input: the cluster graph, a reduction group whose mapping combines several blocks'
results (task splitting, column tiles over row splits), and the planning options.
Output: the `Combine` kind and its reason (recorded as a `Choice` of the plan).

Partials (the default of AStitch's global scheme) cost two grid barriers before a
consumer may read the value: one before the finalize loop folds the partials, one
after it. An atomic add into the exported value itself needs only the barrier the
consumers wait for anyway, and no partials buffer or finalize loop; it applies when
the accumulated sum *is* the value: a SUM (or MEAN, each block adding its share
already divided) accumulated in the value's own dtype, with no cluster output and
no tail op to finish (reshapes aside: same values, same flat index), exported as one
value into global scratch that the runtime zeroes before each
launch (so one kernel: split plans keep values in launch-persistent buffers).
MAX and MIN stay on partials: their identity is not the zero scratch starts at.
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Graph, Op
from stitchfleet.compiler.plan.model import Combine, Group
from stitchfleet.compiler.plan.structure import accumulator

_SUMS = frozenset({Op.REDUCE_SUM, Op.REDUCE_MEAN})


def combine_choice(graph: Graph, group: Group, *, one_kernel: bool, deterministic: bool) -> tuple[Combine, str]:
    """The combine of a group whose mapping combines several blocks' results, and why."""
    node = graph.node(group.dominant)
    refusal = _refusal(node.op, node.dtype == accumulator(node.dtype), one_kernel, deterministic)
    if not refusal and node.op is Op.REDUCE_MEAN and not node.dtype.is_float:
        refusal = "an integer mean's shares, divided apart, round differently from the whole"
    if not refusal:
        refusal = _unfinished(graph, group)
    if refusal:
        return Combine.PARTIALS, f"partials + finalize loop: {refusal}"
    why = f"atomic add of each block's {node.op.value.lower()} share into the value"
    return Combine.ATOMIC, why + ": ready after one grid barrier, no partials buffer or finalize loop"


def _refusal(op: Op, same_dtype: bool, one_kernel: bool, deterministic: bool) -> str:
    if deterministic:
        return "deterministic results asked for (atomic float adds vary in order run to run)"
    if op not in _SUMS:
        return f"{op.value.lower()} has no atomic path (its identity is not the zero scratch starts at)"
    if not same_dtype:
        return "accumulates in a wider dtype than the value (the rounding needs a pass of its own)"
    if not one_kernel:
        return "one kernel per stage: the value lives in a buffer that is not zeroed per launch"
    return ""


def _unfinished(graph: Graph, group: Group) -> str:
    """What a finalize pass would still have to do after the combine ("" when nothing)."""
    if group.outputs:
        return "a cluster output needs one writer per value after the combine"
    if any(graph.node(t).op is not Op.RESHAPE for t in group.tail):
        return "tail ops need the combined value (one writer per value after the combine)"
    if len(group.exports) != 1:
        return f"{len(group.exports)} exported values (an atomic add fills one)"
    return ""
