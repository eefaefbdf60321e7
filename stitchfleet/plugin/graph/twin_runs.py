"""The diverted run, prepared once per run structure: a training step's fetches and feed keys repeat every step.

Input: the session a `Diverter` is attached to (its own `run`, TF's), the copy (`Twin`), and per diverted run its
fetches, feed dict, options and run metadata. Output: the run's results in its fetches' own structure, as
`Session.run` gives them; or `UNPREPARED` for a run it does not take, before anything ran (`Twin.run` takes it).

Why: `Twin.run` built TF's fetch mapper of the run's fetches every step, then `Session.run` built a fetch handler
of the copy's elements (each resolved and checked) and resolved every feed key: 150-250 us of a stitched step on the
demo model (issue 29 item 6). Prepared once per (fetch structure, its graph elements, feed keys), a step converts
its feed values as `Session.run` does, runs the session's own `_do_run` (graph extension, run options, metadata and
error messages stay TF's) and puts the values in place.

Taken: fetches nested in dicts, lists and tuples (exactly those types) of tensors and ops of the copy's graph, and
variables as the tensor TF fetches for them (a global step's `assign_add` had left every step to the plain path);
feeds keyed by tensors, valued by numpy arrays, numpy scalars, Python bools, floats and ints their dtype holds
exactly; a fetched tensor that is also fed gets its fed value, as from TF. Anything else (names, namedtuples,
sparse tensors, tensor handles, an int TF's own check refuses, a value whose shape its placeholder refuses, a run
the copy declines) is left to the plain path, where TF raises what it raises and the copy declines what it declines.

The user's own graph is not prepared: a baseline step runs TF's path, as plain TF's step does, so what a stitched
step saves against it, the prepared run's share included, is what the job saves against plain TF (session 39).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import tensorflow as tf


class Copy(Protocol):
    """What a prepared run asks of the copy (`twin.Twin`, which holds the `PreparedRuns`: a protocol, not an
    import of it, so the two modules do not import each other)."""

    graph: tf.Graph

    def element(self, element: tf.Tensor | tf.Operation) -> tf.Tensor | tf.Operation: ...

    def _fed(self, feed_dict: Any) -> list[Any] | None: ...

    def runnable(self, elements: Sequence[tf.Tensor | tf.Operation], fed: Sequence[tf.Tensor]) -> bool: ...


UNPREPARED: object = object()  # `PreparedRuns.run`: not taken (a result can be None: a fetched op's)
LIMIT = 32  # run structures remembered per session (a job has a few: its step, check steps, warmup builds)
HANDLES = frozenset({"GetSessionHandle", "GetSessionHandleV2"})  # their values become TensorHandles: TF's path
CONTAINERS = (dict, list, tuple)  # exactly these types: a subclass (namedtuple, OrderedDict) is TF's to map
SCALARS = (bool, float)  # Python values TF feeds without a check of its own (`int`: an overflow check, `_holds`)


@dataclass(frozen=True)
class _Feed:
    """A feed key as `Session.run` resolves it: what `_do_run` takes, the dtype and the shape it checks."""

    ref: Any  # the tensor's `ref()`, the key of `_do_run`'s feed dict
    dtype: Any  # numpy dtype the value is converted to
    dims: tuple[int | None, ...] | None  # the placeholder's static shape (None: unknown rank)

    def value(self, given: object) -> np.ndarray[Any, Any] | None:
        """`given` as `Session.run` feeds it, or None when only TF's own path may take it (see the docstring)."""
        if type(given) is int:  # fed when its dtype holds it exactly: TF's own check (`Session._run`)
            if not self._holds(given):
                return None  # TF's own path raises its TypeError
        elif type(given) not in SCALARS and not isinstance(given, (np.ndarray, np.generic)):
            return None
        array = np.asarray(given, dtype=self.dtype)
        dims = self.dims
        if dims is None or array.shape == dims:  # an unknown rank, or the very shape: the usual feed
            return array
        if len(dims) != array.ndim:
            return None  # TF's own path raises its ValueError
        for d, s in zip(dims, array.shape, strict=True):
            if d is not None and d != s:
                return None
        return array

    def _holds(self, given: int) -> bool:
        """Whether the feed's dtype holds the Python int `given` exactly, as `Session._run` checks it."""
        kind = np.dtype(self.dtype)
        if kind.kind in "iu":
            limits = np.iinfo(kind)
            return int(limits.min) <= given <= int(limits.max)
        if kind.kind != "f":
            return False  # a string, complex or object feed: TF's own conversion
        try:
            return bool(kind.type(given) == given)  # a float dtype holds it exactly, or TF's check raises
        except OverflowError:
            return False


@dataclass(frozen=True)
class _Prepared:
    """One run structure: what `_do_run` fetches and runs, where each leaf's value is, the feeds' conversions."""

    leaves: tuple[Any, ...]  # the fetched tensors and ops, held: their ids in the cache key stay theirs
    keys: tuple[Any, ...]  # the feed keys, held likewise
    fetches: list[Any]  # the copy's tensors to fetch, each once
    targets: list[Any]  # the copy's ops to run, each once
    # per leaf, its value's index in the fetched values (None: an op, no value); a fed tensor's is -1 - its feed's
    # index: TF gives a fetched tensor that is also fed the fed value, converted, without computing it
    places: tuple[int | None, ...]
    feeds: tuple[_Feed, ...]  # per feed key, in the feed dict's order


class PreparedRuns:
    """The diverted runs of one session, prepared per run structure (see the module docstring)."""

    def __init__(self, twin: Copy, session: tf.compat.v1.Session) -> None:
        self.twin, self.session = twin, session
        self._known: dict[Hashable, _Prepared | None] = {}  # None: a structure left to the plain path

    @staticmethod
    def takes(session: object, own: object) -> bool:
        """Whether `session`'s runs can be prepared: a TF session whose `run` (`own`, before the diverter's)
        and its steps are TF's own, so that skipping to `_do_run` skips nothing of a subclass's."""
        from tensorflow.python.client import session as tf_session

        base, kind = tf_session.BaseSession, type(session)
        return (
            isinstance(session, base)
            and getattr(own, "__func__", None) is base.run
            and getattr(own, "__self__", None) is session
            and getattr(kind, "_run", None) is base._run
            and getattr(kind, "_do_run", None) is base._do_run
        )

    def run(
        self,
        fetches: object,
        feed_dict: Mapping[object, object] | None,
        options: tf.compat.v1.RunOptions | None,
        run_metadata: tf.compat.v1.RunMetadata | None,
    ) -> object:
        """The run on the copy, or `UNPREPARED` (nothing ran)."""
        leaves: list[Any] = []
        structure = _structure(fetches, leaves)
        if structure is None or not leaves or self.session._closed:
            return UNPREPARED
        feeds = feed_dict or {}
        key = (structure, tuple(map(id, leaves)), tuple(map(id, feeds)))
        if key in self._known:
            prepared = self._known[key]
        else:
            prepared = self._prepare(leaves, feeds)
            if len(self._known) < LIMIT:
                self._known[key] = prepared
        if prepared is None:
            return UNPREPARED
        values, arrays = {}, []
        for feed, given in zip(prepared.feeds, feeds.values(), strict=True):
            array = feed.value(given)
            if array is None:
                return UNPREPARED
            values[feed.ref] = array
            arrays.append(array)
        fetched = self._do_run(prepared, values, options, run_metadata)
        results = [None if at is None else fetched[at] if at >= 0 else arrays[-1 - at] for at in prepared.places]
        return _rebuild(fetches, iter(results).__next__)

    def _do_run(self, prepared: _Prepared, feeds: dict[Any, Any], options: Any, run_metadata: Any) -> list[Any]:
        """`Session.run`'s own steps around `_do_run`: the options and metadata buffers (the same calls)."""
        from tensorflow.python.client import pywrap_tf_session as c_api
        from tensorflow.python.util import compat

        options_ptr = c_api.TF_NewBufferFromString(compat.as_bytes(options.SerializeToString())) if options else None
        metadata_ptr = c_api.TF_NewBuffer() if run_metadata else None
        try:
            fetched: list[Any] = self.session._do_run(
                None, prepared.targets, prepared.fetches, feeds, options_ptr, metadata_ptr
            )
            if run_metadata:
                run_metadata.ParseFromString(compat.as_bytes(c_api.TF_GetBuffer(metadata_ptr)))
        finally:
            if metadata_ptr:
                c_api.TF_DeleteBuffer(metadata_ptr)
            if options:
                c_api.TF_DeleteBuffer(options_ptr)
        return fetched

    def _prepare(self, leaves: list[Any], feeds: Mapping[object, object]) -> _Prepared | None:
        """The structure's run, or None when the plain path must take it (see the module docstring)."""
        twin, graph = self.twin, self.twin.graph
        if any(not isinstance(key, tf.Tensor) or key.graph is not graph or not graph.is_feedable(key) for key in feeds):
            return None
        fed = twin._fed(feeds)
        unique = list({id(leaf): leaf for leaf in leaves}.values())  # TF's unique fetches: `runnable`'s key
        if fed is None or not twin.runnable(unique, fed):
            return None  # the copy declines it: the plain path says so, every time, as before
        lists = self._lists(leaves, {id(tensor): at for at, tensor in enumerate(fed)})
        if lists is None:
            return None
        resolved = []
        for key in feeds:
            assert isinstance(key, tf.Tensor)
            shape = key.shape
            dims = tuple(shape.as_list()) if shape.rank is not None else None
            resolved.append(_Feed(key.ref(), key.dtype.as_numpy_dtype, dims))
        return _Prepared(tuple(leaves), tuple(feeds), *lists, tuple(resolved))

    def _lists(
        self, leaves: list[Any], fed: dict[int, int]
    ) -> tuple[list[Any], list[Any], tuple[int | None, ...]] | None:
        """The copy's tensors to fetch and ops to run, each once, and each leaf's place among the fetched values or
        the feeds (`fed`: a fed tensor's id -> its index among the feed keys; a check step fetches the placeholders
        its clusters read: session 23 found every check step of the demo left to TF's fetch handling, ~10 ms of
        Python for its ~300 fetches); None for a leaf TF's own path must take (another graph's, not fetchable, a
        handle)."""
        twin, graph = self.twin, self.twin.graph
        fetches: list[Any] = []
        targets: list[Any] = []
        index: dict[int, int] = {}
        places: list[int | None] = []
        for leaf in leaves:
            if leaf.graph is not graph:
                return None
            element = twin.element(leaf)
            op = element if isinstance(element, tf.Operation) else element.op
            if not graph.is_fetchable(op) or (op is not element and op.type in HANDLES):
                return None
            if op is not element and id(element) in fed:  # TF returns the fed value, converted, and runs nothing
                places.append(-1 - fed[id(element)])
                continue
            chosen = targets if op is element else fetches
            if id(element) not in index:
                index[id(element)] = len(chosen)
                chosen.append(element)
            places.append(None if op is element else index[id(element)])
        return fetches, targets, tuple(places)


def _structure(fetches: object, leaves: list[Any]) -> Hashable | None:
    """`fetches`' containers and dict keys (its leaves appended to `leaves`, in order; a leaf is 0), or None when
    it holds anything but dicts, lists, tuples, tensors and ops."""
    kind = type(fetches)
    keys: tuple[object, ...] | None = None
    if kind is dict:
        mapping = cast("dict[object, object]", fetches)
        keys, items = tuple(mapping), list(mapping.values())
    elif kind is list or kind is tuple:
        items = list(cast("Sequence[object]", fetches))
    elif isinstance(fetches, (tf.Tensor, tf.Operation)):
        leaves.append(fetches)
        return 0
    else:
        element = _element(fetches)
        if element is None:
            return None
        leaves.append(element)
        return 1
    parts: list[Hashable] = []
    for item in items:  # leaves here, not in a call each: a step's fetches are mostly leaves
        if isinstance(item, (tf.Tensor, tf.Operation)):
            leaves.append(item)
            parts.append(0)
            continue
        element = _element(item)
        if element is not None:
            leaves.append(element)
            parts.append(1)  # not 0: the structure says which leaves were converted (their caller's objects differ)
            continue
        part = _structure(item, leaves)
        if part is None:
            return None
        parts.append(part)
    return (kind, keys, tuple(parts))


def _element(fetch: object) -> tf.Tensor | tf.Operation | None:
    """The tensor `Session.run` fetches for a variable (`_as_graph_element`, as TF's `Graph.as_graph_element`
    resolves it): a fetched `tf.Variable`, or what `tf.compat.v1.assign_add` returns on a resource variable (the
    read after the update, an `_UnreadVariable`): jobs fetch their global step's increment every step. None for
    anything else (the plain path's to take)."""
    if isinstance(fetch, CONTAINERS):
        return None
    convert = getattr(fetch, "_as_graph_element", None)
    if not callable(convert):
        return None
    element = convert()
    return element if isinstance(element, (tf.Tensor, tf.Operation)) else None


def _rebuild(fetches: object, value: Callable[[], object]) -> object:
    """`fetches`' structure with each leaf replaced by `value()`, called in leaf order (as `_structure` lists them)."""
    kind = type(fetches)
    if kind is dict:
        mapping = cast("dict[object, object]", fetches)
        return {key: _rebuild(item, value) if type(item) in CONTAINERS else value() for key, item in mapping.items()}
    if kind is list or kind is tuple:
        built = [
            _rebuild(item, value) if type(item) in CONTAINERS else value() for item in cast("list[object]", fetches)
        ]
        return built if kind is list else tuple(built)
    return value()
