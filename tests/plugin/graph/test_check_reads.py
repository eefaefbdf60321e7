"""Check-step copies of ref-variable reads when several clusters hold the same `read` Identity.

Regression (issue 30, the corpus' CIFAR-10 tutorial): clusters overlap, so a TF1 variable's `read` Identity
can be an interior op of several of them (there: the weight-decay losses, their gradients and the moving
averages of every weight). Each cluster took its own check-step copy of the raw ref and rewired the shared
Identity to it; the next cluster then met a read that was neither its input nor its interior, and its rewrite
failed ("KeyError: 'stitchfleet/cluster_2/check_read/Merge'"), leaving it with TF. Now one copy per ref alias
serves every cluster: all install, and on a check step each one's kernel and TF ops read the same value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph.mapping import Site  # noqa: E402
from stitchfleet.plugin.graph.rewrite import Installed, rewire  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1


def _site(index: int, ref: Any, read: Any, out: Any) -> Site:
    """A cluster of the read Identity and one op on it, its input the raw ref (as mapping finds it)."""
    return Site(index=index, graph=None, inputs=[ref], outputs=[out], internal=[read.op, out.op])


def test_clusters_sharing_a_ref_read_all_install_and_read_one_copy() -> None:
    graph = tf.Graph()
    with graph.as_default():
        w = V1.Variable(np.arange(6, dtype=np.float32), use_resource=False, name="w")
        read = w.value()  # w/read: an Identity of the float_ref
        assert read.op.type == "Identity" and read.op.inputs[0].dtype._is_ref_dtype
        negated, absolute, squared = tf.negative(read), tf.abs(read), tf.square(read)
        sites = [_site(k, w._ref(), read, out) for k, out in enumerate([negated, absolute, squared])]
        kernels = [lambda x: (-x,), lambda x: (np.abs(x),), lambda x: (np.square(x),)]
        # in place after every read of the step, as SGD's update
        with tf.control_dependencies([negated, absolute, squared]):
            update = V1.assign_add(w._ref(), np.full(6, 100.0, np.float32))
        rewired = rewire(graph, sites, kernels)
        assert [type(c) for c in rewired.clusters] == [Installed] * 3, rewired.clusters
        copies = {done.inputs[0].name for done in rewired.clusters if isinstance(done, Installed)}
        assert len(copies) == 1 and "check_read" in copies.pop()  # one copy, every cluster reads it
        with V1.Session() as session:
            session.run(w.initializer)
            switched = [rewired.current(t) for t in (negated, absolute, squared)]
            fetches = [switched, [done.original for done in rewired.clusters], update]
            feed = {rewired.switches: np.ones(3, bool), rewired.checking: True}
            stitched, native, _ = session.run(fetches, feed)
    base = np.arange(6, dtype=np.float32)
    for value, want in zip(stitched, [-base, base, base**2], strict=True):
        np.testing.assert_array_equal(value, want)
    for (value,), want in zip(native, [-base, base, base**2], strict=True):
        np.testing.assert_array_equal(value, want)
