"""Per-cluster time of the cpu target's generated C through the `_pooled` entry TF's op calls (figures, not tests).

Input: the command line: `--model` (a model of scripts/bench_step.py) with `--dump DIR` saves the clusters its hook
installs as graph JSON; `--graphs DIR` times them, this checkout's C against `--against` another checkout's (its own
generator, run in a child process), alternated in one process. Output: on stdout, per cluster, the min and median us
of `<f>_pooled` with a runner that runs every task inline (TF's op with a one-thread pool), buffers at staggered
offsets in their pages as the dispatch op allocates them (plugin/native/csrc/staggered.h); hot (one buffer set,
caches warm) or colder (`--sets N` buffer sets in turn: 97 sets of the transformer's clusters are past the L3).

    PYTHONPATH=. python scripts/bench_kernels.py --model transformer --dump /tmp/clusters
    PYTHONPATH=. python scripts/bench_kernels.py --graphs /tmp/clusters --against /tmp/main-checkout --sets 97
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
RUNNER = ROOT / "scripts" / "bench_kernels_runner.c"  # every task inline: the op with a one-thread pool
# The generator of a checkout (argv: its root, the graphs' folder, the output folder): C text and parameters per graph.
GENERATE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from stitchfleet.compiler.ir import serialization
from stitchfleet.compiler.plan import PlanOptions, plan_cluster
from stitchfleet.compiler.targets.cpu.source import cluster_source
for path in sorted(Path(sys.argv[2]).glob("*.json")):
    graph = serialization.load(path)
    source = cluster_source(graph, plan_cluster(graph, 0, PlanOptions()), "f")
    (Path(sys.argv[3]) / (path.stem + ".c")).write_text(source.text)
    params = [[p.name, p.dtype.value, list(p.shape), p.output] for p in source.params]
    (Path(sys.argv[3]) / (path.stem + ".params")).write_text(json.dumps(params))
"""


def dump(model: str, folder: Path) -> None:
    """The graphs of the clusters the hook installs on `model`, as `<position>.json` in `folder`."""
    from bench_step import _hooked_session

    from stitchfleet.compiler.ir import serialization

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        session, hook, _, _ = _hooked_session({"batch": 8, "seq": 32, "hidden": 128, "heads": 4}, "native", tmp, model)
        for position, (cluster, _) in enumerate(hook.installed):
            serialization.save(cluster.kernel.graph, folder / f"{model}_{position:02d}.json")
        session.close()


def build(checkout: Path, graphs: Path, out: Path) -> None:
    """Each graph's C from `checkout`'s generator, compiled as the cpu target compiles it."""
    from stitchfleet.compiler.targets.cpu.executable import BASE_FLAGS

    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", GENERATE, str(checkout), str(graphs), str(out)], check=True)
    for c_file in sorted(out.glob("*.c")):
        argv = ["cc", *BASE_FLAGS, "-march=native", str(c_file), "-o", str(c_file.with_suffix(".so")), "-lm"]
        subprocess.run(argv, check=True)


def staggered(shape: tuple[int, ...], dtype: Any, n: int) -> Any:
    """An array starting 5 * n cache lines into a page (mod 64), as the dispatch op's large outputs."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(nbytes + 8192, np.uint8)
    offset = ((n * 5 % 64) * 64 - raw.ctypes.data) % 4096
    return raw[offset : offset + nbytes].view(dt).reshape(shape)


def time_cluster(graph_file: Path, builds: list[Path], runner: int, sets: int, reps: int) -> list[list[float]]:
    """Seconds per call of each build's `f_pooled`, the builds alternated call block by call block."""
    from stitchfleet.compiler.evaluate import random_inputs
    from stitchfleet.compiler.ir import DType, serialization

    inputs = random_inputs(serialization.load(graph_file), 3)
    calls, entries, count = max(sets, 20), [], 0
    for folder in builds:
        fn = ctypes.CDLL(str(folder / (graph_file.stem + ".so"))).f_pooled
        fn.argtypes, fn.restype = [ctypes.c_void_p] * 3, ctypes.c_int
        params = json.loads((folder / (graph_file.stem + ".params")).read_text())
        arrays = []
        for _ in range(sets):
            bufs = []
            for name, dtype, shape, output in params:
                buf = staggered(tuple(shape), DType(dtype).numpy, count)
                count += 1
                buf[...] = 0 if output else inputs[name]
                bufs.append(buf)
            arrays.append((bufs, (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])))
        entries.append((fn, arrays))
    times: list[list[float]] = [[] for _ in builds]
    for r in range(reps):
        for i in range(len(builds)) if r % 2 else reversed(range(len(builds))):
            fn, arrays = entries[i]
            for c in range(calls):
                started = time.perf_counter()
                fn(arrays[c % sets][1], runner, None)
                times[i].append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_kernels.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model of bench_step whose clusters --dump saves")
    parser.add_argument("--dump", type=Path, default=None, help="folder for the model's cluster graphs")
    parser.add_argument("--graphs", type=Path, default=None, help="folder of cluster graphs to time")
    parser.add_argument("--against", type=Path, default=None, help="another checkout, its C timed beside this one's")
    parser.add_argument("--sets", type=int, default=1, help="buffer sets used in turn (1: hot caches)")
    parser.add_argument("--reps", type=int, default=16, help="alternations of the builds, each a block of calls")
    args = parser.parse_args(argv)
    if args.model and args.dump:
        dump(args.model, args.dump)
    if args.graphs is None:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cc", "-O2", "-fPIC", "-shared", str(RUNNER), "-o", str(Path(tmp) / "runner.so")], check=True)
        runner = ctypes.cast(ctypes.CDLL(str(Path(tmp) / "runner.so")).sf_inline, ctypes.c_void_p).value
        checkouts = [ROOT, *([args.against] if args.against else [])]
        builds = [Path(tmp) / f"build{i}" for i in range(len(checkouts))]
        for checkout, folder in zip(checkouts, builds, strict=True):
            build(checkout, args.graphs, folder)
        print("| cluster | " + " | ".join(f"{c} min / median us" for c in checkouts) + " | min ratio |")
        print("|---|" + "---:|" * (len(checkouts) + 1))
        for graph_file in sorted(args.graphs.glob("*.json")):
            times = time_cluster(graph_file, builds, runner or 0, args.sets, args.reps)
            cells = [f"{min(t) * 1e6:.1f} / {statistics.median(t) * 1e6:.1f}" for t in times]
            ratio = f"{min(times[0]) / min(times[-1]):.3f}" if len(times) > 1 else "-"
            print(f"| {graph_file.stem} | " + " | ".join(cells) + f" | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
