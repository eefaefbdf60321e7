"""What production runs, checked and timed on a GPU: NVRTC modules through the launch library on a stream.

Input: the command line (case selection, time budget, --check-only for compute-sanitizer, --dry-run for
CI). Output: progress lines, and `launch_<device>_<date>.json` and `.md` under --out. Per case (suite
clusters and workload cluster files): `compile_gpu` (NVRTC for the device's arch, grid-barrier grids
fitted to the device's real occupancy), `LaunchLibrary.program` on a non-blocking cupy stream, outputs
and scratch filled with 0xFF, one checked run (outputs against `evaluate`, the non-finite flag against
the reference), then timed runs with CUDA events, L2 flushed (a write of twice its size) before every
one. The modeled time (`compiler.gpu_time`) is printed beside the measured one, labelled modeled.
Needs cupy on the GPU machine, no pycuda; --dry-run needs neither (NVRTC compiles for sm_90 only).

    PYTHONPATH=. python3 scripts/bench_gpu_launch.py --time-budget 300 --out $OUT/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from stitchfleet.compiler import gpu_time
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType, Graph, load
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from stitchfleet.compiler.targets.cache import ArtifactCache, artifact_cache
from stitchfleet.compiler.targets.cuda.device_arrays import device_dtype, from_device, to_device
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuExecutable, compile_gpu, occupancy_holds
from stitchfleet.compiler.targets.cuda.launch_library import LaunchLibrary, Program
from stitchfleet.compiler.targets.cuda.launch_library import build as build_launcher
from stitchfleet.compiler.targets.cuda.nvrtc import find_nvrtc
from stitchfleet.compiler.tolerance import check_outputs

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = PlanOptions(device="h200")  # 132 SMs: an H100 SXM's limits too


@dataclass
class CaseResult:
    label: str
    kernels: int
    barriers: int
    ok: bool = False
    checked: bool = True  # False in a dry run: nothing ran
    problems: list[str] = field(default_factory=list)
    measured_us: list[float] = field(default_factory=list)  # one per timed run (CUDA events)
    modeled_us: float = 0.0  # compiler.gpu_time: a model, not a measurement

    @property
    def median_us(self) -> float:
        return statistics.median(self.measured_us) if self.measured_us else math.nan


def io_bytes(graph: Graph) -> int:
    nodes = {p.id for p in graph.parameters} | {node for _, node in graph.outputs}
    return sum(math.prod(graph.node(n).shape) * graph.node(n).dtype.itemsize for n in nodes)


def cases(selection: Sequence[str], limit: int, max_bytes: float = math.inf) -> list[tuple[str, Graph]]:
    """(label, cluster graph) of every suite case's clusters and workload cluster file, filtered by substring
    and by bytes in and out (the host draws the inputs and evaluates the reference)."""
    found: list[tuple[str, Graph]] = []
    for path in sorted((ROOT / "benchmarks" / "suite").glob("*.json")):
        whole = load(path)
        found += [(f"{path.stem}#{c.id}", extract(whole, c.nodes)) for c in find_clusters(whole, 8).clusters]
    for path in sorted((ROOT / "benchmarks" / "workloads").glob("*/cluster_*.json")):
        found.append((f"{path.parent.name}/{path.stem}", load(path)))
    chosen = [(label, g) for label, g in found if not selection or any(s in label for s in selection)]
    chosen = [(label, g) for label, g in chosen if io_bytes(g) <= max_bytes]
    return chosen[:limit] if limit else chosen


class Gpu:
    """The device through cupy and the launch library (its primary context, a non-blocking stream)."""

    def __init__(self, cache: Path) -> None:
        import cupy  # the GPU image's; imported here so --dry-run needs none

        self.cp = cupy
        cupy.cuda.Device(0).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.launcher = build_launcher(ArtifactCache(cache / "launch", suffix="so"))
        self.library = LaunchLibrary(self.launcher)
        self.library.init()
        with self.library.primary(0):
            self.info = self.library.device()
        properties = cupy.cuda.runtime.getDeviceProperties(0)
        self.name = properties["name"].decode() if isinstance(properties["name"], bytes) else str(properties["name"])
        self.flush = cupy.empty(2 * int(properties["l2CacheSize"]), cupy.uint8)
        nvrtc = find_nvrtc()
        if nvrtc is None:
            raise RuntimeError("no NVRTC on the GPU machine")
        self.nvrtc = nvrtc
        self.holds = occupancy_holds(self.library, nvrtc, self.info.arch, artifact_cache(cache, "cubin"))

    def garbage(self, nbytes: int) -> Any:
        memory = self.cp.empty(max(nbytes, 16), self.cp.uint8)
        memory.fill(0xFF)
        return memory


def _buffer(graph: Graph, node: int, name: str, role: ir.Role) -> ir.Buffer:
    n = graph.node(node)
    return ir.Buffer(name, n.dtype, math.prod(n.shape), role)


def run_case(gpu: Gpu, label: str, graph: Graph, cache: Path, *, budget_s: float, check_only: bool) -> CaseResult:
    plan = plan_cluster(graph, 0, OPTIONS)
    exe = compile_gpu(graph, plan, gpu.info.arch, cache, nvrtc=gpu.nvrtc, launcher=gpu.launcher, holds=gpu.holds)
    barriers = sum(k.grid_barrier for k in exe.plan.kernels)
    result = CaseResult(label, len(exe.plan.kernels), barriers)
    cost = gpu_time.COSTS["h200" if "H200" in gpu.name else "h100"]
    result.modeled_us = gpu_time.total("stitch", 0, gpu_time.stitch_traffic(graph, plan), cost).microseconds
    stream = gpu.stream
    inputs = random_inputs(graph, 0)
    params = {str(p.attrs["name"]): p.id for p in graph.parameters}
    on_device = []
    for name in exe.plan.inputs:
        host = to_device(_buffer(graph, params[name], name, ir.Role.INPUT), inputs[name])
        memory = gpu.garbage(host.nbytes)
        memory[: host.nbytes].set(host.view(np.uint8))
        on_device.append(memory)
    outputs = dict(graph.outputs)
    out_device: list[Any] = []
    for name, source, repeat in zip(exe.plan.outputs, exe.plan.passthrough, exe.plan.repeats, strict=True):
        if source >= 0 or repeat >= 0:  # an input passed through; an earlier output's buffer (its value stored once)
            out_device.append(on_device[source] if source >= 0 else out_device[repeat])
            continue
        buf = _buffer(graph, outputs[name], name, ir.Role.OUTPUT)
        out_device.append(gpu.garbage(buf.size * graph.node(outputs[name]).dtype.itemsize))
    scratch = gpu.garbage(exe.plan.scratch_bytes) if exe.plan.scratch_bytes else None
    pointers = ([a.data.ptr for a in on_device], [a.data.ptr for a in out_device], scratch.data.ptr if scratch else 0)
    program = gpu.library.program(exe.module_path.read_bytes(), exe.plan, stream.ptr)
    try:
        program.run(*pointers, stream.ptr)  # a fresh program's flag words are 0: this run's alone
        stream.synchronize()
        result.problems += _check(graph, exe, inputs, out_device, program.flags()[0])
        if not check_only:
            result.measured_us = _time(gpu, program, pointers, budget_s)
    finally:
        program.close()
    result.ok = not result.problems
    return result


def _check(graph: Graph, exe: GpuExecutable, inputs: dict[str, Any], out_device: list[Any], flag: int) -> list[str]:
    want, wide = evaluate(graph, inputs), evaluate(graph, inputs, "float64")
    got: dict[str, Any] = {}
    outputs = dict(graph.outputs)
    plan = exe.plan
    for name, memory, source, repeat in zip(plan.outputs, out_device, plan.passthrough, plan.repeats, strict=True):
        if source >= 0:
            got[name] = inputs[exe.plan.inputs[source]]
            continue
        if repeat >= 0:  # the bytes of the earlier output it repeats, in its own shape (what the GPU op hands out)
            got[name] = got[plan.outputs[repeat]].reshape(graph.node(outputs[name]).shape)
            continue
        buf = _buffer(graph, outputs[name], name, ir.Role.OUTPUT)
        raw = memory[: buf.size * buf.dtype.itemsize].get().view(device_dtype(buf.dtype))
        got[name] = from_device(buf, raw).reshape(graph.node(outputs[name]).shape)
    problems = [f"{name}: {v.reason}" for name, v in check_outputs(got, want, wide).items() if not v.ok]
    stored = zip(exe.plan.outputs, exe.plan.passthrough, exe.plan.repeats, strict=True)
    checked = [name for name, source, repeat in stored if source < 0 and repeat < 0]
    floating = [n for n in checked if graph.node(outputs[n]).dtype in (DType.F16, DType.BF16, DType.F32, DType.F64)]
    expected = any(not np.isfinite(np.asarray(want[n], np.float64)).all() for n in floating)
    if flag != int(expected):
        problems.append(f"non-finite flag {flag}, the reference says {int(expected)}")
    return problems


def _time(gpu: Gpu, program: Program, pointers: tuple[list[int], list[int], int], budget_s: float) -> list[float]:
    """Timed runs until `budget_s` (at least 5, at most 200), each after an L2 flush outside its events."""
    cp, stream = gpu.cp, gpu.stream
    pairs: list[tuple[Any, Any]] = []
    start = time.monotonic()
    with stream:
        while len(pairs) < 200 and (len(pairs) < 5 or time.monotonic() - start < budget_s):
            gpu.flush.fill(len(pairs) & 0xFF)  # on `stream`: evicts what the previous run left in L2
            begin, end = cp.cuda.Event(), cp.cuda.Event()
            begin.record(stream)
            program.run(*pointers, stream.ptr)
            end.record(stream)
            pairs.append((begin, end))
            if len(pairs) % 10 == 0:
                stream.synchronize()
    stream.synchronize()
    return [cp.cuda.get_elapsed_time(b, e) * 1000.0 for b, e in pairs]


def dry_run(selected: list[tuple[str, Graph]], cache: Path) -> list[CaseResult]:
    """CI: each case planned, its launch plan made and its module compiled by NVRTC for sm_90; no GPU."""
    nvrtc = find_nvrtc()
    if nvrtc is None:
        raise SystemExit("bench_gpu_launch.py: no NVRTC (the nvidia-cuda-nvrtc-cu12 wheel) for the dry run")
    launcher = build_launcher(ArtifactCache(cache / "launch", suffix="so"))
    results = []
    for label, graph in selected:
        plan = plan_cluster(graph, 0, OPTIONS)
        exe = compile_gpu(graph, plan, "sm_90", cache, nvrtc=nvrtc, launcher=launcher)
        result = CaseResult(
            label, len(exe.plan.kernels), sum(k.grid_barrier for k in exe.plan.kernels), ok=True, checked=False
        )
        traffic = gpu_time.stitch_traffic(graph, plan)
        result.modeled_us = gpu_time.total("stitch", 0, traffic, gpu_time.COSTS["h100"]).microseconds
        print(f"  {label}: {result.kernels} kernel(s), module {exe.module_path.stat().st_size} bytes (dry run)")
        results.append(result)
    return results


def write(results: list[CaseResult], out: Path, device: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"launch_{device.replace(' ', '_')}_{datetime.date.today().isoformat()}"
    rows = [asdict(r) | {"median_us": r.median_us} for r in results]
    stem.with_suffix(".json").write_text(json.dumps({"device": device, "cases": rows}, indent=1))
    lines = [
        f"# Launch library on {device}: measured (CUDA events, L2 flushed before each run) and modeled",
        "",
        "| case | kernels | grid barriers | check | runs | median us (measured) | modeled us (a model) |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        check = "not run (dry run)" if not r.checked else "ok" if r.ok else "; ".join(r.problems)[:120]
        lines.append(
            f"| {r.label} | {r.kernels} | {r.barriers} | {check} | {len(r.measured_us)} "
            f"| {r.median_us:.2f} | {r.modeled_us:.2f} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gpu_launch.py", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", default=[], help="substrings of case labels (default: all)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many cases (0: no limit)")
    parser.add_argument("--max-bytes", type=float, default=300e6, help="skip cases moving more bytes in and out")
    parser.add_argument("--time-budget", type=float, default=300.0, help="seconds for all cases together")
    parser.add_argument("--check-only", action="store_true", help="one checked run per case (compute-sanitizer)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: plan and NVRTC-compile only")
    parser.add_argument("--out", type=Path, default=None, help="folder for the json and md results")
    args = parser.parse_args(argv)
    selected = cases(args.cases, args.limit or (1 if args.dry_run else 0), args.max_bytes)
    if not selected:
        parser.error(f"no case matches {args.cases}")
    cache = Path(tempfile.gettempdir()) / "stitchfleet-gpu-cache"
    out = args.out or Path(tempfile.mkdtemp(prefix="stitchfleet-launch-"))
    if args.dry_run:
        stem = write(dry_run(selected, cache), out, "dry-run")
        print(f"dry run ok: {len(selected)} case(s), results {stem}.md")
        return 0
    gpu = Gpu(cache)
    print(f"device {gpu.name} ({gpu.info.arch}, {gpu.info.sms} SMs), {len(selected)} case(s)")
    results, began = [], time.monotonic()
    for index, (label, graph) in enumerate(selected):
        left = args.time_budget - (time.monotonic() - began)
        if left <= 0:
            print(f"time budget spent: {len(selected) - index} case(s) not run")
            break
        try:
            result = run_case(
                gpu, label, graph, cache, budget_s=min(2.0, left / (len(selected) - index)), check_only=args.check_only
            )
        except Exception as err:  # a case's failure is a finding; the session goes on to the next
            result = CaseResult(label, 0, 0, problems=[f"{type(err).__name__}: {err}"])
        results.append(result)
        print(
            f"  {label}: {'ok' if result.ok else result.problems} median {result.median_us:.2f} us measured, "
            f"{result.modeled_us:.2f} us modeled"
        )
    stem = write(results, args.out or out, gpu.name)
    print(f"results {stem}.md")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
