"""Sweeps of the cuda-cpu tier: suite cases, workload clusters and random graphs, many kernels to a unit.

Not a test module: the tests import it, and `python -m tests.compiler.targets.cuda_cpu.sweep`
prints the figures benchmarks/README.md quotes. Input: cases (a cluster graph, plan options,
an input seed). Output: per case, the tolerance output_checks against `evaluate` of a run with one
block at a time in index order (reproducible, atomics included: the sim's order), and, when
asked, the checks a GPU cannot make: the same bits with shared memory starting as 0x00
instead of 0xff (a read of shared memory no thread wrote), the same bits with the fibers of
every block reshuffled every round and the blocks in a shuffled order (a missing barrier;
atomic-free programs only, as atomics legitimately sum in another order), and how many
outputs equal the sim's bit for bit.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import Graph, load
from stitchfleet.compiler.lower import Lowered, lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cuda.render import kernel_text, render_kernel
from stitchfleet.compiler.targets.cuda.signature import has_grid_sync
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend, CudaCpuProgram
from stitchfleet.compiler.targets.sim.interpreter import run as run_sim
from stitchfleet.compiler.tolerance import OutputCheck, check_outputs
from tests.compiler.test_stitch_sim import SMALL

Array = npt.NDArray[Any]
WORKLOADS = Path(__file__).resolve().parents[4] / "benchmarks" / "workloads"
INDEX_ORDER, SHUFFLED, BLOCK_SEED, OTHER_FILL = 0, 2, 7, 0x00


@dataclass(frozen=True)
class Case:
    """One cluster graph to compile with `options` and run on inputs drawn with `seed`."""

    label: str
    graph: Graph
    options: PlanOptions
    seed: int = 0

    def lowered(self) -> Lowered:
        return lower(self.graph, plan_cluster(self.graph, 0, self.options))


@dataclass
class Outcome:
    """What one case's run showed; empty `failures`/`order_diffs`/`fill_diffs` mean it passed."""

    label: str
    outputs: int
    failures: dict[str, str]
    order_diffs: list[str] = field(default_factory=list)
    fill_diffs: list[str] = field(default_factory=list)
    order_checked: bool = False  # the other-order rerun ran (atomic-free programs only)
    sim_equal: int = 0
    sim_max_rel: float = 0.0


def buffers_of(case: Case, lowered: Lowered) -> dict[str, Array]:
    inputs = random_inputs(case.graph, case.seed)
    return {buf: np.asarray(inputs[name]).reshape(-1) for name, buf in lowered.inputs}


def has_atomics(lowered: Lowered) -> bool:
    # Atomics in another thread or block order sum in another order: other bits, legitimately.
    return any("sf_atomic_" in kernel_text(render_kernel(k)) for k in lowered.kernels)


def differing(first: dict[str, Array], second: dict[str, Array], lowered: Lowered) -> list[str]:
    return [name for name, buf in lowered.outputs if not np.array_equal(first[buf], second[buf], equal_nan=True)]


def _rel(a: Array, b: Array) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = max(float(np.nanmax(np.abs(b64), initial=0.0)), 1e-30)
    return float(np.nanmax(np.abs(a64 - b64), initial=0.0)) / scale


def design_rule(
    graph: Graph,
    inputs: Mapping[str, Any],
    got: Mapping[str, object],
    native: Mapping[str, object],
    reference: Mapping[str, object],
) -> dict[str, OutputCheck]:
    """The DESIGN rule as `stitchfleet compile` applies it: 8 x the unfused float32 result's error, with the
    backward-stability allowance (float64 re-evaluations on inputs with float32 noise) for an output that
    misses it. Without that second look, one scalar sum of 1,280 terms (dien cluster_71's `add.1704`,
    `mul.1706`) failed in the FMA build's index order: numpy's unfused sum is nearly exact there by chance."""
    return check_outputs(got, native, reference, perturbed=lambda draw: evaluate(graph, inputs, "float64", noise=draw))


def judge(case: Case, got: Mapping[str, object]) -> dict[str, OutputCheck]:
    """`design_rule` on the case's own inputs."""
    inputs = random_inputs(case.graph, case.seed)
    return design_rule(case.graph, inputs, got, evaluate(case.graph, inputs), evaluate(case.graph, inputs, "float64"))


def check_case(case: Case, lowered: Lowered, program: CudaCpuProgram, *, strict: bool, sim: bool) -> Outcome:
    """Runs one compiled case as `program`'s options say; `strict` adds the other-fill and other-order reruns."""
    buffers = buffers_of(case, lowered)
    raw = program(buffers)
    shapes = {name: case.graph.node(node).shape for name, node in case.graph.outputs}
    got = {name: raw[buf].reshape(shapes[name]) for name, buf in lowered.outputs}
    output_checks = judge(case, got)
    outcome = Outcome(case.label, len(lowered.outputs), {n: v.reason for n, v in output_checks.items() if not v.ok})
    if strict:
        outcome.fill_diffs = differing(raw, program.with_options(fill=OTHER_FILL)(buffers), lowered)
    if strict and not has_atomics(lowered):
        outcome.order_checked = True
        reordered = program.with_options(order=SHUFFLED, blocks=BLOCK_SEED)(buffers)
        outcome.order_diffs = differing(raw, reordered, lowered)
    if sim:
        ref = run_sim(lowered.kernels, buffers)
        outcome.sim_equal = sum(int(np.array_equal(raw[b], ref[b], equal_nan=True)) for _, b in lowered.outputs)
        outcome.sim_max_rel = max((_rel(raw[b], ref[b]) for _, b in lowered.outputs if raw[b].size), default=0.0)
    return outcome


def run_cases(
    backend: CudaCpuBackend, cases: Sequence[Case], *, strict: bool = True, sim: bool = False
) -> list[Outcome]:
    """Every case compiled (kernels packed into a few units), run and checked."""
    lowered = [case.lowered() for case in cases]
    programs = backend.compile_many([low.kernels for low in lowered])
    return [
        check_case(case, low, program.with_options(blocks=INDEX_ORDER), strict=strict, sim=sim)
        for case, low, program in zip(cases, lowered, programs, strict=True)
    ]


def problems(outcomes: Sequence[Outcome]) -> dict[str, str]:
    """Every failed check by case label (empty: all passed)."""
    found: dict[str, str] = {}
    for o in outcomes:
        parts = [f"tolerance {o.failures}"] if o.failures else []
        parts += [f"differs with fibers and blocks in other orders: {o.order_diffs}"] if o.order_diffs else []
        parts += [f"differs with shared memory starting as 0x00: {o.fill_diffs}"] if o.fill_diffs else []
        if parts:
            found[o.label] = "; ".join(parts)
    return found


def clusters(graph: Graph) -> list[Graph]:
    return [extract(graph, c.nodes) for c in find_clusters(graph, 8).clusters]


def suite_cases(profile: str = "tiny") -> list[Case]:
    """Every suite case in every dtype at its small shape, each cluster planned for `profile`."""
    return [
        Case(f"suite {name} {dtype} #{i}", sub, PlanOptions(device=profile))
        for name in sorted(SMALL)
        for dtype in CASES[name].dtypes
        for i, sub in enumerate(clusters(build_case(name, SMALL[name], dtype)))
    ]


def workload_cases(profile: str = "tiny") -> list[Case]:
    """Every saved cluster of the workload graphs (benchmarks/workloads/<model>/cluster_*.json)."""
    return [
        Case(f"{path.parent.name}/{path.stem}", load(path), PlanOptions(device=profile))
        for path in sorted(WORKLOADS.glob("*/cluster_*.json"))
    ]


@functools.cache
def lowered_workloads(profile: str = "tiny") -> tuple[tuple[Case, Lowered], ...]:
    """Every workload case with its lowered program, made once per process (~4 s for the 145): the slices
    below each look at all of them."""
    return tuple((case, case.lowered()) for case in workload_cases(profile))


def workload_slice(profile: str = "tiny", *, plain_graphs: int | None = None) -> list[Case]:
    """Per workload graph: its first cluster with a grid barrier, and its first without one. With `plain_graphs`, a
    graph past the first that many (in name order) keeps only its barrier cluster, when it has one."""
    chosen: dict[tuple[str, bool], Case] = {}
    for case, lowered in lowered_workloads(profile):
        barrier = any(has_grid_sync(k.body) for k in lowered.kernels)  # what render_kernel's grid_barrier says
        chosen.setdefault((case.label.split("/")[0], barrier), case)
    if plain_graphs is not None:
        graphs = sorted({graph for graph, _ in chosen})
        cut = {graph for graph in graphs[plain_graphs:] if (graph, True) in chosen}
        chosen = {key: case for key, case in chosen.items() if key[1] or key[0] not in cut}
    return [chosen[key] for key in sorted(chosen)]


def _print_figures(title: str, outcomes: Sequence[Outcome], seconds: float) -> None:
    outputs = sum(o.outputs for o in outcomes)
    equal = sum(o.sim_equal for o in outcomes)
    ordered = sum(o.order_checked for o in outcomes)
    worst = max((o.sim_max_rel for o in outcomes), default=0.0)
    print(
        f"{title}: {len(outcomes)} clusters, {outputs} outputs, tolerance failures "
        f"{sum(bool(o.failures) for o in outcomes)}, differ with a 0x00 fill "
        f"{sum(bool(o.fill_diffs) for o in outcomes)}, atomic-free clusters rerun in other orders {ordered} "
        f"(differ: {sum(bool(o.order_diffs) for o in outcomes)}), bit-equal with sim {equal}/{outputs} "
        f"({equal / max(outputs, 1):.0%}), max rel diff vs sim {worst:.2g}, {seconds:.1f} s"
    )
    for label, why in problems(outcomes).items():
        print(f"  {label}: {why}")


def fma_shift(cache: Path, cases: Sequence[Case]) -> str:
    """How far outputs move when g++ may contract a*b+c into one FMA (the default build, as NVRTC's default)."""
    lowered = [case.lowered() for case in cases]
    plain = CudaCpuBackend(cache, fma=False).compile_many([low.kernels for low in lowered])
    fused = CudaCpuBackend(cache).compile_many([low.kernels for low in lowered])
    outputs = equal = failed = 0
    worst = 0.0
    for case, low, one, other in zip(cases, lowered, plain, fused, strict=True):
        buffers = buffers_of(case, low)
        a, b = one.with_options(blocks=INDEX_ORDER)(buffers), other.with_options(blocks=INDEX_ORDER)(buffers)
        outputs += len(low.outputs)
        equal += len(low.outputs) - len(differing(a, b, low))
        worst = max([worst, *(_rel(b[buf], a[buf]) for _, buf in low.outputs if a[buf].size)])
        failed += bool(check_case(case, low, other.with_options(blocks=INDEX_ORDER), strict=False, sim=False).failures)
    return (
        f"fma build vs plain build: {outputs} outputs, {equal} bit-equal ({equal / max(outputs, 1):.0%}), "
        f"max rel diff {worst:.2g}, clusters failing the tolerance rule with fma {failed}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sets", nargs="*", default=["suite", "workloads"], choices=["suite", "workloads"])
    parser.add_argument("--cache", type=Path, default=Path(".cuda-cpu-sweep-cache"))
    parser.add_argument("--profile", default="tiny")
    parser.add_argument(
        "--fma", action="store_true", help="compare the default (FMA) build with one without contraction"
    )
    parser.add_argument("--no-sim", action="store_true", help="skip the bit comparison with the sim")
    args = parser.parse_args(argv)
    backend = CudaCpuBackend(args.cache, debug=True)
    for name in args.sets:
        cases = suite_cases(args.profile) if name == "suite" else workload_cases(args.profile)
        if args.fma:
            print(f"{name} on {args.profile}: {fma_shift(args.cache, cases)}")
            continue
        start = time.perf_counter()
        outcomes = run_cases(backend, cases, sim=not args.no_sim)
        _print_figures(f"{name} on {args.profile}", outcomes, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
