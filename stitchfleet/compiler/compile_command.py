"""What `stitchfleet compile FILE` does: load, run the pipeline, print, optionally evaluate.

Input: the file path (or, from the CLI's GraphDef path through the TF frontend, a
`Graph` and its op origins), report format, device and the settings the CLI read (remote stitch budget,
dump directory, and the kernel cache directory for `cpu`). Output: text on stdout/stderr
and an exit status (0 ok, 1 a check failed, 2 bad input). `reference` evaluates the graph on random inputs natively
and in float64 (each cluster instead where the graph holds ops evaluate has no meaning for: a
convolution) and checks the outputs with the tolerance rule. Every target whose profile
says `checks_here` (the target registry, compiler/targets: sim, cpu, cuda-cpu) runs every
cluster's stitched code (planned for the h200 profile) on random inputs of the cluster's own,
and checks each cluster output against evaluate of the cluster (with the rule's
backward-stability allowance: evaluate in float64 on perturbed inputs): the rest of the
graph is never evaluated, so opaque ops (random draws, GEMMs) do not matter.
The report carries the coverage figure (coverage.py) and, with `--ptxas ARCH`, what ptxas made of
every stitched kernel (`kernel_resources`: registers, spills, shared memory, occupancy against the
blocks per SM its plan needs, grid-barrier headroom; compiler/targets/cuda/resources.py, needs nvcc).
With `--report json` stdout holds the JSON document only; the check lines go to stderr.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from stitchfleet.compiler import ir, targets
from stitchfleet.compiler.coverage import Coverage, measure
from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.evaluate import EvaluationError, OpaqueError, evaluate, random_inputs
from stitchfleet.compiler.pipeline import SOURCE_TARGETS, Artifacts, Options, compile_graph
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.report import CompileReport, format_table
from stitchfleet.compiler.tolerance import check, check_outputs

if TYPE_CHECKING:
    from stitchfleet.compiler.targets.cuda.resources import GateRow

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2
DEVICES = ("reference", *targets.names(checks_here=True))
GRAPHDEF_SUFFIXES = (".pb", ".pbtxt")


def _fail(message: str) -> int:
    print(f"stitchfleet compile: {message}", file=sys.stderr)
    return EXIT_USAGE


def _check_reference(art: Artifacts, out: TextIO) -> int:
    """The whole graph native vs float64; per cluster when the graph holds ops evaluate has no meaning for."""
    graph = art.graph
    try:
        return _reference_outputs(graph, random_inputs(graph, seed=0), "", out)
    except OpaqueError as err:
        print(f"reference evaluation per cluster (not of the whole graph: {err}):", file=out)
    except EvaluationError as err:
        return _fail(f"reference evaluation failed: {err}")
    status = EXIT_OK
    for index, cluster in enumerate(art.cluster_graphs):
        try:
            checked = _reference_outputs(cluster, random_inputs(cluster, seed=index), f"cluster {index} ", out)
        except EvaluationError as err:
            return _fail(f"reference evaluation of cluster {index} failed: {err}")
        status = max(status, checked)
    return status


def _reference_outputs(graph: ir.Graph, inputs: dict[str, Any], label: str, out: TextIO) -> int:
    native, reference = evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    status = EXIT_OK
    if not label:
        print("reference evaluation on random inputs (native vs float64):", file=out)
    for name, value in native.items():
        output_check = check(value, value, reference[name])
        status = status if output_check.ok else EXIT_MISMATCH
        state = "ok" if output_check.ok else f"FAIL: {output_check.reason}"
        shape = f"{list(value.shape)!s:<20}"
        print(
            f"  {label}{name:<24} {value.dtype!s:<8} {shape} error {output_check.native_error:.3g}  {state}", file=out
        )
    return status


def load(path: str) -> ir.Graph | int:
    """The IR graph in an IR JSON file, or the exit status after saying why it cannot be read."""
    source = Path(path)
    if source.suffix in GRAPHDEF_SUFFIXES:
        return _fail(f"{path}: GraphDef input needs the TensorFlow frontend (stitchfleet.plugin); give IR JSON")
    try:
        return ir.load(source)
    except OSError as err:
        return _fail(f"cannot read {path}: {err.strerror}")
    except ir.IRError as err:
        return _fail(str(err))


def check_device(device: str | None) -> int | None:
    """None when the device can be used, else the exit status after saying why not."""
    if device is not None and device not in DEVICES:
        return _fail(f"device {device!r} is not available (devices: {', '.join(DEVICES)})")
    return None


def run_graph(
    graph: ir.Graph,
    report_format: str,
    device: str | None,
    remote_budget: int,
    dump_dir: str | None,
    *,
    cache_dir: Path | None = None,
    origins: frozenset[int] | None = None,
    ptxas: str | None = None,
) -> int:
    """Compiles a graph already in memory (from IR JSON or from the TF frontend, with its op origins) and
    prints the report; `ptxas` (an arch, `sm_90`) adds every kernel's ptxas figures to it."""
    bad_device = check_device(device)
    if bad_device is not None:
        return bad_device
    dump = Path(dump_dir) if dump_dir else None
    # a dump holds every stage's product: the kernel IR and every target's sources too
    dumping = dump is not None
    back = SOURCE_TARGETS if dumping else ()
    options = Options(remote_budget, dump, origins=origins, kernels=dumping or ptxas is not None, sources=back)
    art = compile_graph(graph, options)
    report = art.report
    assert report is not None  # the last stage always produces it
    coverage = coverage_of(art)
    resources = kernel_resources(art, ptxas) if ptxas else None
    if isinstance(resources, str):
        return _fail(resources)
    if report_format == "json":
        rows = [{"cluster": i, **row.to_json()} for i, row in resources or []]
        extra = {} if resources is None else {"kernel_resources": rows}
        print(json.dumps({**report.to_json(), "coverage": coverage.to_json(), **extra}, indent=1))
    else:
        print(format_table(report) + coverage.line())
        for i, row in resources or []:
            barrier = f", barrier headroom {row.headroom:.0%}" if row.barrier else ""
            print(
                f"  cluster {i} {row.name}: {row.registers} registers, {row.spills} B spilled, "
                f"{row.resident_per_sm}/{row.needed_per_sm} block(s)/SM resident/needed{barrier}"
                + "".join(f"; {p}" for p in row.problems)
            )
    # JSON on stdout stays one parseable document: the check lines go to stderr then
    out = sys.stderr if report_format == "json" else sys.stdout
    if device is not None and device != "reference":
        return check_clusters(art, device, out, cache_dir=cache_dir)
    return _check_reference(art, out) if device == "reference" else EXIT_OK


def kernel_resources(art: Artifacts, arch: str, dev: str = "h200") -> list[tuple[int, GateRow]] | str:
    """Every stitched kernel's gate row (one nvcc run for the graph), with its cluster's index; or why not."""
    from stitchfleet.compiler.devices import device
    from stitchfleet.compiler.lower import Lowered
    from stitchfleet.compiler.targets.cuda.nvcc import NvccError, find_nvcc
    from stitchfleet.compiler.targets.cuda.resources import gate  # renders: imported when asked for

    nvcc = find_nvcc()
    if nvcc is None:
        return "--ptxas needs nvcc on PATH (the CUDA toolkit; no GPU needed)"
    owners = {
        k.name: i for i, lowered in enumerate(art.kernels) if isinstance(lowered, Lowered) for k in lowered.kernels
    }
    kernels = [k for lowered in art.kernels if isinstance(lowered, Lowered) for k in lowered.kernels]
    if not kernels:
        return []
    try:
        rows = gate(kernels, nvcc, arch, device(dev))
    except (NvccError, ValueError) as err:
        return f"--ptxas {arch}: {err}"
    return [(owners[row.name], row) for row in rows]


def coverage_of(art: Artifacts) -> Coverage:
    """The coverage figure of a compiled graph: its clusters with their plan or decision."""
    report = art.report
    assert report is not None
    clusters = [
        (c.nodes, p.reason if isinstance(p, Decision) else None)
        for c, p in zip(art.need_clusters().clusters, art.stitch, strict=True)
    ]
    return measure(art.graph, clusters, _exclusions(report))


def _exclusions(report: CompileReport) -> dict[int, str]:
    return {e.node: e.reason for e in report.excluded}


Runner = Callable[[ir.Graph, StitchPlan, dict[str, Any]], dict[str, Any]]


def _runner(device: str, cache_dir: Path | None) -> Runner:
    where = cache_dir if cache_dir is not None else Path(tempfile.mkdtemp(prefix=f"stitchfleet-{device}-"))
    built = targets.load(device, where)

    def run_target(cluster: ir.Graph, plan: StitchPlan, inputs: dict[str, Any]) -> dict[str, Any]:
        return built.build(cluster, plan)(inputs)

    return run_target


def _check_cluster(cluster: ir.Graph, plan: StitchPlan | Decision, runner: Runner, out: TextIO) -> int:
    if isinstance(plan, Decision):
        print(f"  cluster {cluster.metadata['cluster']}: {plan.reason}", file=out)
        return EXIT_OK
    # inputs of the cluster's own: the rest of the graph may hold ops evaluate cannot run
    inputs = random_inputs(cluster, seed=plan.cluster)
    try:
        got = runner(cluster, plan, inputs)
    except (NotImplementedError, RuntimeError) as err:
        print(f"  cluster {plan.cluster}: not lowered: {err}", file=out)
        return EXIT_MISMATCH
    try:
        native, reference = evaluate(cluster, inputs), evaluate(cluster, inputs, "float64")
        # an output that misses the rule gets a second look: fp64 on perturbed inputs (tolerance.py)
        output_checks = check_outputs(
            got, native, reference, perturbed=lambda draw: evaluate(cluster, inputs, "float64", noise=draw)
        )
    except EvaluationError as err:
        print(f"  cluster {plan.cluster}: evaluate failed: {err}", file=out)
        return EXIT_MISMATCH
    status = EXIT_OK
    for name, output_check in output_checks.items():
        status = status if output_check.ok else EXIT_MISMATCH
        state = "ok" if output_check.ok else f"FAIL: {output_check.reason}"
        state += f" ({output_check.reason})" if output_check.ok and output_check.widened else ""
        kernels = f"{plan.kernel_count} kernel(s)"
        print(
            f"  cluster {plan.cluster} {name:<24} {kernels}  error {output_check.compiled_error:.3g}  {state}", file=out
        )
    return status


def _check_clusters(art: Artifacts, runner: Runner, device: str, out: TextIO, chosen: Collection[int]) -> int:
    what = targets.profile(device).summary
    print(f"stitched {what} vs evaluate, per cluster, on random inputs of its own:", file=out)
    pairs = [pair for i, pair in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)) if i in chosen]
    return max((_check_cluster(g, p, runner, out) for g, p in pairs), default=EXIT_OK)


def check_clusters(
    art: Artifacts,
    device: str,
    out: TextIO,
    *,
    cache_dir: Path | None = None,
    first: int | None = None,
    only: Collection[int] | None = None,
) -> int:
    """Checks the stitched code of the first `first` clusters (all: None), or of the clusters numbered in
    `only`, on `device` (a target that `checks_here`), each on the inputs the whole graph's check gives it."""
    runner = _runner(device, cache_dir)
    everything = range(len(art.stitch))
    chosen = frozenset(everything[:first] if only is None else only)
    return _check_clusters(art, runner, device, out, chosen)


def run(
    path: str,
    report_format: str,
    device: str | None,
    remote_budget: int,
    dump_dir: str | None,
    *,
    cache_dir: Path | None = None,
    ptxas: str | None = None,
) -> int:
    """`stitchfleet compile` on an IR JSON file."""
    graph = load(path)
    if isinstance(graph, int):
        return graph
    return run_graph(graph, report_format, device, remote_budget, dump_dir, cache_dir=cache_dir, ptxas=ptxas)
