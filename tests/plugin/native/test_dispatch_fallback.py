"""The dispatch op's fallback function named by a string (`csrc/fallback.h`): TF's session no longer optimizes every
cluster's function at each executor build (a new run signature, a new session), while a call that falls back still
runs the body grappler gives it, so its values stay bit for bit those of the same ops in the user's graph.

Regression (issue 29): the `func` attribute made grappler's meta optimizer optimize every fallback function at each
executor build (the demo's twin: ~1.2 s for its first step against ~0.3 s without them), for steps that seldom run one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet import settings  # noqa: E402
from stitchfleet.compiler.ir import GraphBuilder  # noqa: E402
from stitchfleet.compiler.targets.cpu.executable import compile_cluster  # noqa: E402
from stitchfleet.plugin.native import dispatch_op  # noqa: E402

pytestmark = pytest.mark.tf
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bridge() -> dispatch_op.BridgeOp:
    return dispatch_op.load(settings.current().cache_dir)  # built (or found) here: the child process loads it


def _thirds(tmp_path: Path) -> object:
    """A cluster of the fallbacks' shapes (switched off, its code never runs)."""
    b = GraphBuilder()
    b.output("y", b.exp(b.parameter("x", (64, 33))))
    return compile_cluster(b.build(), tmp_path)


def test_the_op_names_its_fallback_by_a_string_of_the_graphs_library(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    executable = _thirds(tmp_path)
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [64, 33])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        function = tf.function(lambda v: [v / 3.0], autograph=False).get_concrete_function(x)
        (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
    attr = out.op.node_def.attr["fallback"]
    assert attr.WhichOneof("value") == "s"  # no `func`: TF's passes follow none to the function
    assert attr.s.decode() in {f.signature.name for f in graph.as_graph_def().library.function}


def test_switched_off_the_fallback_computes_what_the_users_graph_computes_bit_for_bit(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """Grappler rewrites `x / 3` into `x * (1 / 3)` in the user's graph; the fallback's body gets the same rewrite
    (as it did through a `func` attribute), else the two differ by an ulp on about a third of the elements."""
    executable = _thirds(tmp_path)
    values = np.random.default_rng(3).standard_normal((64, 33)).astype(np.float32)
    assert not np.array_equal(values / np.float32(3.0), values * np.float32(1.0 / 3.0))  # the test can see it
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 33])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        users = x / 3.0
        function = tf.function(lambda v: [v / 3.0], autograph=False).get_concrete_function(x)
        (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
        with tf.compat.v1.Session() as session:
            want, got = session.run([users, out], {x: values, switches: [False]})
    np.testing.assert_array_equal(got, want)


def test_switched_off_a_cube_is_the_users_graphs_multiplies_not_pow(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """Session 33: grappler turns `Pow(x, 3)` into `x * Square(x)` only for ops placed on the CPU; the fallback's body
    was optimized unplaced, so it ran libm's pow per element (BERT's GELU clusters: 5x their TF ops switched off) and
    rounded otherwise than the user's graph. Its ops are now on the op's device when grappler sees them."""
    executable = _thirds(tmp_path)
    values = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float32) * 3.0
    cubed = values * np.square(values)
    assert not np.array_equal(np.power(values.astype(np.float64), 3).astype(np.float32), cubed)  # roundings differ
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 33])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        users = tf.pow(x, 3.0)
        function = tf.function(lambda v: [tf.pow(v, 3.0)], autograph=False).get_concrete_function(x)
        (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
        with tf.compat.v1.Session() as session:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            metadata = tf.compat.v1.RunMetadata()
            feed = {x: values, switches: [False]}
            got = session.run(out, feed, options=options, run_metadata=metadata)
            want = session.run(users, feed)
    np.testing.assert_array_equal(got, want)
    ran = [n.timeline_label for d in metadata.step_stats.dev_stats for n in d.node_stats]
    assert not any(" = Pow(" in label for label in ran), ran  # the function's ops, timed beside the dispatch op


def test_switched_off_the_body_runs_onednns_kernels_as_the_users_graph_does(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """oneDNN's layout pass rewrites the session's graph (`Softmax` runs as `_MklSoftmax`) but not a function the
    op's runtime instantiates: switched off, BERT's bodies ran Eigen's Softmax (2.17 ms a step where the user's graph
    ran `_MklSoftmax` in 1.14 ms), rounding otherwise. The body now gets the pass as the user's graph did."""
    executable = _thirds(tmp_path)
    values = np.random.default_rng(6).standard_normal((64, 33)).astype(np.float32) * 4.0
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 33])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        users = tf.nn.softmax(x)
        function = tf.function(lambda v: [tf.nn.softmax(v)], autograph=False).get_concrete_function(x)
        (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
        with tf.compat.v1.Session() as session:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            feed = {x: values, switches: [False]}
            mine, theirs = tf.compat.v1.RunMetadata(), tf.compat.v1.RunMetadata()
            got = session.run(out, feed, options=options, run_metadata=mine)
            want = session.run(users, feed, options=options, run_metadata=theirs)
    np.testing.assert_array_equal(got, want)

    def kernels(metadata: tf.compat.v1.RunMetadata) -> list[str]:
        labels = [n.timeline_label for d in metadata.step_stats.dev_stats for n in d.node_stats]
        return [label for label in labels if "oftmax(" in label]

    if not any("_MklSoftmax" in label for label in kernels(theirs)):
        pytest.skip(f"this TF runs no oneDNN softmax in the user's graph ({kernels(theirs)})")
    assert any("_MklSoftmax" in label for label in kernels(mine)), kernels(mine)  # the body's, timed beside the op


def test_a_fallback_that_calls_another_function_runs_it(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    """The kernel's library holds the functions the fallback's body reaches (`lib_def` must be self-contained)."""
    executable = _thirds(tmp_path)
    values = np.random.default_rng(4).standard_normal((64, 33)).astype(np.float32)
    inner = tf.function(lambda v: tf.exp(v) + 1.0, autograph=False)
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 33])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        function = tf.function(lambda v: [inner(v) * 2.0], autograph=False).get_concrete_function(x)
        assert any(n.op.endswith("PartitionedCall") for n in function.function_def.node_def)  # a call, not inlined
        (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
        users = (tf.exp(x) + 1.0) * 2.0
        with tf.compat.v1.Session() as session:
            want, got = session.run([users, out], {x: values, switches: [False]})
    np.testing.assert_allclose(got, want, rtol=1e-6)


_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from stitchfleet import settings
from stitchfleet.compiler.ir import GraphBuilder
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.plugin.native import dispatch_op

tf.compat.v1.disable_eager_execution()
bridge = dispatch_op.load(settings.current().cache_dir)
b = GraphBuilder()
b.output("y", b.exp(b.parameter("x", (8, 16))))
executable = compile_cluster(b.build(), TMP)
with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [8, 16])
    switches = tf.compat.v1.placeholder(tf.bool, [None])
    function = tf.function(lambda v: [tf.exp(v) / 3.0], autograph=False).get_concrete_function(x)
    (out,) = bridge.dispatch(executable, [x], [tf.float32], switch=(switches, 0), fallback=function)
    total, doubled = tf.reduce_sum(out), out * 2.0
    feed = {x: np.ones((8, 16), np.float32)}
    with tf.compat.v1.Session() as session:
        print("NAME", function.name.decode() if isinstance(function.name, bytes) else function.name, flush=True)
        sys.stderr.write("SWITCHED ON\\n")
        sys.stderr.flush()
        for fetch in (out, total, doubled):  # three run signatures, three executor builds, switched on
            session.run(fetch, {**feed, switches: [True]})
        sys.stderr.write("SWITCHED OFF\\n")  # on stderr, between TF's own lines
        sys.stderr.flush()
        for fetch in (out, total, doubled):  # the same executors, switched off
            session.run(fetch, {**feed, switches: [False]})
        session.run([out, total], {**feed, switches: [False]})  # a fourth build, switched off
    with tf.compat.v1.Session() as again:  # a new session, switched off
        again.run(out, {**feed, switches: [False]})
print("ok", flush=True)
"""


def test_new_run_signatures_do_not_optimize_the_fallback_and_a_fallback_is_optimized_once(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """Grappler's meta optimizer logs the functions it optimized at each executor build (TF_CPP_VMODULE): none of
    them is the fallback now, on steps switched on; switched off, its body is optimized once for the process
    (csrc/fallback.h), however many executors and sessions run it. Before: once per build, switched on or not."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "meta_optimizer=1",
    }
    script = _SCRIPT.replace("TMP", repr(str(tmp_path)))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    name = re.search(r"^NAME (\S+)$", done.stdout, re.M)
    assert name is not None, done.stdout
    on, off = done.stderr.split("SWITCHED ON\n", 1)[1].split("SWITCHED OFF\n", 1)

    def optimized(log: str) -> list[list[str]]:
        """Per meta optimizer run, the functions it optimized."""
        return [m.group(1).split(", ") for m in re.finditer(r"Optimized \d+ functions: ?(.*)$", log, re.M)]

    assert len(optimized(on)) >= 3, "fewer meta optimizer runs logged than executor builds: the test sees nothing"
    assert not any(name.group(1) in names for names in optimized(on)), optimized(on)
    assert sum(name.group(1) in names for names in optimized(off)) == 1, optimized(off)
