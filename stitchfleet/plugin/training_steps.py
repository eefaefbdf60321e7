"""Which `session.run` calls are the job's training steps: the only ones the hook touches.

Input: the rewired graph (after `begin`), the ops that carry the stitched clusters' results, and,
per run, the user's own fetches (`run_context.original_args.fetches`). Output: `is_training(fetches)`.

The rule: a run is a training step when the ops it executes (everything its fetches depend on,
through data and control edges) include an update of a trainable variable (an optimizer's
`Apply*`/`ResourceApply*`, an assign to a trainable variable) that itself depends on a stitched
cluster, and include every stitched cluster. Such a run already computes every value the hook adds
(check tensors, loss) from the feeds the user gave it. Everything else (a global-step read, an
eval with other feeds, summaries, checkpoints, rank-0-only logging) runs exactly as the user
wrote it: no fetch or feed is added, and it is neither counted nor timed, so Horovod ranks pair
their decision steps on training steps only. The dependency walk runs once per distinct set of
fetched ops (a script has a few), then the answer is cached.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

# Op types that write a variable; for each, input 0 is the variable (a ref or a resource handle).
WRITER_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")
WRITER_TYPES = frozenset(
    {"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}
)


def _variable_ops(graph: Any) -> set[str]:
    """Names of the ops that hold the trainable variables (and the global step)."""
    names: set[str] = set()
    variables = list(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    step = tf.compat.v1.train.get_global_step(graph)
    for variable in [*variables, *([step] if step is not None else [])]:
        handle = getattr(variable, "handle", None)
        names.add(handle.op.name if handle is not None else variable.op.name)
    return names


def _writes_variable(op: Any, variables: set[str]) -> bool:
    if op.type not in WRITER_TYPES and not op.type.startswith(WRITER_PREFIXES):
        return False
    return bool(op.inputs) and op.inputs[0].op.name in variables


def _downstream(starts: Iterable[Any]) -> set[str]:
    """Names of every op that depends on one of `starts` (data or control), the starts included."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(consumer for out in op.outputs for consumer in out.consumers())
        todo.extend(op._control_outputs)
    return seen


def _upstream(starts: Iterable[Any]) -> set[str]:
    """Names of every op that `starts` depend on (data or control), the starts included."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(tensor.op for tensor in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def fetched_ops(graph: Any, fetches: Any) -> list[Any]:
    """The ops a `session.run` fetch structure names (nested lists, tuples, dicts; ops, tensors, names)."""
    found: list[Any] = []
    todo = [fetches]
    while todo:
        item = todo.pop()
        if item is None:
            continue
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, str):
            element = graph.as_graph_element(item, allow_tensor=True, allow_operation=True)
            found.append(element if isinstance(element, tf.Operation) else element.op)
        elif isinstance(item, tf.Operation):
            found.append(item)
        elif hasattr(item, "op") and isinstance(item.op, tf.Operation):
            found.append(item.op)
    return found


def training_path(graph: Any) -> frozenset[str]:
    """Names of the ops some trainable-variable update depends on: a cluster elsewhere (a metric, an
    eval-only head) would never run in a training step, so the hook leaves it to TF."""
    variables = _variable_ops(graph)
    return frozenset(_upstream(op for op in graph.get_operations() if _writes_variable(op, variables)))


class TrainingSteps:
    """Recognises the training step among a session's runs (see the module docstring)."""

    def __init__(self, graph: Any, stitched: Sequence[Sequence[Any]]) -> None:
        """`stitched`: per installed cluster, the ops that carry its results to the rest of the graph."""
        self.graph = graph
        self.clusters = [frozenset(op.name for op in ops) for ops in stitched]
        after = _downstream(op for ops in stitched for op in ops)
        variables = _variable_ops(graph)
        self.updates = frozenset(
            op.name for op in graph.get_operations() if op.name in after and _writes_variable(op, variables)
        )
        self._known: dict[frozenset[str], frozenset[str] | None] = {}
        self.reached: frozenset[str] = frozenset()  # the ops the last training step runs

    def is_training(self, fetches: Any) -> bool:
        """True when a run with these fetches is a training step; a fetch this graph cannot name is not."""
        try:
            ops = fetched_ops(self.graph, fetches)
        except (KeyError, ValueError, TypeError):
            return False
        key = frozenset(op.name for op in ops)
        if key not in self._known:
            reached = frozenset(_upstream(ops))
            every = all(not cluster.isdisjoint(reached) for cluster in self.clusters)
            training = bool(self.clusters) and every and not self.updates.isdisjoint(reached)
            self._known[key] = reached if training else None
        found = self._known[key]
        if found is None:
            return False
        self.reached = found
        return True
