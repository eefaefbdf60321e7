"""The hook's setup cost on the demo model: `begin` cold (empty kernel cache) and warm, optionally profiled.

Input: command-line arguments: runs per mode, the modes (`cold`, `warm`, alternated run by run),
the STITCHFLEET_COMPILE_WORKERS values to alternate (`--workers 1,2`), a cProfile of the last warm
run (`--profile N`: the N most expensive functions by cumulative time, on stderr) and where the
shim's prebuilt native op lies (`--op-dir DIR`: the DIR/ops of `stitchfleet shim install DIR
--with-op`; without it the op is built from source into the cache, as in a pod whose shim ships
none). Output: on stdout, one line per run (mode, `begin` seconds, the hook's own
`compile_seconds`, the time to import TF and the hook, the clusters compiled of those built and
their seconds, the clusters installed and left to TF), the medians per mode, whether every run
made the same decisions, and the machine's load average before and after. Every run is a fresh
Python process, as a pod is; a cold run gets an empty STITCHFLEET_CACHE_DIR, a warm run the
directory a first run filled (same graph, same settings: a pod sharing the job's kernel cache).
Runs against older revisions too (`python REV/scripts/bench_setup.py` with this file copied there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def child(cache_dir: str, state_dir: str, profile: int, op_dir: str, workers: int) -> dict[str, Any]:
    """One `begin` of the demo model in this process (what a pod's first session creation pays)."""
    os.environ["STITCHFLEET_CACHE_DIR"] = cache_dir
    started = time.perf_counter()
    import tensorflow as tf

    from stitchfleet.demo import command
    from stitchfleet.plugin.native import dispatch_op
    from stitchfleet.plugin.session.hook import StitchHook
    from stitchfleet.plugin.setup import selection

    imported = time.perf_counter() - started
    compiles: list[Any] = []  # what the hook's choice of clusters reports (Candidates.compiles)
    choose = selection.choose

    def reporting(*args: Any, **kwargs: Any) -> Any:
        found = choose(*args, **kwargs)
        compiles.append(getattr(found, "compiles", None))  # None: a revision before the report
        return found

    selection.choose = reporting
    # The shim's op folder, as a pod sees it (none: this process builds the op from source into the cache).
    dispatch_op.prebuilt_dirs = lambda: [Path(op_dir) / dispatch_op.PREBUILT_DIR] if op_dir else []
    settings = command.demo_settings(Path(state_dir), "cpu")
    if workers:
        settings = dataclasses.replace(settings, compile_workers=workers)
    graph, *_ = command._build(command.DIMS)
    hook = StitchHook(settings, db_url=f"sqlite:///{Path(state_dir) / 'telemetry.db'}")
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    with graph.as_default():
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        hook.begin()
        if profiler is not None:
            profiler.disable()
        begin = time.perf_counter() - started
    if profiler is not None:
        import io
        import pstats

        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(profile)
        print(out.getvalue(), file=sys.stderr)
    tf.compat.v1.reset_default_graph()
    return {
        "imports": imported,
        "begin": begin,
        "compile_seconds": hook._setup_seconds,
        "installed": sorted(c.index for c, _ in hook.installed),
        "off": {str(k): v for k, v in sorted(hook.off.items())},
        "stats": dataclasses.asdict(compiles[0]) if compiles and compiles[0] is not None else None,
    }


def _run_child(cache_dir: Path, profile: int, env: dict[str, str], op_dir: str, workers: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-setup-state-") as state:
        command = [sys.executable, __file__, "--child", str(cache_dir), state, "--profile", str(profile)]
        command += ["--op-dir", op_dir, "--workers", str(workers)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    if profile:
        print(done.stderr[done.stderr.find("function calls") - 20 :], file=sys.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _line(mode: str, got: dict[str, Any]) -> str:
    stats = got["stats"] or {}
    compiles = f"  compiled {stats['compiled']}/{stats['built']} in {stats['seconds']:.2f} s" if stats else ""
    return (
        f"{mode:<8} begin {got['begin']:6.2f} s  compile_seconds {got['compile_seconds']:6.2f} s"
        f"  imports {got['imports']:5.2f} s{compiles}  installed {len(got['installed'])}  left {len(got['off'])}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (alternated)")
    parser.add_argument("--modes", default="cold,warm", help="cold, warm or both (comma-separated)")
    parser.add_argument("--profile", type=int, default=0, help="cProfile the last warm run: print this many rows")
    parser.add_argument("--op-dir", default="", help="a shim dir holding ops/ (prebuilt op); empty: build it")
    parser.add_argument(
        "--workers", default="0", help="STITCHFLEET_COMPILE_WORKERS values to alternate, e.g. 1,2 (0: the default)"
    )
    parser.add_argument("--child", nargs=2, metavar=("CACHE_DIR", "STATE_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cache_dir, state_dir = args.child
        print(json.dumps(child(cache_dir, state_dir, args.profile, args.op_dir, int(args.workers))))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    workers = [int(w) for w in args.workers.split(",")]
    modes = [(mode, w) for mode in args.modes.split(",") for w in workers]
    label = {m: m[0] if len(workers) == 1 else f"{m[0]}/w{m[1]}" for m in modes}
    times: dict[tuple[str, int], list[float]] = {m: [] for m in modes}
    results: dict[tuple[str, int], list[dict[str, Any]]] = {m: [] for m in modes}
    op_dir = args.op_dir or "none (op built from source)"
    print(f"load average before: {_load()}  ({os.cpu_count()} cores); prebuilt op dir: {op_dir}")
    with tempfile.TemporaryDirectory(prefix="bench-setup-warm-") as warm_dir:
        if any(mode == "warm" for mode, _ in modes):
            _run_child(Path(warm_dir), 0, env, args.op_dir)  # fills the cache, as the job's first pod does
        for k in range(args.runs):
            for mode, w in modes:
                profile = args.profile if mode == "warm" and k == args.runs - 1 else 0
                if mode == "cold":
                    with tempfile.TemporaryDirectory(prefix="bench-setup-cold-") as cold_dir:
                        got = _run_child(Path(cold_dir), profile, env, args.op_dir, w)
                else:
                    got = _run_child(Path(warm_dir), profile, env, args.op_dir, w)
                times[(mode, w)].append(got["begin"])
                results[(mode, w)].append(got)
                print(_line(label[(mode, w)], got), flush=True)
    for m in modes:
        print(f"median {label[m]}: begin {statistics.median(times[m]):.2f} s over {len(times[m])} runs")
    runs = [got for m in modes for got in results[m]]
    same = all(got["installed"] == runs[0]["installed"] and got["off"] == runs[0]["off"] for got in runs)
    print(f"every run installed the same clusters and left the same ones with the same reasons: {same}")
    print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
