"""The guard's record: a corpus of subtle kernel faults on every workload cluster, and false rejects.

Runs the catalogue of tests/plugin/guard_corpus.py (real cpu-backend kernels, numpy's float32 as
TF's result, float64 reference) on the clusters of the workload graphs, then judges correct runs
of those clusters and of every suite case (small shapes, every dtype) on many random inputs.
Prints a Markdown report (caught per fault kind, faults below fp32 noise, misses, false rejects,
the largest share of the allowance a correct run used) and writes it with --output.

    python scripts/guard_corpus.py [--models bert_encoder ...] [--seeds 10] [--output FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.suite import CASES, build_case
from stitchfleet import settings
from stitchfleet.compiler.scope import find_clusters
from stitchfleet.compiler.subgraph import extract
from tests.compiler.test_stitch_sim import SMALL
from tests.plugin.guard_corpus import (
    FAULTS,
    MODELS,
    Record,
    clean_ratio,
    compile_cluster,
    run_corpus,
    workload_clusters,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--seeds", type=int, default=10, help="random inputs per cluster for the false-reject run")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    cache = settings.current().cache_dir / "cpu"
    record, ratios, started = Record(), [], time.perf_counter()
    clusters = 0
    for model in args.models:
        for cluster in workload_clusters(model, cache):
            run_corpus(cluster, cache, record)
            ratios += [clean_ratio(cluster, seed) for seed in range(1, args.seeds + 1)]
            clusters += 1
        print(f"{model}: done ({clusters} clusters, {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    suite_checks = 0
    for name, shape in sorted(SMALL.items()):
        for dtype in CASES[name].dtypes:
            whole = build_case(name, shape, dtype)
            for index, found in enumerate(find_clusters(whole, 8).clusters):
                cluster = compile_cluster(extract(whole, found.nodes), cache, f"{name}/{dtype}/{index}")
                ratios += [clean_ratio(cluster, seed) for seed in range(2 * args.seeds)]
                suite_checks += 2 * args.seeds
    print("suite: done", file=sys.stderr)
    lines = [
        f"# Guard: fault corpus and false rejects (cpu backend, {time.strftime('%Y-%m-%d')})",
        "",
        f"Fault corpus on {clusters} workload clusters ({', '.join(args.models)}), factor 8, one fault per run.",
        "",
        "| fault | caught / applicable | below fp32 noise (not counted) |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {kind} | {record.caught[kind]} / {record.applicable[kind]} | {record.below_noise[kind]} |"
        for kind in FAULTS
    ]
    false = sum(ratio > 1 for ratio in ratios)
    lines += [
        "",
        f"False rejects: {false} of {len(ratios)} correct runs ({len(ratios) - suite_checks} on workload clusters,"
        f" {suite_checks} on suite cases at small shapes, every dtype); the largest share of the allowance a correct"
        f" run used: {max(ratios):.3f}.",
        "",
        "Missed faults:" if record.missed else "No applicable fault was missed.",
        *(f"- {miss}" for miss in record.missed),
        "",
        f"Time: {time.perf_counter() - started:.0f} s.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
