"""The CPU dry run's runner: our programs on the `sim` backend, frameworks on the CPU, the wall clock.

Input: `Program`s and host inputs. Output: timing `Variant`s, a copy-bandwidth figure
(numpy copy of a host buffer) and the references (`evaluate`, native and float64).
Figures from it are CPU figures of a simulator: they check the plumbing, nothing more.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.harness import frameworks
from benchmarks.harness.programs import Program
from benchmarks.harness.timing import Variant
from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.targets.sim.interpreter import SimBackend

Array = npt.NDArray[Any]


def run_program(program: Program, executables: list[Any], inputs: Mapping[str, Array]) -> dict[str, Array]:
    """Every step on host arrays; returns every value by name."""
    values = {f"in:{n}": np.asarray(v) for n, v in inputs.items()}
    for step, exe in zip(program.steps, executables, strict=True):
        raw = exe({buf: values[v].reshape(-1) for buf, v in step.inputs})
        for buf, v in step.outputs:
            values[v] = raw[buf].reshape(program.values[v][0])
    return values


class SimRunner:
    """See the module docstring."""

    clock = "wall clock (time.perf_counter), sim backend"

    def __init__(self, torch_backend: str = "eager") -> None:
        self.backend = SimBackend()
        self.torch_backend = torch_backend

    @property
    def device_name(self) -> str:
        return f"cpu-dryrun-{platform.machine()}"

    def program(self, program: Program, graph: Graph, inputs: Mapping[str, Array]) -> Variant:
        executables = [self.backend.compile(s.kernels) for s in program.steps]
        state: dict[str, dict[str, Array]] = {}

        def call() -> object:
            state["values"] = run_program(program, executables, inputs)
            return None

        def read() -> dict[str, Array]:
            return {n: state["values"][v] for n, v in program.outputs}

        return Variant(program.name, call, lambda _: None, read, program.kernel_count)

    def frameworks(self, graph: Graph, inputs: Mapping[str, Array]) -> list[Variant | None]:
        tensors = frameworks.torch_tensors(graph, inputs, "cpu") if frameworks.available("torch") else {}
        return [frameworks.jax_variant(graph, inputs), frameworks.torch_variant(graph, tensors, self.torch_backend)]

    def sample(self, variant: Variant, reps: int) -> float:
        started = time.perf_counter()
        out: object = None
        for _ in range(reps):
            out = variant.call()
        variant.finish(out)
        return (time.perf_counter() - started) / reps

    def copy_bandwidth(self, nbytes: int = 1 << 26, runs: int = 5) -> dict[str, float]:
        src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - started)
        best = float(np.median(times))
        return {"bytes": float(2 * src.nbytes), "median_s": best, "gbps": 2 * src.nbytes / best / 1e9}

    def references(
        self, graph: Graph, inputs: Mapping[str, Array], check_max_bytes: int, io: int
    ) -> tuple[str, dict[str, Array], dict[str, Array]]:
        return "evaluate", evaluate(graph, inputs), evaluate(graph, inputs, "float64")
