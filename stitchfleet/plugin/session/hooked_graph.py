"""The mark a StitchHook leaves on a graph it began on, so that no second hook joins the same graph.

Input: a `tf.Graph` (any object with attributes). Output: `mark(graph)` sets the mark, `hooked(graph)` reads it.
Its own module, free of TensorFlow and of the hook: a plain session reads the mark on every first run, and a job
still waiting for its setup (`plain_session.Waiting`) must not import the hook and the compiler to read it.
"""

from __future__ import annotations

HOOKED = "_stitchfleet_hooked"  # on a tf.Graph: a StitchHook began on it (MonitoredSession or a plain session)


def mark(graph: object) -> None:
    setattr(graph, HOOKED, True)


def hooked(graph: object) -> bool:
    return bool(getattr(graph, HOOKED, False))
