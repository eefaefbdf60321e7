"""Which `session.run` calls are the job's training steps: the only ones the hook touches.

Input: the user's graph, the ops of the stitched clusters in it, and, per run, the user's own fetches
(`run_context.original_args.fetches`). Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any, cast

import tensorflow as tf

from stitchfleet.plugin.graph.op_graph import ancestors, upstream

# Op types that write a variable; for each, input 0 is the variable (a ref or a resource handle).
# Scatter*: SGD's sparse update of a TF1 variable (an embedding's IndexedSlices gradient): word2vec's every
# update is one, and its training step went unrecognised (nothing stitched, nothing booked).
WRITER_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply", "Scatter", "ResourceScatter")
WRITER_TYPES = frozenset(
    {"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}
)


def _holder(variable: Any) -> str:
    """The name of the op that holds a variable (its resource handle's op, or the ref variable's own)."""
    handle = getattr(variable, "handle", None)
    return str(handle.op.name if handle is not None else variable.op.name)


def _updates(graph: Any) -> tuple[frozenset[str], list[Any]]:
    """Names of the ops that hold what a training step updates, and the ops that write them (in the graph's
    order). What is updated: the trainable variables, the global step, and the global variables an update of a
    trainable variable reads. The last are a job's gradient accumulators (it sums its gradients into variables
    over several runs and applies them every N runs): without them, the runs that compute the gradients were not
    training steps and their clusters were 'not on the training path', so such a job was never stitched.
    Streaming metrics (local variables), moving averages and exponential averages of the weights are read by no
    update: their runs stay side runs. A setup asks three times (the hook's `TrainingSteps`, the compile's held
    ops, the selection's training path), each a scan and a walk of the graph: answered once per graph while no
    op and no variable is added (`_UPDATES`)."""
    step = tf.compat.v1.train.get_global_step(graph)
    trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    key = (graph.version, *map(id, trainable), None, *map(id, variables), None, id(step))
    known = _UPDATES.get(graph)
    if known is not None and known[0] == key:
        return known[1], known[2]
    names = {_holder(variable) for variable in [*trainable, *([step] if step is not None else [])]}
    held = {_holder(variable) for variable in variables}
    writers = [op for op in graph.get_operations() if _writes_variable(op, names)]
    found = frozenset(names | (held & set(upstream(writers, control=False))))
    written = [op for op in graph.get_operations() if _writes_variable(op, found)]
    # the variables are kept with their ids: none is freed while its entry stands, so no id is another's
    _UPDATES[graph] = (key, found, written, [*trainable, *variables, step])
    return found, written


# Per graph: (its op count and variables' ids, what is updated, its writers, the variables). Weak: it goes with
# its graph.
_UPDATES: weakref.WeakKeyDictionary[tf.Graph, tuple[tuple[int | None, ...], frozenset[str], list[Any], list[Any]]]
_UPDATES = weakref.WeakKeyDictionary()


def _writes_variable(op: Any, variables: AbstractSet[str]) -> bool:
    if op.type not in WRITER_TYPES and not op.type.startswith(WRITER_PREFIXES):
        return False
    return bool(op.inputs) and op.inputs[0].op.name in variables


SEEN = 64  # fetch lists remembered by identity (`TrainingSteps.updates_variables`); more are walked each run
RESTORES = frozenset({"RestoreV2", "Restore", "RestoreSlice"})


def _initializers(graph: Any) -> set[str]:
    """Names of the variables' initializer ops (their first assignment, which every graph with variables has)."""
    found: set[str] = set()
    for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        initializer = getattr(variable, "initializer", None)
        if initializer is not None:
            found.add(initializer.name)
    return found


def _initializes_or_restores(op: Any, initializers: set[str]) -> bool:
    """Whether a variable write is an initializer, or a checkpoint restore (its value read by a Restore op)."""
    if op.name in initializers:
        return True
    if len(op.inputs) < 2:
        return False
    source = op.inputs[1].op
    while source.type == "Identity" and source.inputs:
        source = source.inputs[0].op
    return bool(source.type in RESTORES)


def fetched_ops(graph: tf.Graph, fetches: object) -> list[tf.Operation]:
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


def named_alike(item: object) -> bool:
    """Whether a fetched item names the same ops whenever it is the same object: a tensor, an op, or what stands for
    an op's output (`assign_add` on a resource variable gives an `_UnreadVariable`: a job's step counter, fetched
    every step, was walked anew every step). A list or dict is not: its contents may change between runs."""
    return isinstance(item, (tf.Tensor, tf.Operation)) or isinstance(getattr(item, "op", None), tf.Operation)


def find_loss(graph: tf.Graph, given: tf.Tensor | None = None) -> tf.Tensor | None:
    """The job's loss tensor: `given`, else the last of the graph's LOSSES collection, else `loss:0`, else None."""
    if given is not None:
        return given
    losses = graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)
    if losses:
        return losses[-1]
    try:
        return graph.get_tensor_by_name("loss:0")
    except KeyError:
        return None


def training_path(graph: tf.Graph) -> frozenset[str]:
    """Names of the ops some trainable-variable update depends on: a cluster elsewhere (a metric, an
    eval-only head) would never run in a training step, so the hook leaves it to TF."""
    return frozenset(ancestors(_updates(graph)[1]))


def data_path(graph: tf.Graph) -> frozenset[str]:
    """Names of the ops some trainable-variable update reads through data edges alone: what grappler keeps
    of a training step's values. A reader tied to the updates by control edges only (the gradient of a
    product by a constant, held by its `tuple` group) does not stop the remapper's fusions (checked with
    TF 2.15: `_MklFusedBatchMatMulV2` for BatchMatMul*const+mask in a training graph)."""
    return frozenset(upstream(_updates(graph)[1], control=False))


def update_path(graph: tf.Graph) -> frozenset[str]:
    """Names of the ops some write of any variable reads through data edges (trainable or not: moving averages,
    metrics, accumulators, the global step). What no write reads is at most fetched or tied to the step by control
    edges (tf.gradients' halves for constants, the `tuple` groups): grappler prunes it from plain TF's step, where a
    cluster holding it would compute it every step (`frontend.pruned_ops`)."""
    writers = [op for op in graph.get_operations() if _writes_some_variable(op)]
    return frozenset(upstream(writers, control=False))


def step_values(graph: tf.Graph) -> frozenset[str]:
    """Names of the ops whose values a training step may use: what a variable write reads (`update_path`) and what
    an op nothing reads does (a fetch: the loss, a metric; a static-shape loss is read by no gradient), tf.gradients'
    `tuple` outputs aside: a gradient for a constant operand, which grappler prunes (`mapping.keep_outputs`)."""
    ends = [op for op in graph.get_operations() if _writes_some_variable(op) or _fetchable(op)]
    return frozenset(upstream(ends, control=False))


def _fetchable(op: Any) -> bool:
    unread = bool(op.outputs) and not any(t.consumers() for t in op.outputs)
    return unread and not (op.type == "Identity" and "/tuple/control_dependency" in op.name)


def _writes_some_variable(op: Any) -> bool:
    """A writer's type with an input 0 (its variable, whichever): more ops count than `_writes_variable`'s, so more
    stay on the path; what stays is only not held, never computed twice."""
    return (op.type in WRITER_TYPES or op.type.startswith(WRITER_PREFIXES)) and bool(op.inputs)


class TrainingSteps:
    """Recognises the training step among a session's runs (see the module docstring)."""

    def __init__(self, graph: tf.Graph) -> None:
        self.graph = graph
        writers = _updates(graph)[1]
        self.updates = frozenset(op.name for op in writers)
        # Whether any run of this graph can train: a write that neither initializes nor restores a variable
        # (an evaluate or predict graph has only those). Decided from the graph alone: every rank alike.
        initializers = _initializers(graph)
        self.training_updates = frozenset(op.name for op in writers if not _initializes_or_restores(op, initializers))
        self.trains = bool(self.training_updates)
        self.clusters: list[frozenset[str]] = []
        self._known: dict[frozenset[Any], frozenset[str]] = {}
        # A job's step fetches the same tensors and ops every run (in a new list each time): known by their
        # identity, the walk of the fetch structure is skipped (a Python loop of TF calls, every step).
        self._seen: dict[tuple[int, ...], tuple[tuple[Any, ...], list[Any], frozenset[str], bool]] = {}
        # Per thread, its last run's walk: another thread's run of a shared session (an eval thread) must not
        # change what a training step in flight reads between `updates_variables` and the hook's use of it.
        self._last = threading.local()
        # Per reached set, whether it runs every required cluster: fixed until `require` changes the clusters,
        # and asked every step (a walk over every cluster's op names). A frozenset keeps its hash, and the
        # step's reached set is the very object stored, so the lookup is an identity check.
        self._covers: dict[frozenset[str], bool] = {}

    @property
    def reached(self) -> frozenset[str]:
        """The ops this thread's last run executes."""
        return getattr(self._last, "reached", frozenset())

    @property
    def fetched(self) -> list[tf.Operation]:
        """The ops this thread's last run asked for (whose walk `reached` is)."""
        return getattr(self._last, "fetched", [])

    def require(self, stitched: Sequence[Sequence[tf.Operation]]) -> None:
        """From now on a training step must also run every cluster of `stitched` (per cluster, the ops
        that carry its results to the rest of the graph)."""
        self.clusters = [frozenset(op.name for op in ops) for ops in stitched]
        self._covers = {}  # answers for the clusters before: a reverted cluster no longer needs to run

    def updates_variables(self, fetches: object) -> bool:
        """True when a run with these fetches updates a trainable variable (the rule every Horovod rank
        applies alike, whatever it compiled); a fetch this graph cannot name is not."""
        # a list or tuple itself (not a namedtuple or another subclass: fetched_ops reads those whole)
        items: Sequence[object] = cast("Sequence[object]", fetches) if type(fetches) in (list, tuple) else (fetches,)
        identity = tuple(map(id, items))
        seen = self._seen.get(identity)
        if seen is not None and all(map(operator.is_, items, seen[0])):  # the very tensors and ops of a past run
            self._last.fetched, self._last.reached = seen[1], seen[2]
            return seen[3]
        try:
            ops = fetched_ops(self.graph, fetches)
        except (KeyError, ValueError, TypeError):
            return False
        key = frozenset(ops)  # the ops themselves (one graph): their names cost a TF call each, every step
        reached = self._known.get(key)
        if reached is None:
            reached = self._known[key] = frozenset(ancestors(ops))
        self._last.fetched, self._last.reached = ops, reached
        updates = not self.updates.isdisjoint(reached)
        if len(self._seen) < SEEN and all(map(named_alike, items)):
            self._seen[identity] = (tuple(items), ops, reached, updates)  # held: their ids stay theirs
        return updates

    def trains_in(self, fetches: object) -> bool:
        """True when a run with these fetches updates a variable other than by initializing or restoring it
        (the run `updates_variables` walked last on this thread)."""
        return self.updates_variables(fetches) and not self.training_updates.isdisjoint(self.reached)

    def is_training(self, fetches: object) -> bool:
        """True when a run with these fetches is a training step (updates a variable, runs every cluster)."""
        if not self.updates_variables(fetches):
            return False
        reached = self.reached
        covers = self._covers.get(reached)
        if covers is None:
            clusters = self.clusters
            covers = bool(clusters) and all(not cluster.isdisjoint(reached) for cluster in clusters)
            if len(self._covers) < SEEN:
                self._covers[reached] = covers
        return covers
