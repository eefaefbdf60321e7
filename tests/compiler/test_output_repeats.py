"""Outputs that repeat an earlier output's value (plan/repeats.py): decided with reasons.

The graph is the transformer's GELU-backward pattern: one IR node listed twice among the outputs (two TF tensors
the frontend maps to it are read outside the cluster), a reduce_mean listed twice, and a reshape of an output.
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.plan.repeats import output_repeats, stored_graph

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
