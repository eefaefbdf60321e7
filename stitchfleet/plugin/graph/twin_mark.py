"""The twin's name scope in a graph, and whether a graph already holds a twin.

Input: a `tf.Graph`. Output: `PREFIX` (the scope every copied op lives under) and `built_in(graph)`. Apart
from twin.py, which imports the graph mapping and the compiler: a session's hook asks `built_in` before it
knows whether setup runs, and a job that skips its setup must not import those (docs/plugin/session.md).
"""

from __future__ import annotations

import tensorflow as tf

PREFIX = "stitchfleet_twin"


def built_in(graph: tf.Graph) -> bool:
    """Whether `graph` already holds a copy: an earlier session of this process stitched it (TF unfinalizes a
    graph when its MonitoredSession closes, and a script may open one per epoch on the same graph)."""
    return any(op.name.startswith(f"{PREFIX}/") for op in graph.get_operations())
