"""The kernel resource gate's figures: every suite and workload kernel through ptxas, per workload.

Input: the suite cases (benchmarks/suite) and the workload clusters (benchmarks/workloads/<model>),
planned for a device profile (default h200) and rendered; nvcc on PATH. Output: on stdout, a Markdown
table per workload (kernels, max registers, spill bytes, max shared memory, kernels whose real
occupancy is below what their plan needs, the smallest grid-barrier headroom) and, with `--json`,
every kernel's row. Run: `python -m benchmarks.kernel_resources [--arch sm_90] [--json FILE]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from stitchfleet.compiler.devices import device
from stitchfleet.compiler.ir import load
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cuda.nvcc import find_nvcc
from stitchfleet.compiler.targets.cuda.resources import GateRow, gate

HERE = Path(__file__).resolve().parent
SUITE, WORKLOADS = HERE / "suite", HERE / "workloads"
MODELS = ("bert_encoder", "transformer_block", "dien_attention_gru", "crnn_head")


def suite_kernels(dev: str = "h200") -> list[ir.Kernel]:
    """Every suite case's kernels, renamed after the case (one translation unit holds them all)."""
    kernels: list[ir.Kernel] = []
    for path in sorted(SUITE.glob("*.json")):
        graph = load(path)
        for i, cluster in enumerate(find_clusters(graph, 8).clusters):
            sub = extract(graph, cluster.nodes)
            for k in lower(sub, plan_cluster(sub, i, PlanOptions(device=dev))).kernels:
                kernels.append(dataclasses.replace(k, name=f"{path.stem}_{k.name}"))
    return kernels


def workload_kernels(model: str, dev: str = "h200") -> list[ir.Kernel]:
    """Every kernel of every cluster of one workload graph, renamed after its cluster file."""
    kernels: list[ir.Kernel] = []
    for path in sorted((WORKLOADS / model).glob("cluster_*.json")):
        graph = load(path)
        for k in lower(graph, plan_cluster(graph, 0, PlanOptions(device=dev))).kernels:
            kernels.append(dataclasses.replace(k, name=f"{model}_{path.stem}_{k.name}"))
    return kernels


def programs(dev: str = "h200") -> dict[str, list[ir.Kernel]]:
    """The gate's kernels by workload: the suite, then each workload graph."""
    return {"suite": suite_kernels(dev), **{m: workload_kernels(m, dev) for m in MODELS}}


def summary_line(name: str, rows: Sequence[GateRow]) -> str:
    """One Markdown table row: a workload's kernels against the gate."""
    barriers = [r.headroom for r in rows if r.barrier]
    short = sum(1 for r in rows if r.resident_per_sm < r.needed_per_sm)
    smem = max(r.static_smem + r.dynamic_smem for r in rows)
    headroom = f"{min(barriers):.0%} ({len(barriers)})" if barriers else "no barrier"
    spilling = sum(1 for r in rows if r.spills)
    return (
        f"| {name} | {len(rows)} | {max(r.registers for r in rows)} | {spilling} ({max(r.spills for r in rows)} B) "
        f"| {smem} | {short} | {headroom} |"
    )


HEADER = (
    "| workload | kernels | max registers | kernels spilling (max bytes) | max smem (B) "
    "| occupancy below plan | min barrier headroom (kernels) |\n|---|---|---|---|---|---|---|"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--device", default="h200", help="the planner's device profile")
    parser.add_argument("--json", type=Path, help="write every kernel's row here")
    args = parser.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("kernel_resources: nvcc is not on PATH", file=sys.stderr)
        return 2
    dev = device(args.device)
    rows = {name: gate(kernels, nvcc, args.arch, dev) for name, kernels in programs(args.device).items()}
    print(f"nvcc {nvcc.version}, {args.arch}, planned for {dev.name}")
    print(HEADER)
    for name, found in rows.items():
        print(summary_line(name, found))
    failing = [(r.name, r.problems) for found in rows.values() for r in found if r.problems]
    print(f"\n{len(failing)} kernel(s) fail the gate")
    for name, problems in failing:
        print(f"  {name}: {'; '.join(problems)}")
    if args.json is not None:
        args.json.write_text(json.dumps({n: [r.to_json() for r in f] for n, f in rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
