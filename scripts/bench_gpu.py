"""The GPU benchmark: stitched kernels vs per_op, JAX jit, torch.compile and copy bandwidth.

Input: the command line (cases, size ceiling, runs; `--dry-run` for the CPU plumbing
check on the sim backend at tiny shapes). Output: `<device>_<date>.json` and `.md`
under --out (default benchmarks/results/, a temp dir for --dry-run), progress lines
on stdout. See benchmarks/README.md, "GPU session".

    PYTHONPATH=. python3 scripts/bench_gpu.py --max-bytes 300e6 --out $OUT/results
    PYTHONPATH=. python scripts/bench_gpu.py --dry-run --cases softmax_fwd
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

# JAX takes 75% of the GPU at start unless told otherwise; torch and our kernels need room.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.harness import bench, cases, results


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_gpu.py", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU: sim backend, tiny shapes, wall clock, temp output")
    p.add_argument("--cases", nargs="*", default=[], help="substrings of case names to keep (default: all)")
    p.add_argument("--max-bytes", type=float, default=None, help="skip cases whose IO bytes exceed this")
    p.add_argument("--workloads", action="store_true", help="also the workload clusters (benchmarks/workloads)")
    p.add_argument("--no-suite", action="store_true", help="leave the suite out (with --workloads)")
    p.add_argument("--runs", type=int, default=20, help="timed samples per variant (median; >= 20 for a figure)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", default="h200", help="planner device profile")
    p.add_argument("--check-max-bytes", type=float, default=64e6, help="above this IO, check against torch fp64 on GPU")
    p.add_argument("--torch-backend", default=None, help="torch.compile backend (inductor; dry run: eager)")
    p.add_argument("--no-frameworks", action="store_true", help="only our programs (no JAX, no torch.compile)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds after which no new case starts")
    p.add_argument("--out", type=Path, default=None, help="results folder")
    return p.parse_args(argv)


def _cases(args: argparse.Namespace) -> list[cases.BenchCase]:
    chosen: list[cases.BenchCase] = []
    if not args.no_suite:
        chosen += cases.select(cases.suite_cases(tiny=args.dry_run), args.cases, _bytes(args.max_bytes))
    if args.workloads:
        chosen += cases.select(cases.workload_cases(), args.cases, _bytes(args.max_bytes))
    return chosen


def _bytes(value: float | None) -> int | None:
    return None if value is None else int(value)


def _runner(args: argparse.Namespace) -> bench.Runner:
    if args.dry_run:
        from benchmarks.harness.sim_runner import SimRunner

        return SimRunner(args.torch_backend or "eager")
    from benchmarks.harness.gpu_runner import GpuRunner

    return GpuRunner(torch_backend=args.torch_backend or "inductor")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    chosen = _cases(args)
    if not chosen:
        print("no case matches --cases/--max-bytes", file=sys.stderr)
        return 2
    opts = bench.BenchOptions(
        args.profile,
        args.runs,
        args.warmup,
        1e-3,
        int(args.check_max_bytes),
        not args.no_frameworks,
        time_budget_s=args.time_budget,
    )
    record = bench.run(chosen, _runner(args), opts, lambda line: print(line, flush=True))
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="stitchfleet-dryrun-")) if args.dry_run else Path("benchmarks/results")
    )
    json_path, md_path = results.write(record, out)
    print(f"wrote {json_path} and {md_path}")
    failed = [r["case"] for r in record["cases"] if "variants" not in r and r.get("skipped") != "time budget spent"]
    if failed:
        print(f"{len(failed)} case(s) failed or were not timed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
