"""One benchmark run: every selected case through every variant, checked, timed, summarised.

Input: `BenchCase`s, a runner (`SimRunner` for the dry run, `GpuRunner` on a GPU) and
`BenchOptions`. Output: the run's record (a dict ready for JSON: device, clock, copy
bandwidth, one entry per case) and a progress line per case on `log`.

Per case: host inputs drawn once (`random_inputs`, fixed seed), every variant built on
them; each variant's outputs are checked against the references (our programs with the
guard's factor 8, the frameworks with 64: they reorder f32 arithmetic, see the tests);
a failing variant is not timed and the record says why; when our stitched program
fails, the case is not timed at all. Figures: median time, effective GB/s (IO bytes
over time), % of copy bandwidth, speedup of stitch over every other variant, kernels.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from benchmarks.harness.cases import BenchCase
from benchmarks.harness.programs import Program, programs
from benchmarks.harness.timing import Timing, Variant, measure, run_once
from stitchfleet.compiler.evaluate import random_inputs
from stitchfleet.compiler.ir import DType, Graph
from stitchfleet.compiler.tolerance import check_outputs

Array = npt.NDArray[Any]
OUR_FACTOR, FRAMEWORK_FACTOR = 8.0, 64.0


class Runner(Protocol):
    clock: str

    @property
    def device_name(self) -> str: ...

    def program(self, program: Program, graph: Graph, inputs: Mapping[str, Array]) -> Variant: ...

    def frameworks(self, graph: Graph, inputs: Mapping[str, Array]) -> list[Variant | None]: ...

    def sample(self, variant: Variant, reps: int) -> float: ...

    def copy_bandwidth(self) -> dict[str, float]: ...

    def references(
        self, graph: Graph, inputs: Mapping[str, Array], check_max_bytes: int, io: int
    ) -> tuple[str, dict[str, Array], dict[str, Array]]: ...


@dataclass(frozen=True)
class BenchOptions:
    profile: str = "h200"
    runs: int = 20
    warmup: int = 3
    target_s: float = 1e-3
    check_max_bytes: int = 64 << 20
    frameworks: bool = True
    seed: int = 0
    time_budget_s: float | None = None  # no new case starts after this many seconds


def _variants(
    case: BenchCase, runner: Runner, opts: BenchOptions, inputs: Mapping[str, Array]
) -> tuple[list[Variant], dict[str, str]]:
    """Every variant that could be built, and why the others could not."""
    built: list[Variant] = []
    missing: dict[str, str] = {}
    for kind in ("stitch", "per_op"):
        try:
            (program,) = programs(case.graph, opts.profile, (kind,))
            built.append(runner.program(program, case.graph, inputs))
        except Exception as err:  # a planner/lowering/compile failure is a result to report
            missing[kind] = f"{type(err).__name__}: {err}"
    if opts.frameworks:
        for name, variant in zip(("jax_jit", "torch_compile"), runner.frameworks(case.graph, inputs), strict=True):
            if variant is None:
                missing[name] = "not installed"
            else:
                built.append(variant)
    return built, missing


def _check(variant: Variant, refs: tuple[str, dict[str, Array], dict[str, Array]], graph: Graph) -> dict[str, Any]:
    bf16 = frozenset(n for n, i in graph.outputs if graph.node(i).dtype is DType.BF16)
    factor = OUR_FACTOR if variant.name in ("stitch", "per_op") else FRAMEWORK_FACTOR
    try:
        run_once(variant)
        output_checks = check_outputs(variant.read(), refs[1], refs[2], factor=factor, bf16_outputs=bf16)
    except Exception as err:  # a launch or compile error fails the check, with the reason
        return {"ok": False, "reference": refs[0], "reason": f"{type(err).__name__}: {err}"}
    bad = {n: v.reason for n, v in output_checks.items() if not v.ok}
    errors = {n: {"error": v.compiled_error, "native_error": v.native_error} for n, v in output_checks.items()}
    return {
        "ok": not bad,
        "reference": refs[0],
        "factor": factor,
        "reason": "; ".join(f"{n}: {r}" for n, r in bad.items()),
        "outputs": errors,
    }


def _figures(timings: dict[str, Timing], io: int, copy_gbps: float, kernels: dict[str, int | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, t in timings.items():
        gbps = io / t.median_s / 1e9
        out[name] = {**t.to_json(), "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps, "kernels": kernels.get(name)}
    if "stitch" in timings:
        for name, t in timings.items():
            if name != "stitch":
                out["stitch"][f"speedup_vs_{name}"] = t.median_s / timings["stitch"].median_s
    return out


def bench_case(case: BenchCase, runner: Runner, opts: BenchOptions, copy_gbps: float) -> dict[str, Any]:
    """One case's record (see the module docstring)."""
    graph = case.graph
    record: dict[str, Any] = {"case": case.name, "source": case.source, "io_bytes": case.io_bytes}
    record.update({k: graph.metadata[k] for k in ("shape", "dtype") if k in graph.metadata})
    inputs = random_inputs(graph, opts.seed)
    variants, record["not_run"] = _variants(case, runner, opts, inputs)
    refs = runner.references(graph, inputs, opts.check_max_bytes, case.io_bytes)
    record["checks"] = {v.name: _check(v, refs, graph) for v in variants}
    passing = [v for v in variants if record["checks"][v.name]["ok"]]
    if not record["checks"].get("stitch", {}).get("ok", False):
        record["skipped"] = "our stitched program failed its correctness check or could not be built: not timed"
        return record
    timings = measure(runner.sample, passing, opts.runs, opts.warmup, opts.target_s)
    record["variants"] = _figures(timings, case.io_bytes, copy_gbps, {v.name: v.kernels for v in variants})
    return record


def progress_line(record: Mapping[str, Any]) -> str:
    if "variants" not in record:
        reason = record.get("checks", {}).get("stitch", {}).get("reason") or record.get("not_run", {}).get("stitch", "")
        return f"{record['case']}: {record.get('skipped', 'not timed')} {reason}"
    figures = record["variants"]
    parts = [f"{n} {f['median_s'] * 1e6:.1f}us" for n, f in figures.items()]
    s = figures["stitch"]
    return f"{record['case']}: {', '.join(parts)}; stitch {s['gbps']:.0f} GB/s ({s['pct_copy']:.0f}% of copy)"


def run(
    cases: list[BenchCase], runner: Runner, opts: BenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole run's record; a case that raises is recorded with its traceback and the run goes on."""
    started = time.time()
    copy = runner.copy_bandwidth()
    log(f"device {runner.device_name}: copy bandwidth {copy['gbps']:.0f} GB/s; {len(cases)} case(s)")
    records: list[dict[str, Any]] = []
    deadline = None if opts.time_budget_s is None else time.monotonic() + opts.time_budget_s
    for i, case in enumerate(cases, 1):
        if deadline is not None and time.monotonic() > deadline:
            records += [{"case": c.name, "source": c.source, "skipped": "time budget spent"} for c in cases[i - 1 :]]
            log(f"time budget of {opts.time_budget_s:.0f}s spent: {len(cases) - i + 1} case(s) left out")
            break
        t0 = time.perf_counter()
        try:
            record = bench_case(case, runner, opts, copy["gbps"])
        except Exception as err:
            record = {
                "case": case.name,
                "source": case.source,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(),
            }
        gc.collect()  # the case's device buffers go before the next case allocates its own
        record["wall_s"] = time.perf_counter() - t0
        records.append(record)
        log(f"[{i}/{len(cases)} {record['wall_s']:.1f}s] " + (record.get("error") or progress_line(record)))
    return {
        "device": runner.device_name,
        "clock": runner.clock,
        "started_unix": started,
        "options": {**opts.__dict__},
        "copy": copy,
        "cases": records,
        "geomean_speedup": _summary(records),
    }


def _summary(records: list[dict[str, Any]]) -> dict[str, float]:
    """Geometric mean of stitch's speedup over each baseline across timed cases."""
    ratios: dict[str, list[float]] = {}
    for r in records:
        for key, value in r.get("variants", {}).get("stitch", {}).items():
            if key.startswith("speedup_vs_"):
                ratios.setdefault(key, []).append(value)
    return {k: float(np.exp(np.mean(np.log(v)))) for k, v in ratios.items()}
