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

from stitchfleet.compiler import ir  # noqa: E402
from stitchfleet.compiler.pipeline import Options, compile_graph  # noqa: E402
from stitchfleet.plugin.frontend import Conversion  # noqa: E402
from stitchfleet.plugin.frontend.converter import convert_graph_def  # noqa: E402
from stitchfleet.plugin.frontend.validation import compare, random_feeds  # noqa: E402
from stitchfleet.plugin.training_graphs import MODELS, SIZES, build, training_step  # noqa: E402


def _check(graph: Any, conversion: Conversion) -> dict[str, object]:
    with tf.compat.v1.Session(graph=graph) as session:
        with graph.as_default():
            session.run(tf.compat.v1.global_variables_initializer())
        result = compare(session, conversion, random_feeds(graph))
    return {"checked": result.checked, "failures": [f"{name}: {why}" for name, why in result.failures]}


def _boundaries(conversion: Conversion) -> dict[str, int]:
    reasons = Counter(f"{d.op_type}: {d.reason}" for d in conversion.skipped.values() if d.fate == "boundary")
    return dict(sorted(reasons.items()))


def build_workload(name: str, size: str, out: Path, check: bool) -> dict[str, object]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "workloads")
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="default: every model")
    parser.add_argument("--no-check", action="store_true", help="skip the check against TensorFlow")
    args = parser.parse_args(argv)
    summary = {name: build_workload(name, args.size, args.out, not args.no_check) for name in args.model or MODELS}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    failed = [name for name, row in summary.items() if row["check"] and row["check"]["failures"]]
    for name in failed:
        print(f"{name}: IR differs from TF: {summary[name]['check']['failures'][:5]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
