"""A cluster's outputs do not depend on the order its tasks run in: the cpu backend's split reductions.

Input: clusters whose plan combines a split reduction atomically (split rows, column tiles over row splits), run
through their `_pooled` entry with runners that hand the tasks out in task order and in reverse (what TF's
intra-op pool does when two threads claim blocks: pool.h). Output: bitwise-equal outputs, equal to the entry's own
run, within the tolerance of the numpy reference (`evaluate`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, GraphBuilder
from stitchfleet.compiler.plan import Combine, PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.executable import CpuBackend, CpuExecutable, CpuOptions
from stitchfleet.compiler.tolerance import check_outputs

# csrc/helpers.h: sf_task_range and sf_runner
TASK_RANGE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
RUNNER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


def column_sums() -> Graph:
    """The bias gradient's shape: each column summed over 8192 rows (column tiles over row splits on `tiny`)."""
    b = GraphBuilder()
    x = b.parameter("x", (8192, 40))
    b.output("y", x * b.reduce_sum(x, (0,), keepdims=True))
    return b.build()


def row_sums() -> Graph:
    """One (64, 4096) slice summed (the row split into 4 tasks of 16 rows on `tiny`), the sum then used."""
    b = GraphBuilder()
    x = b.parameter("x", (1, 64, 4096))
    b.output("y", x * b.broadcast_to(b.reduce_sum(x, (1, 2), keepdims=True), (1, 64, 4096)))
    return b.build()


def cancelling(graph: Graph) -> dict[str, npt.NDArray[Any]]:
    """The 4 tasks' shares 2**24, 1, -2**24, 1: in float32, added in task order they make 1, in reverse 2 (the
    exact sum). A random sum of squares of this shape gave the same bits in both orders."""
    x = np.zeros((1, 64, 4096), np.float32)
    x[0, ::16, 0] = (2.0**24, 1.0, -(2.0**24), 1.0)
    return {"x": x}


def pooled_run(
    executable: CpuExecutable, inputs: dict[str, npt.NDArray[Any]], order: Callable[[int], range]
) -> npt.NDArray[np.float32]:
    """The `_pooled` entry with a runner that calls the loop's task `t` for each `t` of `order(tasks)`."""
    library = ctypes.CDLL(str(executable.library_path))
    pooled = getattr(library, f"{executable.source.function}_pooled")
    pooled.restype = ctypes.c_int
    pooled.argtypes = [ctypes.POINTER(ctypes.c_void_p), RUNNER, ctypes.c_void_p]

    def run(pool: int | None, tasks: int, cost: int, body: int, arg: int | None) -> None:
        del pool, cost
        task = TASK_RANGE(body)
        for t in order(tasks):
            task(arg, t, t + 1)

    given = [np.ascontiguousarray(inputs[name]) for name in executable.input_names]
    (shape,) = executable.output_shapes
    out = np.empty(shape, np.float32)
    buffers = (ctypes.c_void_p * (len(given) + 1))(*[a.ctypes.data for a in given], out.ctypes.data)
    assert pooled(buffers, RUNNER(run), None) == 0
    return out


def random(graph: Graph) -> dict[str, npt.NDArray[Any]]:
    return random_inputs(graph, 5)


@pytest.mark.parametrize(
    ("graph", "values"), [(column_sums(), random), (row_sums(), cancelling)], ids=["column_tiles", "split_row"]
)
def test_split_sums_do_not_depend_on_the_order_tasks_run(
    tmp_path: Path, graph: Graph, values: Callable[[Graph], dict[str, npt.NDArray[Any]]]
) -> None:
    """Regression: the plan's atomic combine was an `omp atomic` float add per task, so a value summed its tasks'
    shares in the order the tasks finished, and the same inputs gave other bits when TF's pool ran the blocks on two
    threads. In reverse order here, before the fix: 143895 of the 327680 column-case outputs differed in their
    last bits, and the split row's sum was 1 instead of 2."""
    plan = plan_cluster(graph, 0, PlanOptions(device="tiny"))
    assert any(g.combine is Combine.ATOMIC for g in plan.groups)  # the case this test is about
    executable = CpuBackend(CpuOptions(cache_dir=tmp_path)).compile_graph(graph, plan)
    inputs = values(graph)
    forward = pooled_run(executable, inputs, range)
    backward = pooled_run(executable, inputs, lambda n: range(n - 1, -1, -1))
    np.testing.assert_array_equal(backward.view(np.uint32), forward.view(np.uint32))
    np.testing.assert_array_equal(executable(inputs)["y"].view(np.uint32), forward.view(np.uint32))
    checks = check_outputs({"y": forward}, evaluate(graph, inputs), evaluate(graph, inputs, "float64"))
    assert all(v.ok for v in checks.values()), {n: v.reason for n, v in checks.items()}
