"""Modeled GPU time per workload (issue 33 item 3): per_op, xla_style and stitch on H100 and H200 constants.

Input: the workload graphs in benchmarks/workloads (or JSON graphs given as arguments). Output: a Markdown
table on stdout, every figure from `stitchfleet.compiler.gpu_time` (a model: docs/gpu_time_model.md),
none measured. Run: PYTHONPATH=. python scripts/bench_gpu_model.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from stitchfleet.compiler import pipeline
from stitchfleet.compiler.ir import load

WORKLOADS = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads"


def rows(paths: list[Path]) -> list[str]:
    out = [
        "| graph | device | per_op us | xla_style us | stitch us | stitch vs per_op | stitch vs xla_style "
        "| stitch MB | launches per_op / xla / stitch | grid barriers |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in paths:
        report = pipeline.compile_graph(load(path)).report
        assert report is not None
        name = path.parent.name if path.name == "graph.json" else path.stem
        for device in ("h100", "h200"):
            us = report.modeled_totals(device)
            mine = [m for m in report.modeled if m.device == device]
            launches = {p: sum(m.launches for m in mine if m.planner == p) for p in ("per_op", "xla_style", "stitch")}
            stitch_bytes = sum(m.bytes for m in mine if m.planner == "stitch")
            barriers = sum(m.barriers for m in mine if m.planner == "stitch")
            out.append(
                f"| {name} | {device} | {us['per_op']:.0f} | {us['xla_style']:.0f} | {us['stitch']:.0f} "
                f"| {us['per_op'] / us['stitch']:.2f}x | {us['xla_style'] / us['stitch']:.2f}x "
                f"| {stitch_bytes / 1e6:.0f} | {launches['per_op']} / {launches['xla_style']} / {launches['stitch']} "
                f"| {barriers} |"
            )
    return out


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(WORKLOADS.glob("*/graph.json"))
    print("\n".join(rows(paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
