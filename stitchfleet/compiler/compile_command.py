"""What `stitchfleet compile FILE` does: load, run the pipeline, print, optionally evaluate.

Input: the file path (or, from the CLI's GraphDef path through the TF frontend, a
`Graph`), report format, device and the settings the CLI read (remote stitch budget,
dump directory, and the kernel cache directory for `cpu`). Output: text on stdout/stderr
and an exit status (0 ok, 1 a check failed, 2 bad input). `reference` evaluates the graph on random inputs natively
and in float64 and checks the outputs with the tolerance rule. `sim` and `cpu` evaluate
the graph on random inputs, then run every cluster's stitched code (planned for the
h200 profile) on that backend (the kernel IR on the sim; C + OpenMP compiled with the
system C compiler for `cpu`) with the cluster's inputs taken from that evaluation, and
check each cluster output against evaluate of the cluster.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stitchfleet.compiler import ir
from stitchfleet.compiler.decision import Decision
from stitchfleet.compiler.evaluate import EvaluationError, evaluate, evaluate_nodes, random_inputs
from stitchfleet.compiler.lower import lower, run_lowered
from stitchfleet.compiler.pipeline import Artifacts, Options, compile_graph
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.report import format_table
from stitchfleet.compiler.tolerance import check, check_outputs

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2
DEVICES = ("reference", "sim", "cpu", "cuda-cpu")
GRAPHDEF_SUFFIXES = (".pb", ".pbtxt")


def _fail(message: str) -> int:
    print(f"stitchfleet compile: {message}", file=sys.stderr)
    return EXIT_USAGE


def _check_reference(graph: ir.Graph) -> int:
    inputs = random_inputs(graph, seed=0)
    try:
        native, reference = evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    except EvaluationError as err:
        return _fail(f"reference evaluation failed: {err}")
    status = EXIT_OK
    print("reference evaluation on random inputs (native vs float64):")
    for name, value in native.items():
        verdict = check(value, value, reference[name])
        status = status if verdict.ok else EXIT_MISMATCH
        state = "ok" if verdict.ok else f"FAIL: {verdict.reason}"
        print(f"  {name:<24} {value.dtype!s:<8} {list(value.shape)!s:<20} error {verdict.native_error:.3g}  {state}")
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
) -> int:
    """Compiles a graph already in memory (from IR JSON or from the TF frontend) and prints the report."""
    bad_device = check_device(device)
    if bad_device is not None:
        return bad_device
    options = Options(remote_budget=remote_budget, dump_dir=Path(dump_dir) if dump_dir else None)
    art = compile_graph(graph, options)
    report = art.report
    assert report is not None  # the last stage always produces it
    print(
        report.dumps() if report_format == "json" else format_table(report), end="" if report_format != "json" else "\n"
    )
    if device in ("sim", "cpu", "cuda-cpu"):
        return _check_clusters(art, _runner(device, cache_dir), device)
    return _check_reference(graph) if device == "reference" else EXIT_OK


Runner = Callable[[ir.Graph, StitchPlan, dict[str, Any]], dict[str, Any]]


def _runner(device: str, cache_dir: Path | None) -> Runner:
    if device == "cpu":
        return _cpu_runner(cache_dir)
    return _cuda_cpu_runner(cache_dir) if device == "cuda-cpu" else _sim_runner


def _sim_runner(cluster: ir.Graph, plan: StitchPlan, inputs: dict[str, Any]) -> dict[str, Any]:
    return run_lowered(lower(cluster, plan), cluster, inputs)


def _cpu_runner(cache_dir: Path | None) -> Runner:
    from stitchfleet.compiler.runtime.cpu import compile_cluster

    where = cache_dir if cache_dir is not None else Path(tempfile.mkdtemp(prefix="stitchfleet-cpu-"))

    def run_cpu(cluster: ir.Graph, plan: StitchPlan, inputs: dict[str, Any]) -> dict[str, Any]:
        return compile_cluster(cluster, where, plan)(inputs)

    return run_cpu


def _cuda_cpu_runner(cache_dir: Path | None) -> Runner:
    from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend

    backend = CudaCpuBackend(
        cache_dir if cache_dir is not None else Path(tempfile.mkdtemp(prefix="stitchfleet-cuda-cpu-"))
    )

    def run_cuda_cpu(cluster: ir.Graph, plan: StitchPlan, inputs: dict[str, Any]) -> dict[str, Any]:
        lowered = lower(cluster, plan)
        raw = backend.compile(lowered.kernels)({b: np.asarray(inputs[n]).reshape(-1) for n, b in lowered.inputs})
        shapes = {name: cluster.node(node_id).shape for name, node_id in cluster.outputs}
        return {name: raw[buf].reshape(shapes[name]) for name, buf in lowered.outputs}

    return run_cuda_cpu


def _check_cluster(cluster: ir.Graph, plan: StitchPlan | Decision, values: list[Any], runner: Runner) -> int:
    if isinstance(plan, Decision):
        print(f"  cluster {cluster.metadata['cluster']}: {plan.reason}")
        return EXIT_OK
    sources = cluster.metadata.get_ints("source_inputs")
    inputs = {str(p.attrs["name"]): values[s] for p, s in zip(cluster.parameters, sources, strict=True)}
    try:
        got = runner(cluster, plan, inputs)
    except (NotImplementedError, RuntimeError) as err:
        print(f"  cluster {plan.cluster}: not lowered: {err}")
        return EXIT_MISMATCH
    verdicts = check_outputs(got, evaluate(cluster, inputs), evaluate(cluster, inputs, "float64"))
    status = EXIT_OK
    for name, verdict in verdicts.items():
        status = status if verdict.ok else EXIT_MISMATCH
        state = "ok" if verdict.ok else f"FAIL: {verdict.reason}"
        kernels = f"{plan.kernel_count} kernel(s)"
        print(f"  cluster {plan.cluster} {name:<24} {kernels}  error {verdict.compiled_error:.3g}  {state}")
    return status


def _check_clusters(art: Artifacts, runner: Runner, device: str) -> int:
    try:
        values = evaluate_nodes(art.graph, random_inputs(art.graph, seed=0))
    except EvaluationError as err:
        return _fail(f"reference evaluation failed: {err}")
    what = {"sim": "kernels on the sim", "cpu": "C + OpenMP code on this CPU", "cuda-cpu": "CUDA text run on this CPU"}[
        device
    ]
    print(f"stitched {what} vs evaluate, per cluster, on random inputs:")
    results = [_check_cluster(g, p, values, runner) for g, p in zip(art.cluster_graphs, art.stitch, strict=True)]
    return max(results, default=EXIT_OK)


def run(
    path: str,
    report_format: str,
    device: str | None,
    remote_budget: int,
    dump_dir: str | None,
    *,
    cache_dir: Path | None = None,
) -> int:
    """`stitchfleet compile` on an IR JSON file."""
    graph = load(path)
    if isinstance(graph, int):
        return graph
    return run_graph(graph, report_format, device, remote_budget, dump_dir, cache_dir=cache_dir)
