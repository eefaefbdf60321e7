"""The stitched twin: a copy of the graph downstream of the clusters, where stitching is installed.

Input: the TF graph (before it is finalized) and the mapped `Site`s. The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2

from stitchfleet.plugin.graph.mapping import Site
from stitchfleet.plugin.graph.op_graph import downstream, upstream
from stitchfleet.plugin.graph.random_streams import SharingError, owns_stream, share
from stitchfleet.plugin.graph.twin_mark import PREFIX
from stitchfleet.plugin.graph.twin_runs import UNPREPARED, PreparedRuns

Feeds = Mapping[object, object]  # a session.run feed_dict: tensors (or their names) -> values

# Errors of the data or the session, not of the copy: a diverted run that raises one is not run again.
PROPAGATED = (tf.errors.OutOfRangeError, tf.errors.CancelledError, tf.errors.AbortedError)
log = logging.getLogger("stitchfleet.plugin")
WHILE_V1 = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "LoopCond"})
COLOCATION = "_class"
DIVERTS_SEEN = 64  # (fetched ops, feed keys) answers `Twin.diverts` remembers; more are worked out each run


class TwinError(ValueError):
    """The copy cannot be built; the message is the reason recorded for the job."""


class NotRunnableError(TwinError):
    """A run the copy cannot take with its feeds, found before anything ran (nothing ran twice)."""


def _name(text: str) -> str:
    """The op name an input string of a NodeDef refers to ('^op', 'op', 'op:1')."""
    return text.lstrip("^").split(":", 1)[0]


def _shared_state(op: Any) -> bool:
    """State every path must share: an op without data inputs that holds state (variables, queues)."""
    return not op.inputs and op.op_def is not None and bool(op.op_def.is_stateful)


def _shared(op: Any) -> bool:
    """Never copied: shared state, and random ops whose stream lives in their kernel."""
    return _shared_state(op) or owns_stream(op)


def _outermost_loop(op: Any) -> Any:
    context, found = op._get_control_flow_context(), None
    while context is not None:
        if context.IsWhileContext():
            found = context
        context = context.outer_context
    return found


def _loop_ops(graph: Any, members: set[str]) -> set[str]:
    """Every op of each TF1 while loop that has an op among `members` (its frame is copied whole)."""
    loops = set()
    for name in members:
        op = graph.get_operation_by_name(name)
        loop = _outermost_loop(op)
        if loop is not None:
            loops.add(loop.name)
        elif op.type in WHILE_V1:
            raise TwinError(f"TF1 while-loop op {op.name!r} depends on a cluster and its loop is unknown")
    if not loops:
        return set()
    return {
        op.name
        for op in graph.get_operations()
        if (loop := _outermost_loop(op)) is not None and loop.name in loops and not _shared_state(op)
    }


def _downstream(graph: Any, seeds: Iterable[Any]) -> set[str]:
    """The ops that depend on `seeds` (included) through data and control edges, loops closed."""
    members: set[str] = set()
    stack = list(seeds)
    while True:
        members |= set(downstream(stack, skip=_shared, known=members))
        extra = _loop_ops(graph, members) - members
        if not extra:
            return members
        stack = [graph.get_operation_by_name(name) for name in extra]


def _copy_def(graph: Any, members: set[str]) -> tuple[Any, dict[str, Any], dict[str, list[bytes]], dict[str, Any]]:
    """The members as a GraphDef, what their inputs from shared ops map to, colocations with shared ops,
    and the shared ops each member waits for (control edges, set on the copy after import)."""
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(graph.graph_def_versions)
    input_map: dict[str, Any] = {}
    colocated: dict[str, list[bytes]] = {}
    waiting: dict[str, Any] = {}
    for op in graph.get_operations():
        if op.name not in members:
            continue
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        # import_graph_def maps tensors only (an Operation in input_map raises TypeError): a control edge
        # from a shared op (Keras' moving-average updates, which the train op waits for) is set after import
        waits = [text for text in node.input if text.startswith("^") and _name(text) not in members]
        if waits:
            kept = [text for text in node.input if text not in waits]
            del node.input[:]
            node.input.extend(kept)
            waiting[op.name] = [graph.get_operation_by_name(text[1:]) for text in waits]
        for text in node.input:
            if _name(text) not in members and not text.startswith("^"):
                key = text if ":" in text else f"{text}:0"
                input_map[key] = graph.get_tensor_by_name(key)
        if COLOCATION in node.attr:
            groups = list(node.attr[COLOCATION].list.s)
            outside = [g for g in groups if g.decode().removeprefix("loc:@") not in members]
            if outside:
                # The importer would look for the shared op under the copy's prefix: set after import.
                colocated[op.name] = outside
                inside = [g for g in groups if g not in outside]
                del node.attr[COLOCATION].list.s[:]
                node.attr[COLOCATION].list.s.extend(inside)
                if not inside:
                    del node.attr[COLOCATION]
    return graph_def, input_map, colocated, waiting


class Twin:
    """The copy (see the module docstring) and the mapping of original names onto it."""

    def __init__(self, graph: tf.Graph, members: frozenset[str]) -> None:
        self.graph = graph
        self.members = members
        self._runnable: dict[tuple[tuple[str, ...], frozenset[str]], bool] = {}
        self._diverts: dict[tuple[int, ...], tuple[Sequence[Any], tuple[object, ...], bool]] = {}  # see `diverts`
        # copy op of a mapped cluster -> the ops producing every input of that cluster (see `runnable`)
        self.cluster_reads: dict[str, list[Any]] = {}

    def op_name(self, name: str) -> str:
        return f"{PREFIX}/{name}" if name in self.members else name

    def tensor(self, tensor: tf.Tensor) -> tf.Tensor:
        """What carries `tensor`'s value on the copy (itself when it is shared)."""
        if tensor.op.name not in self.members:
            return tensor
        return self.graph.get_tensor_by_name(f"{PREFIX}/{tensor.name}")

    def op(self, op: tf.Operation) -> tf.Operation:
        return self.graph.get_operation_by_name(self.op_name(op.name)) if op.name in self.members else op

    def element(self, element: tf.Tensor | tf.Operation) -> tf.Tensor | tf.Operation:
        """A fetched graph element (tensor or op) on the copy."""
        return self.op(element) if isinstance(element, tf.Operation) else self.tensor(element)

    def site(self, site: Site) -> Site:
        """`site` moved onto the copy: the rewrite then installs its cluster there."""
        ops = self.op
        folded = {self._tensor_name(name): value for name, value in site.folded.items()}
        return replace(
            site,
            inputs=[self.tensor(t) for t in site.inputs],
            outputs=[self.tensor(t) for t in site.outputs],
            internal=[ops(op) for op in site.internal],
            folded=folded,
            varying=frozenset(self._tensor_name(name) for name in site.varying),
            shape_readers=[ops(op) for op in site.shape_readers],
            control_readers=[ops(op) for op in site.control_readers],
            ordering_readers=[ops(op) for op in site.ordering_readers],
        )

    def _tensor_name(self, name: str) -> str:
        return f"{PREFIX}/{name}" if _name(name) in self.members else name

    def diverts(self, feed_dict: Feeds | None, fetched: Sequence[tf.Tensor | tf.Operation] | None = None) -> bool:
        """False when the run feeds a tensor the copy computes (a fed intermediate value that a stitched
        cluster would not see), or when the copy would need a placeholder the run does not feed: a
        cluster joins independent regions (remote stitching), so the copy of a GAN's generator step also
        computes the discriminator's real-data branch and reads its placeholder, which that step never
        feeds. Such a run stays on the original graph (before: it failed on the copy, ran again as
        written, and reverted the whole job). `fetched`: the run's fetched graph elements, when known."""
        if fetched is None:
            return self._fed(feed_dict) is not None
        # Asked every step with the same fetched ops (`TrainingSteps.fetched`: one list per fetch structure) and
        # feed keys: answered by their identity (held, so their ids stay theirs), not by a walk and names each step.
        keys = tuple(feed_dict or ())
        memo = (id(fetched), *map(id, keys))
        known = self._diverts.get(memo)
        if known is not None and known[0] is fetched:
            return known[2]
        fed = self._fed(feed_dict)
        found = fed is not None and self.runnable(fetched, fed)
        if len(self._diverts) < DIVERTS_SEEN:
            self._diverts[memo] = (fetched, keys, found)
        return found

    def _fed(self, feed_dict: Any) -> list[Any] | None:
        """The fed tensors, or None when one of them is computed by the copy."""
        fed: list[Any] = []
        for key in feed_dict or ():
            tensor = key if isinstance(key, tf.Tensor) else None
            if isinstance(key, str):
                tensor = self.graph.as_graph_element(key, allow_tensor=True, allow_operation=False)
            if tensor is not None and tensor.op.name in self.members:
                return None
            if tensor is not None:
                fed.append(tensor)
        return fed

    def runnable(self, elements: Sequence[tf.Tensor | tf.Operation], fed: Sequence[tf.Tensor]) -> bool:
        """Whether the copy's stand-ins for `elements` need no placeholder beyond the `fed` ones and those the
        original run needs itself; answered once per (elements, fed tensors): a lookup a step after that."""
        key = (tuple(e.name for e in elements), frozenset(t.name for t in fed))
        if key not in self._runnable:
            fed_ops = {t.op.name for t in fed}
            # Every mapped cluster counts as one op reading all its inputs, its kernel installed on this rank
            # or not: the answer depends on the graph alone, so Horovod ranks whose compiles differ count
            # the same runs as training steps (a rank that declined a run the other took would pair the
            # ranks' collectives on different runs).
            copied = _unfed_placeholders([self.element(e) for e in elements], fed_ops, self.cluster_reads)
            own = _unfed_placeholders(elements, fed_ops) if copied else set()
            self._runnable[key] = not copied - own
            if copied - own:
                names = ", ".join(sorted(copied - own))
                log.warning(
                    "stitchfleet: a training run stays unstitched: its stitched copy would read %s, unfed", names
                )
        return self._runnable[key]

    def run(
        self,
        run: Callable[..., object],
        fetches: object,
        feed_dict: Feeds | None,
        options: tf.compat.v1.RunOptions | None,
        run_metadata: tf.compat.v1.RunMetadata | None,
    ) -> object:
        """`run(fetches, feed_dict, ...)` on the copy, its results in `fetches`' own structure (TF's fetch
        mapper flattens the fetches and rebuilds the results, as `Session.run` itself does)."""
        from tensorflow.python.client import session as tf_session

        with self.graph.as_default():
            mapper = tf_session._FetchMapper.for_fetch(fetches)
        elements = mapper.unique_fetches()
        fed = self._fed(feed_dict)
        if fed is None or not self.runnable(elements, fed):  # the hook's own fetches included: decline, never fail
            raise NotRunnableError("the stitched copy cannot take this run with its feeds; it runs as written")
        flat = [self.element(x) for x in elements]
        values = run(flat, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
        return mapper.build_results(values)


class Diverter:
    """Sends one `session.run` of one session onto the copy, when armed.

    A `SessionRunHook` cannot change the fetches of the run it joins, so the raw session that
    `MonitoredSession` wraps gets a `run` that maps the run's fetches (the caller's and every
    hook's) onto the copy when the hook armed it for this step, and calls the session's own
    `run` untouched otherwise. Feeds are never changed (a feed into the copy is refused before:
    `Twin.diverts`). Arming holds for the arming thread's next run only: another thread's run of
    the same session (an eval thread, say) is never diverted, nor does it use up the arming.

    A diverted run that fails (the copy cannot be built into an executor, an op of it fails where
    the original would not) never fails the job: the error is kept in `failure` (the hook reverts
    stitching for the job) and the run is made again as the user wrote it, without the owner's
    fetches on the copy (its `shared` ones, such as Horovod's consensus, stay, so every rank
    still joins the collective). The failed run may have applied some variable updates before its
    error, which the run made again applies once more: one perturbed step, never a failed job.
    Errors about the data or the session (end of input, a cancelled or aborted session) are not
    the copy's doing and propagate as they would without it.
    """

    def __init__(self, twin: Twin, owner: object = None, shared: Sequence[str] = ()) -> None:
        self.twin = twin
        self.owner, self.shared = owner, tuple(shared)
        self.session: Any = None
        self.failure: Exception | None = None
        self._thread: int | None = None  # the thread whose next run goes to the copy
        self._run: Callable[..., Any] | None = None  # the `run` set on the attached session
        self.unprepared = 0  # diverted runs a prepared session left to `Twin.run` (TF's fetch handling each time)

    @property
    def armed(self) -> bool:
        return self._thread is not None

    @armed.setter
    def armed(self, on: bool) -> None:
        """Arms (or disarms) this thread's next run onto the copy. A step on the user's graph is not armed: it runs
        TF's own path, as plain TF's step does, so the saving booked against it is what the job saves against plain
        TF (docs/plugin/graph.md, `twin_runs`)."""
        self._thread = threading.get_ident() if on else None

    def attach(self, session: tf.compat.v1.Session) -> None:
        own = session.run
        twin = self.twin
        # A step's run structure repeats: prepared once, TF's fetch handling is not rebuilt every step (twin_runs)
        takes = PreparedRuns.takes(session, own)
        prepared = PreparedRuns(twin, session) if takes else None

        def run(fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
            if self._thread is None or self._thread != threading.get_ident():
                return own(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
            self._thread = None
            try:
                done = prepared.run(fetches, feed_dict, options, run_metadata) if prepared is not None else UNPREPARED
                if done is not UNPREPARED:
                    return done
                if prepared is not None:
                    self._unprepared(fetches, feed_dict)
                return twin.run(own, fetches, feed_dict, options, run_metadata)
            except PROPAGATED:
                raise
            except NotRunnableError as err:  # declined before anything ran: no traceback, the step runs once
                self.failure = err
                log.warning("stitchfleet: %s", err)
                return own(self._plain(fetches), feed_dict=feed_dict, options=options, run_metadata=run_metadata)
            except Exception as err:
                self.failure = err
                log.exception("stitchfleet: a step failed on the stitched twin; it runs again as written")
                return own(self._plain(fetches), feed_dict=feed_dict, options=options, run_metadata=run_metadata)

        session.run = self._run = run
        self.session = session

    def _unprepared(self, fetches: Any, feed_dict: Any) -> None:
        """Counts a diverted run the prepared path left to TF's own fetch handling; says so once a job (a step
        that repeats it pays ~0.2 ms each time: session 22 found every stitched step of ab_jobs' jobs there)."""
        self.unprepared += 1
        if self.unprepared == 1:
            kinds = sorted({type(v).__name__ for v in (feed_dict or {}).values()})
            log.info(
                "stitchfleet: a stitched run takes TF's own fetch handling, not the prepared path (fetches %s, feed"
                " values %s: see docs/plugin/graph.md, twin_runs); a step that repeats it pays ~0.2 ms more",
                type(fetches).__name__,
                ", ".join(kinds) or "none",
            )

    def detach(self) -> None:
        """Gives the session its own `run` back (stitching is over for the job: no run goes to the copy, and
        a quiet step then pays no wrapper); a `run` someone set over ours stays."""
        session, self._thread = self.session, None
        if session is not None and vars(session).get("run") is self._run:
            del session.run
        self.session = self._run = None

    def _plain(self, fetches: Any) -> Any:
        """The run's fetches without the owner's fetches on the copy (its `shared` ones kept)."""
        if not isinstance(fetches, dict) or self.owner not in fetches:
            return fetches
        mine = fetches[self.owner]
        kept = {k: v for k, v in mine.items() if k in self.shared} if isinstance(mine, dict) else None
        plain = {k: v for k, v in fetches.items() if k is not self.owner}
        if kept:
            plain[self.owner] = kept
        return plain

    def diverts(
        self,
        session: tf.compat.v1.Session | None,
        feed_dict: Feeds | None,
        fetched: Sequence[tf.Tensor | tf.Operation] | None = None,
    ) -> bool:
        """Whether a run of `session` with these feeds and fetches can go to the copy: the attached session,
        no feed into the copy, no placeholder the copy would read unfed (`fetched`: the run's fetched elements)."""
        return session is not None and session is self.session and self.twin.diverts(feed_dict, fetched)


def _unfed_placeholders(
    roots: Iterable[Any], fed_ops: set[str], also_reads: Mapping[str, Sequence[Any]] | None = None
) -> set[str]:
    """The placeholders without a default that running `roots` (tensors or ops) would execute unfed: a walk
    over data and control inputs that stops at fed ops, as TF's own pruning of a run does; `also_reads`
    adds the ops an op's run needs beyond its inputs (a cluster's stitched op reads all of its inputs)."""
    ops = [root if isinstance(root, tf.Operation) else root.op for root in roots]
    return {name for name, op in upstream(ops, stop=fed_ops, also=also_reads).items() if op.type == "Placeholder"}


def build(graph: tf.Graph, sites: Sequence[Site]) -> Twin:
    """Copies the ops downstream of `sites` (see the module docstring); the graph must not be finalized."""
    members = _downstream(graph, [op for site in sites for op in site.internal])
    if not members:
        raise TwinError("no op depends on a cluster")
    drawing = sorted(name for name in members if owns_stream(graph.get_operation_by_name(name)))
    if drawing:  # only a copied TF1 while loop brings one in
        raise TwinError(f"random op {drawing[0]!r} is inside a TF1 while loop that depends on a cluster")
    try:
        share(graph, members, next((site.oracle for site in sites if site.oracle is not None), None))
    except SharingError as err:
        raise TwinError(str(err)) from None
    graph_def, input_map, colocated, waiting = _copy_def(graph, members)
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, input_map=input_map, name=PREFIX)
    for name, shared in waiting.items():
        graph.get_operation_by_name(f"{PREFIX}/{name}")._add_control_inputs(shared)
    for name, outside in colocated.items():
        copy = graph.get_operation_by_name(f"{PREFIX}/{name}")
        inside = [g for g in copy.colocation_groups() if g != b"loc:@" + copy.name.encode()]
        groups = attr_value_pb2.AttrValue.ListValue(s=inside + outside)
        copy._set_attr(COLOCATION, attr_value_pb2.AttrValue(list=groups))
    twin = Twin(graph, frozenset(members))
    for site in sites:  # every mapped cluster, compiled or not: the same on every rank
        moved = twin.site(site)
        reads = [t.op for t in moved.inputs]
        for op in moved.internal:
            twin.cluster_reads[op.name] = reads
    return twin
