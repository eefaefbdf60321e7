"""The native bridge op (`plugin/native/dispatch_op.py`): built against this TF, switched on it runs a cluster's
compiled C inside the step (passed-through outputs aliased), switched off it runs the cluster's TF ops
(a graph function) instead; NaN/Inf from the C is replaced by the TF ops' values and counted as the
kernel's fault only where TF's values are finite; the plugin falls back to tf.numpy_function when the
op cannot be built."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet import settings  # noqa: E402
from stitchfleet.compiler.evaluate import random_inputs  # noqa: E402
from stitchfleet.compiler.ir import Graph, GraphBuilder  # noqa: E402
from stitchfleet.compiler.plan import PlanOptions, plan_cluster  # noqa: E402
from stitchfleet.compiler.targets.cpu.executable import CpuExecutable, compile_cluster  # noqa: E402
from stitchfleet.plugin.native import dispatch_op  # noqa: E402

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> dispatch_op.BridgeOp:
    return dispatch_op.load(settings.current().cache_dir)


def run(
    op: dispatch_op.BridgeOp, executable: CpuExecutable, arrays: list[Any], on: bool, fallback: Any = None
) -> list[Any]:
    """Runs the dispatch op once with its switch `on`; `fallback` (inputs -> outputs in TF ops) stands for
    the cluster's TF ops (default: the compiled C's own results through tf.numpy_function)."""
    dtypes = [tf.as_dtype(p.dtype.numpy) for p in executable.source.params if p.output]
    graph = tf.Graph()
    with graph.as_default():
        feeds = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in arrays]
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        specs = [tf.TensorSpec(a.shape, a.dtype) for a in arrays]
        body = fallback or (lambda *xs: tf.numpy_function(lambda *v: executable.run(v)[0], list(xs), dtypes))
        function = tf.function(body, autograph=False).get_concrete_function(*specs)
        outs = op.dispatch(executable, feeds, dtypes, switch=(switches, 1), fallback=function)
        with tf.compat.v1.Session(graph=graph) as session:
            values = session.run(outs, {**dict(zip(feeds, arrays, strict=True)), switches: [False, on]})
    return list(values)


def layernorm_and_passthrough() -> Graph:
    b = GraphBuilder()
    x, gamma = b.parameter("x", (16, 64)), b.parameter("gamma", (64,))
    mean = b.reduce_mean(x, (1,), keepdims=True)
    centred = b.sub(x, b.broadcast_to(mean, (16, 64)))
    var = b.reduce_mean(b.square(centred), (1,), keepdims=True)
    y = b.mul(b.mul(centred, b.broadcast_to(b.rsqrt(b.add(var, 1e-5)), (16, 64))), b.broadcast(gamma, (16, 64), (1,)))
    b.output("y", y)
    b.output("gamma_out", gamma)  # a parameter as an output: the op aliases it
    return b.build()


def test_switched_on_the_op_gives_the_compiled_values(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    graph = layernorm_and_passthrough()
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 3)
    arrays = [inputs[n] for n in executable.input_names]
    want, _ = executable.run(arrays)
    want = tuple(w.copy() for w in want)
    before = bridge.count(executable)
    got = run(bridge, executable, arrays, on=True, fallback=lambda x, gamma: [x * 0.0, gamma * 0.0])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[1], inputs["gamma"])  # passed through, not the fallback's zeros
    assert bridge.count(executable) == before + 1 and bridge.count(executable, "failed") == 0


def test_switched_off_the_op_runs_the_fallback_and_not_the_c(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    graph = layernorm_and_passthrough()
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 4)
    arrays = [inputs[n] for n in executable.input_names]
    before = bridge.count(executable)
    got = run(bridge, executable, arrays, on=False, fallback=lambda x, gamma: [x + 1.0, gamma * 2.0])
    np.testing.assert_array_equal(got[0], arrays[0] + 1.0)
    np.testing.assert_array_equal(got[1], arrays[1] * 2.0)
    assert bridge.count(executable) == before


def repeating() -> Graph:
    """One value stored once, three outputs: itself, the same node again, and a reshape of it."""
    b = GraphBuilder()
    y = b.exp(b.parameter("x", (16, 64)))
    b.output("y", y)
    b.output("y_again", y)
    b.output("y_flat", b.reshape(y, (1024,)))
    return b.build()


def test_a_repeated_output_shares_its_sources_buffer(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    """The C code stores `y` once; the op hands `y_again` and `y_flat` the same buffer (`Tensor::CopyFrom`, the
    reshape with its own shape). Had the op allocated them, the C code would have left them unwritten."""
    graph = repeating()
    executable = compile_cluster(graph, tmp_path)
    assert executable.repeats == (-1, 0, 0)
    inputs = random_inputs(graph, 8)
    zeros = lambda x: [x * 0.0, x * 0.0, tf.reshape(x * 0.0, [1024])]  # noqa: E731
    got = run(bridge, executable, [inputs["x"]], on=True, fallback=zeros)
    want = np.exp(inputs["x"])
    assert [g.shape for g in got] == [(16, 64), (16, 64), (1024,)]
    np.testing.assert_allclose(got[0], want, rtol=1e-6)
    np.testing.assert_array_equal(got[1], got[0])
    np.testing.assert_array_equal(got[2], got[0].reshape(-1))
    assert bridge.count(executable, "failed") == 0


class _Repeating:
    """A kernel whose `repeats` is not its own (what a stale or hand-built op would carry)."""

    def __init__(self, kernel: CpuExecutable, repeats: list[int]) -> None:
        self.kernel, self.repeats = kernel, repeats

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)


@pytest.mark.parametrize(
    ("repeats", "message"),
    [([-1, 0], "repeats has 2 entries for 3 outputs"), ([-1, 0, 1], "which is no earlier stored output")],
)
def test_an_op_with_unusable_repeats_is_refused(
    bridge: dispatch_op.BridgeOp, tmp_path: Path, repeats: list[int], message: str
) -> None:
    executable = compile_cluster(repeating(), tmp_path)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        run(bridge, _Repeating(executable, repeats), [random_inputs(repeating(), 1)["x"]], on=True)  # type: ignore[arg-type]


def log_cluster(tmp_path: Path) -> CpuExecutable:
    b = GraphBuilder()
    b.output("l", b.log(b.parameter("x", (8, 32))))
    return compile_cluster(b.build(), tmp_path)


def test_nan_only_in_the_c_comes_back_as_tfs_values_and_counts_as_a_fault(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    executable = log_cluster(tmp_path)
    x = np.ones((8, 32), np.float32)
    x[3, 4] = -1.0
    failed, faulted = bridge.count(executable, "failed"), bridge.count(executable, "faulted")
    total = bridge.faults()
    (got,) = run(bridge, executable, [x], on=True, fallback=lambda v: [tf.math.log(tf.abs(v))])
    np.testing.assert_array_equal(got, np.zeros_like(x))  # the fallback's values, NaN-free
    assert bridge.count(executable, "failed") == failed + 1
    assert bridge.count(executable, "faulted") == faulted + 1
    assert bridge.faults() == total + 1  # the process-wide count the hook polls once per step


def test_nan_tf_computes_too_is_not_the_kernels_fault(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    executable = log_cluster(tmp_path)
    x = np.ones((8, 32), np.float32)
    x[7, 31] = -1.0  # the last element: the in-C test must see it
    failed, faulted, total = bridge.count(executable, "failed"), bridge.count(executable, "faulted"), bridge.faults()
    (got,) = run(bridge, executable, [x], on=True, fallback=lambda v: [tf.math.log(v)])
    assert np.isnan(got[7, 31]) and np.isfinite(got[:7]).all()
    assert bridge.count(executable, "failed") == failed + 1
    assert bridge.count(executable, "faulted") == faulted and bridge.faults() == total


def test_inf_and_nan_tfs_ops_produce_too_never_revert(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    """A -inf attention mask (scores stay -inf) and a fully masked row (its softmax is NaN): TF's own ops on the
    same inputs give the same non-finite values, so the call is not a fault and the hook's per-step poll
    flags no cluster for revert."""
    from stitchfleet.plugin.native.kernels import ClusterKernel, poll_faults

    b = GraphBuilder()
    x, mask = b.parameter("x", (4, 16)), b.parameter("mask", (4, 16))
    scores = b.add(x, mask)
    e = b.exp(b.sub(scores, b.reduce_max(scores, (1,), keepdims=True)))
    b.output("scores", scores)
    b.output("probs", b.div(e, b.reduce_sum(e, (1,), keepdims=True)))
    graph = b.build()
    kernel = ClusterKernel(graph, plan_cluster(graph, 0, PlanOptions()), "cpu", tmp_path)
    executable = kernel.executable
    assert executable is not None
    start = bridge.count(executable, "faulted")
    kernel.faulted = lambda: bridge.count(executable, "faulted") - start
    seen = bridge.faults()
    rng = np.random.default_rng(5)
    arrays = {"x": rng.standard_normal((4, 16)).astype(np.float32), "mask": np.zeros((4, 16), np.float32)}
    arrays["mask"][:, 10:] = -np.inf  # masked keys
    arrays["mask"][3, :] = -np.inf  # a fully masked row: -inf - (-inf) is NaN, in TF as in the kernel

    def tf_ops(x: Any, m: Any) -> list[Any]:
        s = x + m
        e = tf.exp(s - tf.reduce_max(s, 1, keepdims=True))
        return [s, e / tf.reduce_sum(e, 1, keepdims=True)]

    got = run(bridge, executable, [arrays[n] for n in executable.input_names], on=True, fallback=tf_ops)
    assert np.isneginf(got[0][:, 10:]).all() and np.isnan(got[1][3]).all() and np.isfinite(got[1][:3]).all()
    assert bridge.count(executable, "faulted") == start and bridge.faults() == seen
    assert poll_faults(bridge, seen, [kernel]) == seen and kernel.bad is None


def test_counts_name_what_they_count(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bridge count 'crashes': expected one of calls, failed, faulted"):
        bridge.count(log_cluster(tmp_path), "crashes")


def test_an_op_loaded_in_this_process_needs_no_build_for_another_cache(
    bridge: dispatch_op.BridgeOp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load` gives a second cache directory the library the process loaded first, so the payback must not price a
    build for it: a job's second session in a process with an empty cache of its own was weighed at the warm cost
    plus the op's build (5.7 s against 1.5 s) and skipped a setup that repays (CI, session 50)."""
    monkeypatch.setattr(dispatch_op, "_prebuilt", lambda: None)  # no shim here: only the process or the cache
    assert dispatch_op.present(tmp_path / "empty-cache")
    monkeypatch.setattr(dispatch_op, "_LOADED", [])  # a process that loaded none: the empty cache needs a build
    assert not dispatch_op.present(tmp_path / "empty-cache")


def test_an_unbuildable_op_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch_op, "COMPILER", str(tmp_path / "no-such-c++"))
    with pytest.raises(dispatch_op.BridgeUnavailableError, match="no C\\+\\+ compiler"):
        dispatch_op.library_path(tmp_path / "cache")


def test_choose_falls_back_under_auto_and_refuses_under_native(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cache_dir: Path) -> dispatch_op.BridgeOp:
        raise dispatch_op.BridgeUnavailableError("no headers")

    monkeypatch.setattr(dispatch_op, "load", broken)
    assert dispatch_op.choose("auto", "cpu", Path("/tmp")) is None
    with pytest.raises(dispatch_op.BridgeUnavailableError, match="no headers"):
        dispatch_op.choose("native", "cpu", Path("/tmp"))
    assert dispatch_op.choose("python", "cpu", Path("/tmp")) is None
    assert dispatch_op.choose("native", "sim", Path("/tmp")) is None  # the sim has no C entry point


def test_the_op_build_starts_in_the_background_and_load_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold pod built the op (~10 s of C++) after its cluster compiles; `warm` starts it first, so the
    two overlap (KerasTransformer's cold setup: 19.5 s and 17.7 s before, 12.7 s and 13.3 s after)."""
    import threading
    import time

    from stitchfleet.plugin.native import dispatch_op as module

    calls: list[str] = []
    started = threading.Event()

    def slow_build(cache_dir: Path) -> Path:
        calls.append(threading.current_thread().name)
        started.set()
        time.sleep(0.3)
        return cache_dir / "op.so"

    monkeypatch.setattr(module, "_LOADED", [])
    monkeypatch.setattr(module, "_WARMING", {})
    monkeypatch.setattr(module, "library_path", slow_build)
    monkeypatch.setattr(module, "_load", lambda path: ("loaded", path))
    module.warm(tmp_path)
    module.warm(tmp_path)  # a second call starts nothing
    assert started.wait(5)
    assert module.load(tmp_path) == ("loaded", tmp_path / "op.so")
    assert calls == ["stitchfleet-op-build", "MainThread"]  # the background build, then load's (cached) lookup


def test_inputs_of_another_shape_run_tfs_ops_and_count_a_miss(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    """A kernel built for a batch of 16 never sees a batch of 5 (a last partial batch under a `None` batch
    dimension): switched on, that call runs TF's ops, is counted as a miss, and the outputs keep the graph's
    partial shape for TF's shape inference. Before, the C wrote 16 rows into a 5-row input's neighbours."""
    graph = layernorm_and_passthrough()
    executable = compile_cluster(graph, tmp_path)
    dtypes = [tf.as_dtype(p.dtype.numpy) for p in executable.source.params if p.output]
    small = np.random.default_rng(5).standard_normal((5, 64)).astype(np.float32)
    gamma = np.random.default_rng(6).standard_normal(64).astype(np.float32)
    with tf.Graph().as_default() as g:
        x = tf.compat.v1.placeholder(tf.float32, [None, 64])
        gamma_in = tf.compat.v1.placeholder(tf.float32, [64])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        specs = [tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([64], tf.float32)]
        function = tf.function(lambda a, b: [a * 2.0, b], autograph=False).get_concrete_function(*specs)
        outs = bridge.dispatch(
            executable, [x, gamma_in], dtypes, switch=(switches, 0), fallback=function, static_shapes=[[None, 64], [64]]
        )
        assert outs[0].shape.as_list() == [None, 64]
        before = (bridge.count(executable), bridge.count(executable, "missed"))
        with tf.compat.v1.Session(graph=g) as session:
            got = session.run(outs, {x: small, gamma_in: gamma, switches: [True]})
            assert (bridge.count(executable), bridge.count(executable, "missed")) == (before[0], before[1] + 1)
            inputs = random_inputs(graph, 7)
            want, _ = executable.run([inputs[n] for n in executable.input_names])
            matched = session.run(outs[0], {x: inputs["x"], gamma_in: inputs["gamma"], switches: [True]})
    np.testing.assert_array_equal(got[0], small * 2.0)  # TF's ops, at the shape fed
    np.testing.assert_array_equal(matched, want[0])  # the signature's own shape still runs the C
    assert bridge.count(executable) == before[0] + 1


def test_kernels_bound_for_several_signatures_each_serve_their_own_shapes(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """A cluster built at begin for a batch of 16 gets kernels bound for batches of 5 and 7 (two signatures a job
    alternates between): the op, built once with the first kernel's attributes, runs each kernel on its own
    batch, counted per signature; a batch no kernel has (3) runs TF's ops, counted as a miss. Unbinding one
    signature sends its calls to TF's ops and leaves the others bound; unbinding begin's kernel ("") too.
    Before, one binding replaced the op's kernel: a job alternating two batch sizes stitched only one."""
    guessed = compile_cluster(layernorm_and_passthrough(), tmp_path / "guess")
    five, seven = (compile_cluster(_layernorm(n), tmp_path / f"fed{n}") for n in (5, 7))
    dtypes = [tf.as_dtype(p.dtype.numpy) for p in guessed.source.params if p.output]
    symbol = guessed.source.entry
    with tf.Graph().as_default() as g:
        x, gamma = tf.compat.v1.placeholder(tf.float32, [None, 64]), tf.compat.v1.placeholder(tf.float32, [64])
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        specs = [tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([64], tf.float32)]
        function = tf.function(lambda a, b: [a * 2.0, b], autograph=False).get_concrete_function(*specs)
        outs = bridge.dispatch(
            guessed, [x, gamma], dtypes, switch=(switches, 0), fallback=function, static_shapes=[[None, 64], [64]]
        )
        with tf.compat.v1.Session(graph=g) as session:

            def call(executable: CpuExecutable | None, rows: int) -> tuple[Any, Any]:
                """The op's output on `rows` rows, and what `executable` computes on them (TF's ops when None)."""
                inputs = random_inputs(_layernorm(rows), rows)
                got = session.run(outs[0], {x: inputs["x"], gamma: inputs["gamma"], switches: [True]})
                if executable is None:
                    return got, inputs["x"] * 2.0
                return got, executable.run([inputs[n] for n in executable.input_names])[0][0]

            np.testing.assert_array_equal(*call(None, 5))  # unbound: a miss
            bridge.bind(symbol, five, "x=5x64")
            bridge.bind(symbol, seven, "x=7x64")
            before = {key: bridge.signature_calls(symbol, key) for key in ("", "x=5x64", "x=7x64")}
            missed, calls = bridge.count(guessed, "missed"), bridge.count(guessed)
            for executable, rows in ((five, 5), (seven, 7), (guessed, 16), (five, 5), (None, 3)):
                np.testing.assert_array_equal(*call(executable, rows))
            after = {key: bridge.signature_calls(symbol, key) for key in before}
            assert {key: after[key] - before[key] for key in after} == {"": 1, "x=5x64": 2, "x=7x64": 1}
            assert bridge.count(guessed) == calls + 4  # every kernel counted under the op's own symbol too
            assert bridge.count(guessed, "missed") == missed + 1  # the batch of 3

            assert bridge.unbind(symbol, "x=5x64") and not bridge.unbind(symbol, "x=5x64")
            np.testing.assert_array_equal(*call(None, 5))  # TF's ops again
            np.testing.assert_array_equal(*call(seven, 7))  # the other signature keeps its kernel
            assert bridge.unbind(symbol, "")
            np.testing.assert_array_equal(*call(None, 16))  # begin's kernel unbound too
            np.testing.assert_array_equal(*call(seven, 7))
            bridge.bind(symbol, five, "x=5x64")  # bound again, beside the other
            np.testing.assert_array_equal(*call(five, 5))
            assert bridge.signature_calls(symbol, "x=5x64") == after["x=5x64"] + 1
            bridge.reset(symbol)  # what a new job's hook starts from: the op's own kernel, counts at 0
            np.testing.assert_array_equal(*call(None, 5))
            np.testing.assert_array_equal(*call(guessed, 16))
            assert [bridge.signature_calls(symbol, key) for key in ("", "x=5x64", "x=7x64")] == [1, 0, 0]
    missing = copy.copy(five)
    missing.library_path = tmp_path / "missing.so"
    with pytest.raises(dispatch_op.BridgeUnavailableError, match="cannot load"):
        bridge.bind(symbol, missing, "x=5x64")
    with pytest.raises(dispatch_op.BridgeUnavailableError, match="empty key"):
        bridge.bind(symbol, five, "")


def _layernorm(rows: int) -> Graph:
    b = GraphBuilder()
    x, gamma = b.parameter("x", (rows, 64)), b.parameter("gamma", (64,))
    mean = b.reduce_mean(x, (1,), keepdims=True)
    centred = b.sub(x, b.broadcast_to(mean, (rows, 64)))
    var = b.reduce_mean(b.square(centred), (1,), keepdims=True)
    y = b.mul(
        b.mul(centred, b.broadcast_to(b.rsqrt(b.add(var, 1e-5)), (rows, 64))), b.broadcast(gamma, (rows, 64), (1,))
    )
    b.output("y", y)
    b.output("gamma_out", gamma)
    return b.build()


def two_large_outputs_and_a_small_one() -> Graph:
    b = GraphBuilder()
    x, s = b.parameter("x", (256, 64)), b.parameter("s", (64,))  # 64 KiB of float32, and 256 bytes
    b.output("doubled", b.mul(x, b.broadcast_to(b.constant(2.0), (256, 64))))
    b.output("shifted", b.add(x, b.broadcast(s, (256, 64), (1,))))
    b.output("small", b.mul(s, s))
    return b.build()


def test_large_outputs_are_staggered_and_carry_the_compiled_values(
    bridge: dispatch_op.BridgeOp, tmp_path: Path
) -> None:
    """csrc/staggered.h: an output of 32 KiB or more is allocated at its own offset within its pages (TF's
    allocator gave every large tensor the same one, and many-stream clusters evicted their own lines); its
    values are the compiled ones, TF's ops downstream read it, and a small output keeps TF's allocator."""
    graph = two_large_outputs_and_a_small_one()
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 5)
    arrays = [inputs[n] for n in executable.input_names]
    want = [w.copy() for w in executable.run(arrays)[0]]
    before = bridge.staggered()
    for _ in range(3):  # each run's outputs freed by TF, allocated again
        got = run(bridge, executable, arrays, on=True, fallback=lambda x, s: [x * 0.0, x * 0.0, s * 0.0])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    assert bridge.staggered() == before + 2 * 3  # the two large outputs, every run; never the small one
    dtypes = [tf.float32] * 3
    with tf.Graph().as_default() as graph_tf:
        feeds = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in arrays]
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        specs = [tf.TensorSpec(a.shape, a.dtype) for a in arrays]
        function = tf.function(lambda x, s: [x, x, s], autograph=False).get_concrete_function(*specs)
        outs = bridge.dispatch(executable, feeds, dtypes, switch=(switches, 0), fallback=function)
        after = tf.nn.relu(outs[0] - 1.0) + outs[1]  # TF's own kernels on the staggered buffers (may forward them)
        with tf.compat.v1.Session(graph=graph_tf) as session:
            value = session.run(after, {**dict(zip(feeds, arrays, strict=True)), switches: [True]})
    np.testing.assert_allclose(value, np.maximum(want[0] - 1.0, 0.0) + want[1], rtol=1e-6)


def test_large_outputs_reuse_released_memory_and_never_a_held_one(bridge: dispatch_op.BridgeOp, tmp_path: Path) -> None:
    """csrc/staggered.h's recycling: glibc gave a freed output's pages back to the kernel, so every stitched step
    faulted its outputs' pages in again (~250 faults a step of the demo's stitched step). A released output's block
    serves the next call of its size; a block some tensor still holds (an array the session returned, which may
    share TF's buffer) is never handed out, so a value kept from one step is not overwritten by the next."""
    graph = two_large_outputs_and_a_small_one()
    executable = compile_cluster(graph, tmp_path)
    dtypes = [tf.as_dtype(p.dtype.numpy) for p in executable.source.params if p.output]
    with tf.Graph().as_default() as graph_tf:
        inputs = random_inputs(graph, 7)
        first = [inputs[n] for n in executable.input_names]
        feeds = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in first]
        switches = tf.compat.v1.placeholder(tf.bool, [None])
        specs = [tf.TensorSpec(a.shape, a.dtype) for a in first]
        function = tf.function(lambda x, s: [x * 0.0, x * 0.0, s * 0.0], autograph=False).get_concrete_function(*specs)
        outs = bridge.dispatch(executable, feeds, dtypes, switch=(switches, 0), fallback=function)
        with tf.compat.v1.Session(graph=graph_tf) as session:

            def step(arrays: list[Any]) -> list[Any]:
                return list(session.run(outs, {**dict(zip(feeds, arrays, strict=True)), switches: [True]}))

            kept = step(first)  # held across the later steps
            want_first = [w.copy() for w in executable.run(first)[0]]
            before, staggered = bridge.recycled(), bridge.staggered()
            seen = []  # per step: the outputs' addresses and the reuse count after it (said if the count falls short)
            for seed in (8, 9, 10):
                values = random_inputs(graph, seed)
                arrays = [values[n] for n in executable.input_names]
                got = step(arrays)
                for g, w in zip(got, executable.run(arrays)[0], strict=True):
                    np.testing.assert_array_equal(g, w)
                seen.append(([hex(a.ctypes.data) for a in got], bridge.recycled() - before))
                del got  # released: its blocks serve the next step
            for k, w in zip(kept, want_first, strict=True):
                np.testing.assert_array_equal(k, w)
    # the two large outputs of the second and third steps reused the blocks the step before released (it fell short
    # once in CI, 2 of 4, cause not found: the message says at which step, and where each step's outputs were)
    said = f"kept at {[hex(a.ctypes.data) for a in kept]}; per step {seen}; staggered {bridge.staggered() - staggered}"
    assert bridge.recycled() - before >= 2 * 2, said
