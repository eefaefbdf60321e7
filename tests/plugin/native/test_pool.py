"""Stitched task ranges on TF's intra-op threads (`plugin/native/csrc/pool.h`): the dispatch op hands a large
cluster's planned loops to the op's device worker threads, so its tasks run on more than one TF thread, with
the values the cluster's own entry computes (split and atomic reductions included); a small cluster's loops
stay on the op's own thread. Observed through the op library's counters, never through timing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from stitchfleet import settings
from stitchfleet.plugin.native import dispatch_op

pytestmark = pytest.mark.tf
REPO = Path(__file__).resolve().parents[3]

# Runs in a process of its own: TF's intra-op pool is process-wide and sized by the first session's options.
_SCRIPT = """
    import numpy as np
    import tensorflow as tf
    from pathlib import Path
    from stitchfleet import settings
    from stitchfleet.compiler.ir import GraphBuilder
    from stitchfleet.compiler.targets.cpu.executable import compile_cluster
    from stitchfleet.plugin.native import dispatch_op

    tf.compat.v1.disable_eager_execution()
    bridge = dispatch_op.load(settings.current().cache_dir)

    def cluster(rows, cols):
        b = GraphBuilder()
        x = b.parameter("x", (rows, cols))
        y = b.tanh(x * 0.5 + 1.0) * x
        b.output("y", y)
        b.output("rows", b.reduce_sum(y, (1,)))
        b.output("cols", b.reduce_sum(x * x, (0,)))
        return b.build()

    def on_the_op(executable, x, runs=1):
        dtypes = [tf.float32] * 3
        graph = tf.Graph()
        with graph.as_default():
            feed = tf.compat.v1.placeholder(tf.float32, x.shape)
            switches = tf.compat.v1.placeholder(tf.bool, [None])
            spec = tf.TensorSpec(x.shape, tf.float32)
            zeros = lambda v: [v * 0.0, tf.reduce_sum(v, 1) * 0.0, tf.reduce_sum(v, 0) * 0.0]
            function = tf.function(zeros, autograph=False).get_concrete_function(spec)
            outs = bridge.dispatch(executable, [feed], dtypes, switch=(switches, 0), fallback=function)
            config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=4, inter_op_parallelism_threads=1)
            with tf.compat.v1.Session(graph=graph, config=config) as session:
                return [session.run(outs, {feed: x, switches: [True]}) for _ in range(runs)]

    def check(got, want):
        np.testing.assert_array_equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)

    rng = np.random.default_rng(7)
    for rows, cols, spread in ((2048, 512, True), (16, 64, False)):
        executable = compile_cluster(cluster(rows, cols), Path(CACHE))
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        want = [w.copy() for w in executable.run([x])[0]]  # the entry's own runner (OpenMP, serial here)
        loops, shards = bridge.pool_loops(), bridge.pool_loops(on_workers=True)
        # a worker claims blocks only if it starts before the op's thread took them all: over 20 runs one does
        for got in on_the_op(executable, x, runs=20):
            check(got, want)
        assert bridge.pool_loops() > loops, (rows, cols)  # the op took the pooled entry
        ran_elsewhere = bridge.pool_loops(on_workers=True) - shards
        assert (ran_elsewhere > 0) == spread, (rows, cols, ran_elsewhere)

    # above the threshold the large cluster's loops stay on the op's thread too, with the same values
    executable = compile_cluster(cluster(2048, 512), Path(CACHE))
    x = rng.standard_normal((2048, 512)).astype(np.float32)
    want = [w.copy() for w in executable.run([x])[0]]
    before = bridge.pool_elements(1 << 40)
    shards = bridge.pool_loops(on_workers=True)
    for got in on_the_op(executable, x, runs=3):
        check(got, want)
    assert bridge.pool_loops(on_workers=True) == shards
    assert bridge.pool_elements(before) == 1 << 40
    print("ok")
"""


@pytest.fixture(scope="module")
def bridge() -> dispatch_op.BridgeOp:
    return dispatch_op.load(settings.current().cache_dir)  # built (or found) here: the child process loads it


def test_a_large_clusters_blocks_run_on_tfs_worker_threads_and_a_small_ones_stay_inline(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    script = textwrap.dedent(_SCRIPT).replace("CACHE", repr(str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
