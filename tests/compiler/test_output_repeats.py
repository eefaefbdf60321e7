"""Outputs that repeat an earlier output's value (plan/repeats.py): decided with reasons, stored once by every
backend's kernels, handed out with each output's own shape, equal to the reference on random inputs.

The graph is the transformer's GELU-backward pattern: one IR node listed twice among the outputs (two TF tensors
the frontend maps to it are read outside the cluster), a reduce_mean listed twice, and a reshape of an output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stitchfleet.compiler import targets
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.plan.repeats import output_repeats, stored_graph
from stitchfleet.compiler.targets.cpu.executable import compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.targets.cuda.launch_plan import plan_launches
from stitchfleet.compiler.tolerance import check_outputs

OPTIONS = PlanOptions(device="tiny")  # small grids: cuda-cpu runs a fiber per CUDA thread
REPEATS = (-1, -1, 0, -1, 3, 1)  # g2 repeats g, s_flat reshapes s, mean2 repeats mean


def repeating() -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (8, 64))
    mean = b.reduce_mean(x, (1,), keepdims=True)
    centred = b.sub(x, b.broadcast_to(mean, (8, 64)))
    g = b.mul(b.tanh(centred), centred)
    s = b.add(g, x)
    b.output("g", g)
    b.output("mean", mean)
    b.output("g2", g)  # the same node again
    b.output("s", s)
    b.output("s_flat", b.reshape(s, (512,)))  # a reshape of the output `s`: the same bytes
    b.output("mean2", mean)
    return b.build()


def test_the_plan_says_which_output_each_repeats_and_why() -> None:
    graph = repeating()
    plan = plan_cluster(graph, 0, OPTIONS)
    assert plan.repeats == REPEATS
    assert [plan.repeat_of(j) for j in range(len(graph.outputs))] == list(REPEATS)
    reasons = {c.subject: c.reason for c in plan.choices if c.action == "repeat"}
    assert set(reasons) == {"output 2 'g2'", "output 4 's_flat'", "output 5 'mean2'"}
    assert reasons["output 2 'g2'"].startswith("the same node ") and "as output 0 'g'" in reasons["output 2 'g2'"]
    assert "reshapes the value of output 3 's'" in reasons["output 4 's_flat'"]
    assert plan.to_json()["repeats"] == list(REPEATS)  # dumped with the plan
    # planned for the outputs stored: no group computes the reshape only the repeat read
    reshape = dict(graph.outputs)["s_flat"]
    assert all(reshape not in (*g.roots, *g.inlined) for g in plan.groups)


def test_no_repeat_leaves_the_graph_and_the_plan_as_they_were() -> None:
    b = GraphBuilder()
    x = b.parameter("x", (4, 8))
    b.output("y", b.exp(x))
    b.output("x_flat", b.reshape(x, (32,)))  # a reshape of a parameter: the kernel copies it, no repeat
    b.output("x", x)  # a parameter: passthrough's, not a repeat
    graph = b.build()
    repeats, reasons = output_repeats(graph)
    assert repeats == (-1, -1, -1) and reasons == ()
    assert stored_graph(graph, repeats) is graph
    assert plan_cluster(graph, 0, OPTIONS).repeats == ()


def test_the_kernels_store_each_value_once() -> None:
    graph = repeating()
    plan = plan_cluster(graph, 0, OPTIONS)
    names = [name for name, _ in graph.outputs]
    # C: every output stays a parameter of the function (the op's positional contract); a repeat is never written
    source = cluster_source(graph, plan)
    outputs = [p for p in source.params if p.output]
    assert [p.name for p in outputs] == names
    written = {p.name for p in outputs if f"{p.cname}[" in source.text}
    assert written == {"g", "mean", "s"}
    # kernel IR (sim, cuda, cuda-cpu): a repeat names its source's buffer, which alone is a kernel parameter
    lowered = lower(graph, plan)
    assert lowered.repeats == REPEATS
    params = {b.name for k in lowered.kernels for b in k.params}
    buffers = dict(lowered.outputs)
    assert buffers["s_flat"] == buffers["s"] and buffers["g2"] == buffers["g"] and buffers["mean2"] == buffers["mean"]
    assert {buffers[n] for n in ("g", "mean", "s")} <= params and "out_s_flat" not in params
    # the GPU op's program: a repeat's NaN/Inf check is its source's (checked once, by output position)
    launch = plan_launches(graph, lowered)
    assert launch.repeats == REPEATS and launch.passthrough == (-1,) * 6
    count, *checks = launch.spec[-10:]  # the spec ends with its checks: their count, then (output, size, dtype)
    assert count == 3 and checks[::3] == [0, 1, 3]


@pytest.mark.parametrize("backend", ["sim", "cpu", "cuda-cpu"])
def test_every_backend_matches_the_reference(backend: str, tmp_path: Path) -> None:
    graph = repeating()
    plan = plan_cluster(graph, 0, OPTIONS)
    run = targets.load(backend, tmp_path).build(graph, plan)
    for seed in (0, 1):
        inputs = random_inputs(graph, seed)
        got = run(inputs)
        want = evaluate(graph, inputs)
        assert {name: np.shape(v) for name, v in got.items()} == {name: v.shape for name, v in want.items()}
        checks = check_outputs(got, want, evaluate(graph, inputs, "float64"))
        assert all(c.ok for c in checks.values()), {n: c.reason for n, c in checks.items() if not c.ok}
        np.testing.assert_array_equal(np.asarray(got["s_flat"]), np.asarray(got["s"]).reshape(-1))


def test_the_cpu_bridge_hands_a_repeat_out_as_a_view_the_pool_does_not_reuse(tmp_path: Path) -> None:
    """`CpuExecutable.run` (tf.numpy_function's path): a repeated output is a view of its source with its own
    shape. Held alone by a caller, it keeps its output set out of the pool: the next call must not overwrite it."""
    graph = repeating()
    executable = compile_cluster(graph, tmp_path, plan_cluster(graph, 0, OPTIONS))
    assert executable.repeats == REPEATS
    first = random_inputs(graph, 2)
    values, bad = executable.run([first["x"]])
    assert not bad
    assert np.shares_memory(values[4], values[3]) and values[4].shape == (512,)
    held = values[4]
    kept = held.copy()
    del values
    for seed in (3, 4, 5):  # more calls than the pool keeps sets
        executable.run([random_inputs(graph, seed)["x"]])
    np.testing.assert_array_equal(held, kept)
    np.testing.assert_allclose(held, evaluate(graph, first)["s_flat"], rtol=1e-5, atol=1e-6)
