"""Builds the workload graphs: TF training graphs -> IR JSON, clusters, kernel counts.

Input: command-line options (`python scripts/build_workloads.py [--size full|small]
[--out benchmarks/workloads] [--model NAME ...] [--no-check]`); TensorFlow (CPU).
Output: per model, under OUT/<model>/: `graph.json` (the converted graph of one
training step: forward, backward and optimizer update, initialisers left out) and
`cluster_NN.json` (each memory-intensive cluster extracted as a standalone graph, with
its shapes); OUT/summary.json with, per model, op and cluster counts, the kernel
counts per planner, the boundary reasons and the check against TF; and the markdown
"Kernel counts" table on stdout. Unless --no-check, every converted graph is first
checked against TF on random inputs, and a mismatch fails the run (exit 1).
`--keras NAME ...` (or `--keras all`) instead builds the Keras training graphs of
benchmarks/keras_apps.py, compiles them and writes OUT/keras_coverage.json (per model:
op counts, clusters and the coverage figure with the main reasons for what is left out)
and prints the markdown coverage table; those graphs are too large to store.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import tensorflow as tf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.keras_apps import KERAS_MODELS, training_graph_def  # noqa: E402
from stitchfleet.compiler import ir  # noqa: E402
from stitchfleet.compiler.compile_command import coverage_of  # noqa: E402
from stitchfleet.compiler.pipeline import Options, compile_graph  # noqa: E402
from stitchfleet.demo.models import MODELS, SIZES, build, training_step  # noqa: E402
from stitchfleet.plugin.frontend import Conversion  # noqa: E402
from stitchfleet.plugin.frontend.converter import convert_graph_def  # noqa: E402
from stitchfleet.plugin.frontend.validation import compare, random_feeds  # noqa: E402


def _check(graph: Any, conversion: Conversion) -> dict[str, object]:
    with tf.compat.v1.Session(graph=graph) as session:
        with graph.as_default():
            session.run(tf.compat.v1.global_variables_initializer())
        result = compare(session, conversion, random_feeds(graph))
    return {"checked": result.checked, "failures": [f"{name}: {why}" for name, why in result.failures]}


def _boundaries(conversion: Conversion) -> dict[str, int]:
    reasons = Counter(f"{d.op_type}: {d.reason}" for d in conversion.skipped.values() if d.fate == "boundary")
    return dict(sorted(reasons.items()))


def build_workload(name: str, size: str, out: Path, check: bool) -> dict[str, Any]:
    graph = build(name, size)
    conversion = convert_graph_def(training_step(graph), name)
    art = compile_graph(conversion.graph, Options())
    report = art.report
    assert report is not None
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.json"):
        stale.unlink()
    ir.save(conversion.graph, folder / "graph.json")
    for cluster in art.cluster_graphs:
        ir.save(cluster, folder / f"cluster_{int(cluster.metadata.get_int('cluster')):02d}.json")
    return {
        "description": MODELS[name].description,
        "size": size,
        "dims": MODELS[name].full if size == "full" else MODELS[name].small,
        "tf_ops": len(conversion.ops),
        "ir_nodes": len(conversion.graph.nodes),
        "fates": dict(sorted(Counter(d.fate for d in conversion.ops.values()).items())),
        "clusters": len(report.clusters),
        "mi_ops": sum(c.size for c in report.clusters),
        "kernels": report.totals(),
        "graph_fingerprint": report.graph_fingerprint,
        "boundaries": _boundaries(conversion),
        "check": _check(graph, conversion) if check else None,
    }


def table(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| workload | TF ops (step) | IR nodes | clusters | MI ops | per_op kernels | xla_style kernels "
        "| stitch kernels | stitch / xla_style |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary.items():
        kernels = row["kernels"]
        lines.append(
            f"| {name} | {row['tf_ops']} | {row['ir_nodes']} | {row['clusters']} | {row['mi_ops']} "
            f"| {kernels.get('per_op', 0)} | {kernels.get('xla_style', 0)} | {kernels.get('stitch', 0)} "
            f"| {kernels.get('stitch', 0) / max(kernels.get('xla_style', 0), 1):.0%} |"
        )
    return "\n".join(lines)


def keras_coverage(name: str) -> dict[str, Any]:
    graph_def = training_graph_def(name)
    conversion = convert_graph_def(graph_def, name)
    art = compile_graph(conversion.graph, Options())
    return {
        "tf_ops": len(graph_def.node),
        "ir_nodes": len(conversion.graph.nodes),
        "clusters": len(art.cluster_graphs),
        "coverage": coverage_of(art).to_json(),
    }


def coverage_table(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| graph | TF ops (step) | IR nodes | clusters | memory-intensive | stitched | share | main reasons left out |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in summary.items():
        cov = row["coverage"]
        reasons = "; ".join(f"{r['reason']} ({r['nodes']})" for r in cov["left_out"][:3])
        lines.append(
            f"| {name} | {row['tf_ops']} | {row['ir_nodes']} | {row['clusters']} | {cov['memory_intensive']} "
            f"| {cov['stitched']} | {cov['share']:.3f} | {reasons} |"
        )
    return "\n".join(lines)


def main_keras(names: list[str], out: Path) -> int:
    chosen = list(KERAS_MODELS) if names == ["all"] else names
    unknown = [n for n in chosen if n not in KERAS_MODELS]
    if unknown:
        print(f"unknown Keras model(s) {unknown} (known: {', '.join(KERAS_MODELS)})", file=sys.stderr)
        return 2
    summary = {name: keras_coverage(name) for name in chosen}
    (out / "keras_coverage.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(coverage_table(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "workloads")
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: every model")
    parser.add_argument("--no-check", action="store_true", help="skip the check against TensorFlow")
    parser.add_argument("--keras", nargs="+", metavar="NAME", help="Keras coverage graphs instead ('all': every one)")
    args = parser.parse_args(argv)
    if args.keras:
        tf.compat.v1.disable_eager_execution()
        return main_keras(args.keras, args.out)
    summary = {name: build_workload(name, args.size, args.out, not args.no_check) for name in args.model or MODELS}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    failed = [name for name, row in summary.items() if row["check"] and row["check"]["failures"]]
    for name in failed:
        print(f"{name}: IR differs from TF: {summary[name]['check']['failures'][:5]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
