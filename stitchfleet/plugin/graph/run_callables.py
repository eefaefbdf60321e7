"""A session's diverted runs as TF callables: one made per (fetched elements, fed tensors), called every step.

Input: the raw session the twin's diverter is attached to, and each diverted run's flat list of fetched graph
elements, its feed dict, options and run metadata. Output: the run's values in the list's order, or None when this
run cannot take the callable (a feed that is not a plain dense tensor, a value TF would refuse):
the caller then runs it through `Session.run`, which raises TF's own error for a bad feed.
Why: `Session.run` builds a fetch handler, resolves every fetch and checks every feed on every call: on the demo
model that is most of the 400 us a stitched step spent in Python beyond its kernels (issue 29, the hook's cost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

log = logging.getLogger("stitchfleet.plugin")
LIMIT = 32  # callables kept per session: a job runs a handful of distinct training runs (check steps add one)
Element: TypeAlias = tf.Tensor | tf.Operation
Key: TypeAlias = tuple[tuple[Element, ...], tuple[object, ...], bytes]


class _Feed:
    """A fed tensor's dtype and static dims, checked as `Session.run` checks a fed value (no TF call)."""

    def __init__(self, tensor: tf.Tensor) -> None:
        self.dtype = tensor.dtype.as_numpy_dtype
        self.dims = None if tensor.shape.rank is None else tuple(tensor.shape.as_list())

    def value(self, given: object) -> np.ndarray[Any, Any] | None:
        """`given` as the array TF takes, or None when `Session.run` should judge it (it would raise)."""
        if isinstance(given, (tf.Tensor, tf.Operation, tf.SparseTensor)):
            return None
        array = np.asarray(given, dtype=self.dtype)
        if self.dims is None:
            return array
        if array.ndim != len(self.dims):
            return None
        fits = all(d is None or d == s for d, s in zip(self.dims, array.shape, strict=True))
        return array if fits else None


class RunCallables:
    """The callables of one session's diverted runs (see the module docstring)."""

    def __init__(self, session: tf.compat.v1.Session) -> None:
        self.session = session
        self._made: dict[Key, tuple[Callable[..., list[Any]], list[_Feed], list[int | None]]] = {}
        self._refused: set[Key] = set()

    def run(
        self,
        elements: Sequence[Element],
        feed_dict: Mapping[object, object] | None,
        options: config_pb2.RunOptions | None,
        metadata: config_pb2.RunMetadata | None,
    ) -> list[object] | None:
        """The values of `elements` from one run with `feed_dict` (None for an op), or None: the caller then uses
        `Session.run`. `options` are part of what a callable is made with; `metadata` is filled as a run fills it."""
        feeds = feed_dict or {}
        # MonitoredSession hands every run a fresh, empty RunOptions (and a RunMetadata its hooks read after)
        settings = options.SerializeToString() if options is not None else b""
        key: Key = (tuple(elements), tuple(feeds), settings)
        made = self._made.get(key)
        if made is None:
            if key in self._refused:
                return None
            made = self._make(key, options)
            if made is None:
                return None
        call, fed, places = made
        values = []
        for feed, given in zip(fed, feeds.values(), strict=True):
            value = feed.value(given)
            if value is None:
                return None
            values.append(value)
        fetched = call(*values, run_metadata=metadata) if metadata is not None else call(*values)
        return [None if place is None else fetched[place] for place in places]

    def _make(
        self, key: Key, options: config_pb2.RunOptions | None
    ) -> tuple[Callable[..., list[Any]], list[_Feed], list[int | None]] | None:
        elements, keys, _ = key
        graph = self.session.graph
        try:
            tensors = [graph.as_graph_element(k, allow_tensor=True, allow_operation=False) for k in keys]
            if not all(isinstance(t, tf.Tensor) and graph.is_feedable(t) for t in tensors):
                raise TypeError("a feed that is not a feedable dense tensor")
            if any(t.dtype in (tf.string, tf.resource, tf.variant) for t in tensors):
                raise TypeError("a feed of strings or handles")
            wanted = config_pb2.CallableOptions()
            wanted.feed.extend(t.name for t in tensors)
            places: list[int | None] = []
            for element in elements:
                if isinstance(element, tf.Operation):
                    wanted.target.append(element.name)
                    places.append(None)
                else:
                    places.append(len(wanted.fetch))
                    wanted.fetch.append(element.name)
            if options is not None:
                wanted.run_options.CopyFrom(options)
            # The fast path TF's own Keras v1 backend takes: no fetch handler, no feed checks per call (ours above)
            call = self.session._make_callable_from_options(wanted)
        except Exception as err:  # never a failed step: `Session.run` takes this run, as before
            log.debug("stitchfleet: a diverted run keeps Session.run: %s", err)
            self._refused.add(key)
            return None
        if len(self._made) >= LIMIT:
            self._made.pop(next(iter(self._made)))
        made = (call, [_Feed(t) for t in tensors], places)
        self._made[key] = made
        return made
