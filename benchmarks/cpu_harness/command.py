"""The CPU benchmark as a command: stitched `cpu` code vs plain TensorFlow CPU on the same clusters.

Input: argv (the options of `stitchfleet bench cpu` and `scripts/bench_cpu.py`, one parser
for both). Output: an exit status, a progress line per cluster and a per-group summary on
`log`, and `cpu-<date>.json`/`.md` under --out (default benchmarks/results/), labelled with
the CPU model and core count. Per cluster, in one process on the same inputs: the stitched
program is compiled (cached under STITCHFLEET_CACHE_DIR), its outputs checked against
`evaluate` with the guard's rule (a failing cluster is not timed), TF runs the cluster op
by op as a `tf.function` (graph mode, no XLA: a training step without stitching), then
warm-up and interleaved runs; medians are reported. Exit 1 when a cluster was not timed,
2 for bad options or without TensorFlow.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.cpu_harness import cases, report
from benchmarks.cpu_harness.translate_tf import tf_function, tf_inputs
from stitchfleet import settings
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType
from stitchfleet.compiler.tolerance import check_outputs

EXIT_FAILED, EXIT_USAGE = 1, 2
RESULTS = Path(__file__).resolve().parent.parent / "results"
DESCRIPTION = "The CPU benchmark: stitched C + OpenMP (the `cpu` backend) vs plain TensorFlow CPU, per cluster."
Log = Callable[[str], None]


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("--reps", type=int, default=30, help="timed runs per side (median; default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per side first, at least 1 (default 3)")
    p.add_argument("--only", nargs="+", default=[], help="keep clusters whose name contains any of these")
    p.add_argument("--scale", type=float, default=1.0, help="suite shapes: fraction of their rows kept, in (0, 1]")
    p.add_argument("--max-elements", type=float, default=None, help="skip clusters with more elements than this")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results/)")
    return p


def _bad_options(args: argparse.Namespace) -> str | None:
    if args.reps < 1:
        return f"--reps must be at least 1, got {args.reps}"
    if args.warmup < 1:  # TF traces the function on its first call: that call is never a sample
        return f"--warmup must be at least 1, got {args.warmup}"
    if not 0 < args.scale <= 1:
        return f"--scale must be in (0, 1], got {args.scale:g}"
    if args.max_elements is not None and args.max_elements < 1:
        return f"--max-elements must be at least 1, got {args.max_elements:g}"
    return None


def _tensorflow() -> Any:
    """TensorFlow, quiet, or None when it is not installed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: TF reads it once
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def _check(case: cases.CpuCase, outputs: dict[str, Any], inputs: dict[str, Any]) -> str:
    """Why the stitched outputs fail the guard's rule against `evaluate`, or "" when they pass."""
    graph = case.graph
    bf16 = frozenset(n for n, i in graph.outputs if graph.node(i).dtype is DType.BF16)
    native, exact = evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    output_checks = check_outputs(outputs, native, exact, factor=8.0, bf16_outputs=bf16)
    return "; ".join(f"{n}: {v.reason}" for n, v in output_checks.items() if not v.ok)


def _interleaved(ours: Callable[[], object], theirs: Callable[[], object], reps: int, warmup: int) -> list[float]:
    """Median seconds of each side over `reps` alternating runs, after `warmup` runs of each."""
    for _ in range(warmup):
        ours()
        theirs()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for side, call in zip(samples, (ours, theirs), strict=True):
            started = time.perf_counter()
            call()
            side.append(time.perf_counter() - started)
    return [statistics.median(side) for side in samples]


def measure(tf: Any, case: cases.CpuCase, cache: Path, reps: int, warmup: int) -> dict[str, Any]:
    """One row: the cluster's figures, or `skipped` with the reason it was not timed."""
    from stitchfleet.compiler.targets.cpu.executable import compile_cluster

    row: dict[str, Any] = {"case": case.name, "ops": case.ops, "elements": case.elements}
    inputs = random_inputs(case.graph, 0)
    try:
        stitched = compile_cluster(case.graph, cache)
        failure = _check(case, stitched(inputs), inputs)
    except Exception as err:  # a planner, compiler or runtime error is a result to report, not a crash
        failure = f"{type(err).__name__}: {err}"
    if failure:
        return {**row, "skipped": f"stitched program failed: {failure}"}
    fn, args = tf_function(tf, case.graph), tf_inputs(tf, case.graph, inputs)
    # .numpy(): TF's result in host memory, like ours
    cpu_s, tf_s = _interleaved(lambda: stitched(inputs), lambda: [o.numpy() for o in fn(*args)], reps, warmup)
    return {**row, "cpu_ms": cpu_s * 1e3, "tf_ms": tf_s * 1e3, "speedup": tf_s / cpu_s}


def _document(tf: Any, args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from stitchfleet.compiler.targets.cpu.executable import cpu_model

    options = {"only": args.only, "scale": args.scale, "max_elements": args.max_elements, "warmup": args.warmup}
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "tf_version": tf.__version__,
        "reps": args.reps,
        "options": options,
        "summary": report.summarise(rows),
        "rows": rows,
    }


def _chosen(args: argparse.Namespace) -> list[cases.CpuCase]:
    ceiling = None if args.max_elements is None else int(args.max_elements)
    return cases.select(args.only, args.scale, ceiling)


def _measure_all(tf: Any, chosen: list[cases.CpuCase], args: argparse.Namespace, log: Log) -> list[dict[str, Any]]:
    cache = settings.current().cache_dir / "bench-cpu"
    log(f"{len(chosen)} cluster(s); stitched C cached in {cache}")
    log(report.HEADER)
    rows = []
    for case in chosen:
        rows.append(measure(tf, case, cache, args.reps, args.warmup))
        log(report.row_line(rows[-1]))
    return rows


def run(args: argparse.Namespace, prog: str = "bench_cpu.py", log: Log = print) -> int:
    """The whole command on parsed options (see the module docstring)."""
    bad = _bad_options(args)
    chosen = [] if bad else _chosen(args)
    if bad or not chosen:
        print(f"{prog}: {bad or 'no cluster matches --only/--max-elements'}", file=sys.stderr)
        return EXIT_USAGE
    tf = _tensorflow()
    if tf is None:
        print(f"{prog}: TensorFlow is not installed; the CPU benchmark times against it", file=sys.stderr)
        return EXIT_USAGE
    rows = _measure_all(tf, chosen, args, log)
    doc = _document(tf, args, rows)
    return _finish(doc, report.write(doc, args.out), log)


def _finish(doc: dict[str, Any], paths: tuple[Path, Path], log: Log) -> int:
    for line in report.summary_lines(doc):
        log(line)
    log(f"wrote {paths[0]} and {paths[1]}")
    failed = [r["case"] for r in doc["rows"] if "speedup" not in r]
    if failed:
        log(f"{len(failed)} cluster(s) not timed: {', '.join(failed)}")
    return EXIT_FAILED if failed else 0


def main(argv: Sequence[str] | None = None, prog: str = "bench_cpu.py") -> int:
    """Parse argv and run; progress goes to stdout, flushed line by line."""
    args = build_parser(prog).parse_args(argv)
    return run(args, prog, lambda line: print(line, flush=True))
