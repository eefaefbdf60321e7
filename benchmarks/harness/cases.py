"""Which graphs a benchmark run covers: suite cases (real or tiny shapes) and workload clusters.

Input: the suite table (`benchmarks.suite.CASES`), the workload folders, and filters
(case-name substrings, an IO-bytes ceiling). Output: `BenchCase` items, each a
standalone graph with its name, source and IO bytes, in a stable order (smallest
shapes of all cases first, so a run cut short still covers every case at some size).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suite import CASES, build_case, file_name, io_bytes
from stitchfleet.compiler.ir import Graph, load

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"

# Tiny shapes for the CPU dry run and the translator tests: every code path, seconds on the sim.
TINY: dict[str, tuple[int, ...]] = {
    "layernorm_fwd": (8, 96),
    "layernorm_bwd": (8, 96),
    "rmsnorm_fwd": (8, 64),
    "rmsnorm_bwd": (8, 64),
    "softmax_fwd": (8, 64),
    "softmax_bwd": (6, 100),
    "attention_softmax": (2, 2, 8, 8),
    "bias_gelu_fwd": (8, 48),
    "gelu_bwd_bias_grad": (12, 24),
    "dropout_residual_layernorm": (6, 40),
    "cross_entropy_fwd": (16, 50),
    "astitch_fig7": (2, 128),
    "many_short_rows": (100, 32),
    "few_long_rows": (2, 700),
    "bert_layernorm_residual": (4, 96),
}


@dataclass(frozen=True)
class BenchCase:
    name: str  # file-style name: case_shape_dtype, or workload/cluster_NN
    source: str  # "suite" or "workload"
    graph: Graph

    @property
    def io_bytes(self) -> int:
        return int(str(self.graph.metadata.get("io_bytes", io_bytes(self.graph))))


def suite_cases(tiny: bool = False) -> Iterator[BenchCase]:
    """Every suite case at every listed shape and dtype (or once per dtype at its tiny shape).

    Round by round: first every case at its smallest shape, then every case at its next
    one..., so a run cut short by its time budget still covers every case.
    """
    plan: list[tuple[int, int, str, tuple[int, ...], str]] = []
    for order, case in enumerate(CASES.values()):
        shapes: Sequence[tuple[int, ...]] = (TINY[case.name],) if tiny else sorted(case.shapes, key=math.prod)
        plan += [(rank, order, case.name, shape, dtype) for rank, shape in enumerate(shapes) for dtype in case.dtypes]
    for _, _, name, shape, dtype in sorted(plan, key=lambda item: item[:2]):
        yield BenchCase(file_name(name, shape, dtype).removesuffix(".json"), "suite", build_case(name, shape, dtype))


def workload_cases(root: Path = WORKLOADS) -> Iterator[BenchCase]:
    """Every saved workload cluster (`<model>/cluster_NN.json`), at the shapes it was extracted with."""
    for path in sorted(root.glob("*/cluster_*.json")):
        yield BenchCase(f"{path.parent.name}/{path.stem}", "workload", load(path))


def select(cases: Iterator[BenchCase], patterns: Sequence[str] = (), max_bytes: int | None = None) -> list[BenchCase]:
    """Cases whose name contains any pattern (all when none) and whose IO bytes fit under max_bytes."""
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    return [
        c
        for c in cases
        if (not patterns or any(p in c.name for p in patterns)) and (max_bytes is None or c.io_bytes <= max_bytes)
    ]
