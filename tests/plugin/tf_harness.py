"""Shared by the frontend tests: build a small TF graph, convert it, check it against TF.

Input: a function that builds tensors in the default graph and returns (inputs to
differentiate, output tensor). Output: `Checked` with the conversion and the
comparisons of every IR value, every cluster and every folded constant with TF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.frontend.validation import Comparison, compare, compare_clusters, compare_folded, random_feeds

Build = Callable[[], tuple[Sequence[Any], Any]]


@dataclass
class Checked:
    graph: Any
    conversion: Conversion
    values: Comparison
    clusters: Comparison
    cluster_count: int
    folded: Comparison

    def types(self, fate: str) -> set[str]:
        return {d.op_type for d in self.conversion.ops.values() if d.fate == fate}

    def assert_ok(self) -> None:
        assert self.values.ok, self.values.failures
        assert not self.clusters.failures, self.clusters.failures
        assert not self.folded.failures, self.folded.failures


def training_graph(build: Build, seed: int = 0) -> Any:
    """The built expression, a weighted-sum loss over it and the loss's gradients."""
    graph = tf.Graph()
    with graph.as_default():
        xs, out = build()
        weights = np.random.default_rng(seed).standard_normal(out.shape.as_list())
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.constant(weights.astype(np.float32)))
        tf.gradients(loss, list(xs), name="grads")
    return graph


def check_graph(graph: Any, seed: int = 0, conversion: Conversion | None = None) -> Checked:
    """Checks `conversion` (default: `graph` converted whole) by running `graph` in TF."""
    conversion = conversion or convert(graph)
    with tf.compat.v1.Session(graph=graph) as session:
        with graph.as_default():
            session.run(tf.compat.v1.global_variables_initializer())
        feeds = random_feeds(graph, seed)
        values = compare(session, conversion, feeds)
        count, clusters = compare_clusters(session, conversion, feeds)
        folded = compare_folded(session, conversion, feeds)
    return Checked(graph, conversion, values, clusters, count, folded)


def check(build: Build, seed: int = 0) -> Checked:
    return check_graph(training_graph(build, seed), seed)
