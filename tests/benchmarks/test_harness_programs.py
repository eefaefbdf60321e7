"""Our two programs per benchmark graph: stitch and per_op, built by the real planner, run on the sim."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.harness.cases import TINY, BenchCase, select, suite_cases, workload_cases
from benchmarks.harness.programs import op_graph, per_op_program, per_op_roots, stitch_program
from benchmarks.harness.sim_runner import run_program
from stitchfleet.compiler.baselines import per_op
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op
from stitchfleet.compiler.scope import Cluster
from stitchfleet.compiler.targets.sim.interpreter import SimBackend
from stitchfleet.compiler.tolerance import check_outputs

SUITE = {c.name: c.graph for c in suite_cases(tiny=True)}


def _sim_outputs(graph: Graph, program_name: str) -> dict[str, np.ndarray]:
    program = stitch_program(graph) if program_name == "stitch" else per_op_program(graph)
    backend = SimBackend()
    values = run_program(program, [backend.compile(s.kernels) for s in program.steps], random_inputs(graph, 5))
    return {name: values[v] for name, v in program.outputs}


def _assert_matches_evaluate(graph: Graph, got: dict[str, np.ndarray]) -> None:
    inputs = random_inputs(graph, 5)
    verdicts = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in verdicts.values()), {n: v.reason for n, v in verdicts.items() if not v.ok}


def _baseline_per_op_count(graph: Graph) -> int:
    members = tuple(n.id for n in graph.nodes if n.op is not Op.PARAMETER)
    return per_op(graph, Cluster(0, members, (members,), (), ())).kernel_count


@pytest.mark.parametrize("name", sorted(SUITE))
@pytest.mark.parametrize("program", ["stitch", "per_op"])
def test_program_on_sim_matches_evaluate(name: str, program: str) -> None:
    _assert_matches_evaluate(SUITE[name], _sim_outputs(SUITE[name], program))


def test_every_suite_case_has_a_tiny_shape() -> None:
    assert {c.graph.metadata["case"] for c in suite_cases(tiny=True)} == set(TINY)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_kernel_counts_stitch_one_per_op_as_the_baseline_counts(name: str) -> None:
    graph = SUITE[name]
    assert stitch_program(graph).kernel_count == 1
    assert per_op_program(graph).kernel_count == _baseline_per_op_count(graph)


def test_workload_per_op_counts_add_one_kernel_per_free_output_only() -> None:
    for case in workload_cases():
        graph = case.graph
        free_outputs = {i for i in graph.output_ids if graph.node(i).op in (Op.RESHAPE, Op.BROADCAST)}
        assert per_op_program(graph).kernel_count == _baseline_per_op_count(graph) + len(free_outputs), case.name


def test_op_kernel_inlines_broadcasts_and_constants_but_writes_only_the_op() -> None:
    b = GraphBuilder()
    x, bias = b.parameter("x", (4, 8)), b.parameter("bias", (8,))
    shifted = x + b.broadcast(bias, (4, 8), (1,))
    b.output("y", shifted * 2.0)
    b.output("flat", b.reshape(shifted, (32,)))
    graph = b.build()
    add = next(n.id for n in graph.nodes if n.op is Op.ADD)
    sub, inputs = op_graph(graph, add)
    assert [graph.node(i).op for i in inputs] == [Op.PARAMETER, Op.PARAMETER]
    assert [n.op for n in sub.nodes].count(Op.BROADCAST) == 1 and [name for name, _ in sub.outputs] == ["r"]
    roots = [graph.node(r).op for r in per_op_roots(graph)]
    assert roots == [Op.ADD, Op.MUL, Op.RESHAPE]  # the constant and the broadcast launch nothing
    _assert_matches_evaluate(graph, _sim_outputs(graph, "per_op"))


def test_selection_filters_by_name_and_bytes() -> None:
    cases = list(suite_cases())
    small = select(iter(cases), ["softmax_fwd"], max_bytes=10_000_000)
    assert small and all("softmax_fwd" in c.name and c.io_bytes <= 10_000_000 for c in small)
    assert {c.name for c in small} == {
        "softmax_fwd_4096x256_f16",
        "softmax_fwd_4096x256_f32",
        "softmax_fwd_4096x512_f16",
    }
    assert all(isinstance(c, BenchCase) for c in select(iter(cases)))
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        select(iter(cases), max_bytes=0)
