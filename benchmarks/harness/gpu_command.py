"""The GPU benchmark as a command: options, the GPU preflight, the run, the files and the summary.

Input: argv (the options of `stitchfleet bench gpu` and `scripts/bench_gpu.py`, one parser for
both). Output: an exit status; progress lines (one per case) and a summary table on `log`;
`<device>_<date>.json` and `.md` under --out (default benchmarks/results/, a temp folder for
--dry-run). Exit 0 when every case was timed or left out by the time budget, 1 when a case
failed or was not timed, 2 for bad options or, without --dry-run, no usable GPU (what is
missing is named; no figure is ever made up for a missing device).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import bench, cases, frameworks, results

EXIT_FAILED, EXIT_USAGE = 1, 2
RESULTS = Path(__file__).resolve().parent.parent / "results"
DESCRIPTION = "The GPU benchmark: stitched kernels vs per_op, JAX jit, torch.compile and copy bandwidth."
GPU_HELP = (
    "run `stitchfleet bench gpu --dry-run` to check the plumbing on this CPU (sim backend, tiny shapes), or see "
    'benchmarks/README.md, section "GPU session", for a run on a GPU machine'
)
Log = Callable[[str], None]


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("--dry-run", action="store_true", help="CPU: sim backend, tiny shapes, wall clock, temp output")
    p.add_argument("--cases", nargs="*", default=[], help="substrings of case names to keep (default: all)")
    p.add_argument("--max-bytes", type=float, default=None, help="skip cases whose IO bytes exceed this")
    p.add_argument("--workloads", action="store_true", help="also the workload clusters (benchmarks/workloads)")
    p.add_argument("--no-suite", action="store_true", help="leave the suite out (with --workloads)")
    p.add_argument("--runs", type=int, default=20, help="timed samples per variant (median; >= 20 for a figure)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per variant before sampling")
    p.add_argument("--profile", default="h200", help="planner device profile")
    p.add_argument("--check-max-bytes", type=float, default=64e6, help="above this IO, check against torch fp64 on GPU")
    p.add_argument("--torch-backend", default=None, help="torch.compile backend (inductor; dry run: eager)")
    p.add_argument("--no-frameworks", action="store_true", help="only our programs (no JAX, no torch.compile)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds after which no new case starts")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/)")
    return p


def missing_gpu() -> list[str]:
    """What a real (non dry) run lacks here: pycuda, torch, a CUDA device torch can see."""
    missing = [f"{m} is not installed" for m in ("pycuda", "torch") if not frameworks.available(m)]
    if frameworks.available("torch"):
        import torch

        if not torch.cuda.is_available():
            missing.append("torch sees no CUDA device")
    return missing


def _bad_options(args: argparse.Namespace) -> str | None:
    if args.runs < 1:
        return "--runs must be at least 1"
    if args.max_bytes is not None and args.max_bytes <= 0:
        return f"--max-bytes must be positive, got {args.max_bytes:g}"
    if args.no_suite and not args.workloads:
        return "--no-suite leaves nothing to run without --workloads"
    return None


def _cases(args: argparse.Namespace) -> list[cases.BenchCase]:
    ceiling = None if args.max_bytes is None else int(args.max_bytes)
    chosen: list[cases.BenchCase] = []
    if not args.no_suite:
        chosen += cases.select(cases.suite_cases(tiny=args.dry_run), args.cases, ceiling)
    if args.workloads:
        chosen += cases.select(cases.workload_cases(), args.cases, ceiling)
    return chosen


def _runner(args: argparse.Namespace) -> bench.Runner:
    if args.dry_run:
        from benchmarks.harness.sim_runner import SimRunner

        return SimRunner(args.torch_backend or "eager")
    # JAX takes 75% of the GPU at start unless told otherwise; torch and our kernels need room.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    from benchmarks.harness.gpu_runner import GpuRunner

    return GpuRunner(torch_backend=args.torch_backend or "inductor")


def _options(args: argparse.Namespace) -> bench.BenchOptions:
    return bench.BenchOptions(
        args.profile,
        args.runs,
        args.warmup,
        1e-3,
        int(args.check_max_bytes),
        not args.no_frameworks,
        time_budget_s=args.time_budget,
    )


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return Path(args.out)
    return Path(tempfile.mkdtemp(prefix="stitchfleet-dryrun-")) if args.dry_run else RESULTS


def _report(record: dict[str, Any], paths: tuple[Path, Path], log: Log) -> int:
    for line in results.summary_lines(record):
        log(line)
    log(f"wrote {paths[0]} and {paths[1]}")
    failed = [r["case"] for r in record["cases"] if "variants" not in r and r.get("skipped") != "time budget spent"]
    if failed:
        log(f"{len(failed)} case(s) failed or were not timed: {', '.join(failed)}")
    return EXIT_FAILED if failed else 0


def _refusal(args: argparse.Namespace, prog: str) -> str | None:
    """Why the run cannot start (bad options, no GPU), or None."""
    bad = _bad_options(args)
    if bad is not None:
        return f"{prog}: {bad}"
    missing = [] if args.dry_run else missing_gpu()
    if missing:
        return f"{prog}: no usable GPU here: {'; '.join(missing)}. Nothing was measured; {GPU_HELP}."
    return None


def run(args: argparse.Namespace, prog: str = "bench_gpu.py", log: Log = print) -> int:
    """The whole command on parsed options (see the module docstring)."""
    refusal = _refusal(args, prog)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return EXIT_USAGE
    chosen = _cases(args)
    if not chosen:
        print(f"{prog}: no case matches --cases/--max-bytes", file=sys.stderr)
        return EXIT_USAGE
    record = bench.run(chosen, _runner(args), _options(args), log)
    return _report(record, results.write(record, _out_dir(args)), log)


def main(argv: Sequence[str] | None = None, prog: str = "bench_gpu.py") -> int:
    """Parse argv and run; progress goes to stdout, flushed line by line (the GPU session tees it)."""
    args = build_parser(prog).parse_args(argv)
    return run(args, prog, lambda line: print(line, flush=True))
