"""The native bridge op (`plugin/bridge_op.py`): built against this TF, it runs a cluster's compiled C
inside the step with the same results as the Python path, aliases passed-through outputs, reports
NaN/Inf through its status, and the plugin falls back to tf.numpy_function when it cannot be built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet import settings  # noqa: E402
from stitchfleet.compiler.evaluate import random_inputs  # noqa: E402
from stitchfleet.compiler.ir import Graph, GraphBuilder  # noqa: E402
from stitchfleet.compiler.runtime.cpu import CpuExecutable, compile_cluster  # noqa: E402
from stitchfleet.plugin import bridge_op  # noqa: E402

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> bridge_op.BridgeOp:
    return bridge_op.load(settings.current().cache_dir)


def run(op: bridge_op.BridgeOp, executable: CpuExecutable, arrays: list[Any]) -> tuple[list[Any], int]:
    dtypes = [tf.as_dtype(p.dtype.numpy) for p in executable.source.params if p.output]
    graph = tf.Graph()
    with graph.as_default():
        feeds = [tf.compat.v1.placeholder(a.dtype, a.shape) for a in arrays]
        outs, status = op.call(executable, feeds, dtypes)
        with tf.compat.v1.Session(graph=graph) as session:
            *values, code = session.run([*outs, status], dict(zip(feeds, arrays, strict=True)))
    return values, int(code)


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


def test_the_op_gives_the_python_paths_values(bridge: bridge_op.BridgeOp, tmp_path: Path) -> None:
    graph = layernorm_and_passthrough()
    executable = compile_cluster(graph, tmp_path)
    inputs = random_inputs(graph, 3)
    arrays = [inputs[n] for n in executable.input_names]
    want, _ = executable.run(arrays)
    want = tuple(w.copy() for w in want)
    before = bridge.count(executable)
    got, code = run(bridge, executable, arrays)
    assert code == 0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[1], inputs["gamma"])
    assert bridge.count(executable) == before + 1 and bridge.count(executable, failed=True) == 0


def test_nan_in_a_computed_output_comes_back_as_status_2(bridge: bridge_op.BridgeOp, tmp_path: Path) -> None:
    b = GraphBuilder()
    b.output("l", b.log(b.parameter("x", (8, 32))))
    executable = compile_cluster(b.build(), tmp_path)
    x = np.ones((8, 32), np.float32)
    x[3, 4] = -1.0
    failed = bridge.count(executable, failed=True)
    _, code = run(bridge, executable, [x])
    assert code == 2
    assert bridge.count(executable, failed=True) == failed + 1


def test_an_unbuildable_op_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bridge_op, "COMPILER", str(tmp_path / "no-such-c++"))
    with pytest.raises(bridge_op.BridgeUnavailableError, match="no C\\+\\+ compiler"):
        bridge_op.library_path(tmp_path / "cache")


def test_choose_falls_back_under_auto_and_refuses_under_native(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cache_dir: Path) -> bridge_op.BridgeOp:
        raise bridge_op.BridgeUnavailableError("no headers")

    monkeypatch.setattr(bridge_op, "load", broken)
    assert bridge_op.choose("auto", "cpu", Path("/tmp")) is None
    with pytest.raises(bridge_op.BridgeUnavailableError, match="no headers"):
        bridge_op.choose("native", "cpu", Path("/tmp"))
    assert bridge_op.choose("python", "cpu", Path("/tmp")) is None
    assert bridge_op.choose("native", "sim", Path("/tmp")) is None  # the sim has no C entry point
