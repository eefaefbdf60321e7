"""Shapes of generated C that decide whether gcc vectorises (measured in benchmarks/results/cpu-*.md):
value chunks before widening folds, row functions hoisted, bit selects on uint8 masks, split rows in
whole runs of the last dimension; each checked on the source and against the reference."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.plan import MappingKind, PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import BASE_FLAGS, compile_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.tolerance import check_outputs


def source(graph: Graph) -> str:
    text = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text
    return text[text.index("struct f_tasks") :]


def matches(graph: Graph, tmp_path: Path, seed: int = 5) -> None:
    inputs = random_inputs(graph, seed)
    got = compile_cluster(graph, tmp_path, plan_cluster(graph, 0, PlanOptions()))(inputs)
    output_checks = check_outputs(got, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in output_checks.values()), {n: v.reason for n, v in output_checks.items()}


def row_sum(value: str) -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (64, 256))
    b.output("s", b.reduce_sum(b.exp(x) if value == "exp" else b.mul(x, 3.0), (1,)))
    return b.build()


def test_a_function_chain_is_computed_in_a_chunk_before_the_widening_fold(tmp_path: Path) -> None:
    assert "vals_" in source(row_sum("exp"))
    matches(row_sum("exp"), tmp_path)


def test_plain_arithmetic_folds_in_the_same_loop() -> None:
    assert "vals_" not in source(row_sum("mul"))


def cross_entropy(rows: int = 16, cols: int = 512) -> Graph:
    b = GraphBuilder()
    logits, labels = b.parameter("logits", (rows, cols)), b.parameter("labels", (rows, cols))
    top = b.reduce_max(logits, (1,), keepdims=True)
    total = b.reduce_sum(b.exp(b.sub(logits, b.broadcast_to(top, (rows, cols)))), (1,), keepdims=True)
    shift = b.add(b.log(total), top)
    loss = b.reduce_sum(b.mul(labels, b.sub(b.broadcast_to(shift, (rows, cols)), logits)), (1,))
    b.output("loss", loss)
    return b.build()


def test_the_log_of_a_row_sum_runs_once_per_row_not_per_element(tmp_path: Path) -> None:
    lines = source(cross_entropy()).splitlines()
    logs = [ln for ln in lines if "= sf_logf(" in ln]
    loops = [ln for ln in lines if ln.lstrip().startswith("for (; i_")]
    assert logs and loops
    depth = {len(ln) - len(ln.lstrip()) for ln in loops}
    # the 16-lane tail loop recomputes it too; the main chunk loop does not
    assert any(len(ln) - len(ln.lstrip()) in depth for ln in logs)
    matches(cross_entropy(), tmp_path)


def masked(shape: tuple[int, ...] = (32, 64)) -> Graph:
    b = GraphBuilder()
    x, y, keep = b.parameter("x", shape), b.parameter("y", shape), b.parameter("keep", shape, "bool")
    b.output("z", b.select(keep, x, y))
    return b.build()


def test_a_select_on_a_bool_mask_keeps_the_chosen_bits_exactly(tmp_path: Path) -> None:
    graph = masked()
    text = source(graph)
    assert "sf_sel_float(" in text and "const uint8_t *restrict in2_keep" in text
    rng = np.random.default_rng(0)
    payload = np.full((32, 64), 0x7FC01234, np.uint32).view(np.float32)  # a NaN with a payload
    x = np.where(rng.random((32, 64)) < 0.3, payload, rng.standard_normal((32, 64)).astype(np.float32))
    y = rng.standard_normal((32, 64)).astype(np.float32)
    keep = rng.random((32, 64)) < 0.5
    got = compile_cluster(graph, tmp_path)({"x": x, "y": y, "keep": keep})["z"]
    assert np.array_equal(got.view(np.uint32), np.where(keep, x, y).view(np.uint32))


def full_sum(shape: tuple[int, ...] = (8, 16, 96)) -> Graph:
    """sum over everything of x * broadcast(b[rows]): a flat split-row reduction with broadcast index math."""
    b = GraphBuilder()
    x, small = b.parameter("x", shape), b.parameter("b", shape[:1])
    b.output("s", b.reduce_sum(b.mul(x, b.broadcast(small, shape, (0,))), tuple(range(len(shape)))))
    return b.build()


def test_a_split_row_reduction_walks_whole_runs_of_the_last_dimension(tmp_path: Path) -> None:
    graph = full_sum()
    plan = plan_cluster(graph, 0, PlanOptions())
    assert any(g.mapping.kind is MappingKind.SPLIT_ROW for g in plan.groups)
    text = source(graph)
    assert "for (int64_t o_" in text
    inner = text[text.index("for (int64_t o_") :]
    assert " % 1536L" not in inner and " / 1536L" not in inner.split("part_")[0]
    matches(graph, tmp_path)


def test_a_last_dimension_shorter_than_the_lanes_keeps_the_flat_range(tmp_path: Path) -> None:
    graph = full_sum((64, 48, 3))
    assert "for (int64_t o_" not in source(graph)
    matches(graph, tmp_path)


def test_a_row_of_fewer_runs_than_tasks_is_split_evenly(tmp_path: Path) -> None:
    """Regression: a (1, N) row summed over its last axis is one run of the last dimension; walked as whole runs,
    task 0 took the whole row and the other tasks nothing. Split flat, every task takes ceil(N / tasks)."""
    b = GraphBuilder()
    x = b.parameter("x", (1, 1 << 20))
    b.output("s", b.reduce_sum(b.mul(x, x), (1,)))
    graph = b.build()
    (group,) = [g for g in plan_cluster(graph, 0, PlanOptions()).groups if g.mapping.kind is MappingKind.SPLIT_ROW]
    tasks = group.mapping.blocks_per_row
    assert tasks > 1
    text = source(graph)
    assert "for (int64_t o_" not in text
    assert f"(t % {tasks}L) * {-(-(1 << 20) // tasks)}L" in text
    matches(graph, tmp_path)


def test_small_integer_powers_are_products_not_pow_calls(tmp_path: Path) -> None:
    """Regression: tanh-GELU's x**3 went through libm's scalar powf (transformer cluster 55 ms vs 3 ms)."""
    b = GraphBuilder()
    x = b.parameter("x", (32, 64))
    b.output("cube", b.pow(x, 3.0))
    b.output("root", b.pow(b.square(x), 0.5))
    graph = b.build()
    text = source(graph)
    assert "powf(" in text  # x**0.5 keeps pow's special cases
    assert text.count("powf(") == 1
    matches(graph, tmp_path)


def vectorised_loops(c_file: Path, flags: list[str]) -> int:
    argv = ["cc", *flags, "-march=native", "-c", str(c_file), "-o", str(c_file.with_suffix(".o")), "-fopt-info-vec"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return done.stderr.count("loop vectorized")


def test_loops_calling_our_log_vectorise(tmp_path: Path) -> None:
    """Regression: with gcc's default -ftrapping-math no loop calling sf_logf vectorised ("control flow
    in loop": both sides of its selects may not be computed); the backend compiles without it."""
    b = GraphBuilder()
    b.output("l", b.log(b.parameter("x", (64, 256))))
    graph = b.build()
    c_file = tmp_path / "log.c"
    c_file.write_text(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    ours = [f for f in BASE_FLAGS if f not in ("-shared", "-fPIC")]
    trapping = [f if f != "-fno-trapping-math" else "-ftrapping-math" for f in ours]
    assert vectorised_loops(c_file, ours) > vectorised_loops(c_file, trapping)


def softmax(rows: int = 64, cols: int = 32) -> Graph:
    b = GraphBuilder()
    x = b.parameter("x", (rows, cols))
    top = b.broadcast_to(b.reduce_max(x, (1,), keepdims=True), (rows, cols))
    e = b.exp(b.sub(x, top))
    b.output("y", b.div(e, b.broadcast_to(b.reduce_sum(e, (1,), keepdims=True), (rows, cols))))
    return b.build()


def test_the_lanes_of_a_row_max_fold_as_vectors(tmp_path: Path) -> None:
    """Regression: gcc 12 unrolled the 16 lanes' tree of a float max into scalar compares and branches on the
    data (NaN-propagating `sf_max_float`), ~8 mispredicted branches a row: an attention softmax of 2048 rows of
    32 ran 93.8 us a call where the vector folds take 81.1. Each level of the tree is a vectorised loop now."""
    graph = softmax()
    c_file = tmp_path / "softmax.c"
    c_file.write_text(cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f").text)
    lines = c_file.read_text().splitlines()
    levels = {n: i + 1 for i, ln in enumerate(lines) for n in (8, 4) if f"l < {n}; ++l) lane_" in ln and "sf_max" in ln}
    assert set(levels) == {8, 4}
    flags = [f for f in BASE_FLAGS if f not in ("-shared", "-fPIC")]
    argv = ["cc", *flags, "-march=native", "-c", str(c_file), "-o", str(tmp_path / "softmax.o"), "-fopt-info-vec"]
    report = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stderr
    vectorised = {int(m.split(":")[1]) for m in report.splitlines() if "loop vectorized" in m}
    assert set(levels.values()) <= vectorised
    matches(graph, tmp_path)


def residual_rows(rows: int = 64, cols: int = 128) -> Graph:
    """x + (y + bias), written as a `(1, rows, cols, 1)` reshape (how TF's layer norm takes a layer's rows)."""
    b = GraphBuilder()
    x, y, bias = b.parameter("x", (rows, cols)), b.parameter("y", (rows, cols)), b.parameter("bias", (cols,))
    total = b.add(x, b.add(y, b.broadcast_to(bias, (rows, cols))))
    b.output("r", b.reshape(total, (1, rows, cols, 1)))
    return b.build()


def test_trailing_unit_dimensions_keep_the_row_and_column_loops(tmp_path: Path) -> None:
    """Regression: a fused loop whose first root ends in a dimension of 1 was iterated flat, and the bias's index
    stayed `c % 128` per element, which gcc leaves scalar (the transformer's residual add 30.5 us, 8.4 with rows)."""
    graph = residual_rows()
    text = source(graph)
    assert "(8192 elements as 64 x 128)" in text
    assert "% 128L" not in text
    matches(graph, tmp_path)
