"""Instructions per call of the demo model's generated CPU kernels (figures, not tests), counted by callgrind.

Input: the demo's clusters (graph and plan of each installed cluster, built once by the hook with TF and kept
in a pickle, `--clusters`), or C sources saved by an earlier run (`--sources`, to compare generator versions).
Output: per cluster, instructions per call of its `_entry` (production flags but AVX2, see `count`; one
thread, random inputs in [-2, 2], one warm-up call and `--reps` calls counted) and the fastest of 300 timed
calls (production flags), and the totals; `--save DIR` writes the generated C there. `--dims` sizes the demo model
(batch, seq, hidden, heads; default 8 32 128 4), `--model` takes another model of `scripts/bench_step.py` (an
ab_jobs job such as `transformer`, or a Keras model); each model and size has its own pickle.

    PYTHONPATH=. python scripts/kernel_instructions.py --save /tmp/k-before
    PYTHONPATH=. python scripts/kernel_instructions.py --sources /tmp/k-before
    PYTHONPATH=. python scripts/kernel_instructions.py --dims 16 64 256 4
    PYTHONPATH=. python scripts/kernel_instructions.py --model transformer --only 3 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TIMED_REPS = 300
DIMS = {"batch": 8, "seq": 32, "hidden": 128, "heads": 4}
_FILL = {  # storage C type -> value from a uniform u in [0, 1)
    "float": "(float)(4.0 * u - 2.0)",
    "double": "4.0 * u - 2.0",
    "_Float16": "(_Float16)(4.0 * u - 2.0)",
    "uint8_t": "(uint8_t)(u < 0.5)",
    "int32_t": "(int32_t)(4.0 * u)",
    "int64_t": "(int64_t)(4.0 * u)",
}


def dump(path: Path, dims: dict[str, int] = DIMS, model: str = "demo") -> None:
    """The model's installed clusters (index, graph, plan), as the hook builds them, pickled to `path`."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_step

    from stitchfleet.compiler.targets.cpu.executable import CpuExecutable

    found = []
    with tempfile.TemporaryDirectory() as tmp:
        session, hook, _, _ = bench_step._hooked_session(dims, "native", tmp, model)
        for c, _ in hook.installed:
            executable = c.kernel.executable  # the CPU target's (the demo's hook runs with backend cpu)
            if not isinstance(executable, CpuExecutable):
                raise RuntimeError(f"cluster {c.index}: {type(executable).__name__}, not the CPU target's kernel")
            found.append((c.index, executable.graph, executable.plan))
        session.close()
    path.write_bytes(pickle.dumps(found))


def generated(clusters: Path) -> dict[str, dict[str, Any]]:
    """Per cluster function name: its C text and parameters (storage type, element count)."""
    from stitchfleet.compiler.targets.cpu.cexpr import STORAGE
    from stitchfleet.compiler.targets.cpu.source import cluster_source

    out = {}
    for index, graph, plan in pickle.loads(clusters.read_bytes()):
        source = cluster_source(graph, plan, f"cluster{index}")
        params = [(STORAGE[p.dtype], math.prod(p.shape)) for p in source.params]
        out[source.function] = {"text": source.text, "params": params}
    return out


HARNESS = Path(__file__).with_name("kernel_instructions_main.c")  # the fixed C; only the buffers are generated


# Why staggered: glibc serves each large buffer by mmap at the same offset in its page, so every buffer of a
# many-output cluster fell into the same cache sets, and a cluster of 14 1 MB streams (the transformer's GELU
# backward, cluster 10) timed 455 us where the same code with staggered buffers takes 194 us (its
# instructions do not change). Where TF's allocator puts the dispatch op's buffers was not measured.
STAGGER = 5  # cache lines between the page offsets of consecutive buffers (odd: all 64 offsets in turn)


def _offset(index: int) -> int:
    return (index * STAGGER % 64) * 64


def params_header(function: str, params: list[tuple[str, int]]) -> str:
    """kernel_params.h for HARNESS: the entry's name, the buffer count, and `sf_fill`, which allocates each buffer
    (64-byte aligned, buffer i at a page offset of `STAGGER` x i lines) and fills it from the harness' uniform
    sequence (signature-dependent glue only)."""
    lines = [f"#define SF_ENTRY {function}_entry", f"#define SF_NPARAMS {len(params)}"]
    lines += ["double sf_uniform(uint64_t *s);", "static void sf_fill(void **b, uint64_t *s) {"]
    for i, (ctype, count) in enumerate(params):
        size = -(-max(count, 1) * 8 // 64) * 64
        lines += [
            f"  {ctype} *p{i} = ({ctype} *)((char *)aligned_alloc(4096, {size} + 4096) + {_offset(i)});",
            f"  for (long i = 0; i < {max(count, 1)}; ++i) {{",
            "    double u = sf_uniform(s);",
            f"    p{i}[i] = {_FILL[ctype]};",
            "  }",
            f"  b[{i}] = p{i};",
        ]
    lines += ["  (void)s;", "}"]
    return "\n".join(lines) + "\n"


def count(function: str, entry: dict[str, Any], reps: int, work: Path, opt: str = "") -> tuple[float, float]:
    """Instructions per call of the entry (callgrind, collected inside `<function>_entry` only) and the
    fastest of `TIMED_REPS` timed calls in ns. Callgrind has no AVX-512 (valgrind 3.19 stops with SIGILL),
    so the counted build adds -mno-avx512f (AVX2, 32-byte vectors); the timed build is the production one."""
    from stitchfleet.compiler.targets.cpu.executable import CpuOptions

    c_file, binary, out = work / f"{function}.c", work / function, work / f"{function}.callgrind"
    main_file = HARNESS  # its own unit: the entry is not inlined into main
    c_file.write_text(entry["text"])
    (work / "kernel_params.h").write_text(params_header(function, entry["params"]))
    flags = [f for f in CpuOptions(work).flags if f not in ("-shared", "-fPIC")]
    flags = [opt if opt and f.startswith("-O") else f for f in flags]  # another optimisation level, to compare
    flags += [f"-I{work}", f"-DSF_REPS={reps}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(["cc", *flags, "-mno-avx512f", str(c_file), str(main_file), "-o", str(binary), "-lm"], check=True)
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"--toggle-collect={function}_entry"]
    subprocess.run([*command, str(binary)], check=True, env=env, capture_output=True)
    # the warm-up call is collected too: every call runs the same code on the same data
    totals = next(line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:")))
    timed = [*(f for f in flags if not f.startswith("-DSF_REPS=")), "-DSF_TIMED", f"-DSF_REPS={TIMED_REPS}"]
    subprocess.run(["cc", *timed, str(c_file), str(main_file), "-o", str(binary), "-lm"], check=True)
    ns = float(subprocess.run([str(binary)], check=True, env=env, capture_output=True, text=True).stdout)
    return int(totals.split()[1]) / (reps + 1), ns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernel_instructions.py", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=Path, default=None, help="the pickle (default: one per model and dims)")
    parser.add_argument(
        "--dims", type=int, nargs=4, default=list(DIMS.values()), metavar=("BATCH", "SEQ", "HIDDEN", "HEADS")
    )
    parser.add_argument("--model", default="demo", help="demo (sized by --dims), an ab_jobs job, a Keras model")
    parser.add_argument("--only", nargs="+", type=int, default=None, help="these cluster indices only")
    parser.add_argument("--sources", type=Path, default=None, help="measure the C saved here instead")
    parser.add_argument("--save", type=Path, default=None, help="write the generated C (sources.json) here")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--opt", default="", help="replace the production -O level, e.g. -O2 (compile flags' A/B)")
    args = parser.parse_args(argv)
    dims = dict(zip(DIMS, args.dims, strict=True))
    if args.sources is not None:
        entries = json.loads((args.sources / "sources.json").read_text())
    else:
        sized = "-".join(map(str, args.dims)) if args.model == "demo" else "default"
        clusters = args.clusters or Path(tempfile.gettempdir()) / f"{args.model}-clusters-{sized}.pkl"
        if not clusters.exists():
            dump(clusters, dims, args.model)
        entries = generated(clusters)
    if args.only is not None:
        entries = {f: e for f, e in entries.items() if int(f.removeprefix("cluster")) in args.only}
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "sources.json").write_text(json.dumps(entries))
    total, total_ns = 0.0, 0.0
    print(f"{'cluster':10s} {'instructions (AVX2)':>20s} {'min us (AVX-512)':>17s}")
    with tempfile.TemporaryDirectory() as tmp:
        for function, entry in entries.items():
            n, ns = count(function, entry, args.reps, Path(tmp), args.opt)
            total, total_ns = total + n, total_ns + ns
            print(f"{function:10s} {n:20,.0f} {ns / 1e3:17.1f}", flush=True)
    print(f"{'total':10s} {total:20,.0f} {total_ns / 1e3:17.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
