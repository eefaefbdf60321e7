"""The kernels the CUDA tests render: every suite case and every workload cluster planned for the H200
and lowered, plus building blocks.

Not a test module: a helper the tests import. Kernels are renamed after their case or cluster
file so that they can share one translation unit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stitchfleet.compiler.ir import DType, Op, load
from stitchfleet.compiler.kernel import blocks, ir
from stitchfleet.compiler.lower import lower
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract

SUITE = Path(__file__).resolve().parents[4] / "benchmarks" / "suite"
WORKLOADS = Path(__file__).resolve().parents[4] / "benchmarks" / "workloads"
MODELS = ("bert_encoder", "transformer_block", "dien_attention_gru", "crnn_head")


def suite_kernels(device: str = "h200") -> list[ir.Kernel]:
    kernels: list[ir.Kernel] = []
    for path in sorted(SUITE.glob("*.json")):
        graph = load(path)
        for i, cluster in enumerate(find_clusters(graph, 8).clusters):
            sub = extract(graph, cluster.nodes)
            for k in lower(sub, plan_cluster(sub, i, PlanOptions(device=device))).kernels:
                kernels.append(dataclasses.replace(k, name=f"{path.stem}_{k.name}"))
    return kernels


def workload_kernels(model: str, device: str = "h200") -> list[ir.Kernel]:
    """Every kernel of every cluster of one workload graph (benchmarks/workloads/<model>/cluster_*.json)."""
    kernels: list[ir.Kernel] = []
    for path in sorted((WORKLOADS / model).glob("cluster_*.json")):
        graph = load(path)
        for k in lower(graph, plan_cluster(graph, 0, PlanOptions(device=device))).kernels:
            kernels.append(dataclasses.replace(k, name=f"{model}_{path.stem}_{k.name}"))
    return kernels


def _launch(grid: int = 4, block: int = 128) -> ir.Launch:
    return ir.Launch(grid, block, max_coresident_blocks=8)


def block_kernels() -> list[ir.Kernel]:
    """Building-block kernels: grid reduce (grid barrier), atomics of each kind, column tile, shuffles."""
    f32, n = DType.F32, 1000
    x = ir.Buffer("x", f32, n, ir.Role.INPUT)
    out = ir.Buffer("y", f32, 1, ir.Role.OUTPUT)
    part = ir.Buffer("part", f32, 4, ir.Role.SCRATCH)
    smem = ir.SharedBuffer("warps", f32, 4)
    acc, i = ir.Var("acc", f32), ir.Var("i", DType.I64)
    load = (ir.Assign(acc, ir.add(acc, ir.Load(x, i))),)
    reduce_body = (
        ir.Assign(acc, ir.const(0, f32)),
        blocks.grid_stride_loop(i, ir.i64(n), load),
        *blocks.grid_reduce(acc, Op.ADD, part, smem, 128),
        ir.If(ir.eq(ir.global_thread_index(), ir.i64(0)), (ir.Store(out, ir.i64(0), acc),)),
    )
    kernels = [ir.Kernel("block_grid_reduce", (x, out, part), (smem,), _launch(), reduce_body)]
    for dtype in (DType.F32, DType.F16, DType.BF16, DType.F64, DType.I32, DType.I64):
        for op in (Op.ADD, Op.MAXIMUM, Op.MINIMUM):
            src = ir.Buffer("src", dtype, n, ir.Role.INPUT)
            dst = ir.Buffer("dst", dtype, 1, ir.Role.OUTPUT)
            body = (blocks.grid_stride_loop(i, ir.i64(n), (ir.Atomic(op, dst, ir.i64(0), ir.Load(src, i)),)),)
            name = f"block_atomic_{op.value.lower()}_{dtype.value}"
            kernels.append(ir.Kernel(name, (src, dst), (), _launch(), body))
    return kernels


def scale_kernel(n: int = 4096) -> ir.Kernel:
    """y = 2x over `n` floats in a grid-stride loop: the renderer makes it 16-byte vector accesses."""
    x = ir.Buffer("x", ir.DType.F32, n, ir.Role.INPUT)
    y = ir.Buffer("y", ir.DType.F32, n, ir.Role.OUTPUT)
    i = ir.Var("i", ir.DType.I64)
    body = (ir.Store(y, i, ir.mul(ir.Load(x, i), ir.const(2.0, ir.DType.F32))),)
    loop = ir.For(i, ir.global_thread_index(), ir.i64(n), ir.mul(ir.BLOCK_DIM, ir.GRID_DIM), body)
    return ir.Kernel("scale", (x, y), (), ir.Launch(8, 128, 8), (loop,))
