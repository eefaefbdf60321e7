"""CPU figures (not tests): stitched `cpu` code vs plain TensorFlow CPU running the same cluster.

Input: the workload clusters in benchmarks/workloads/*/cluster_*.json and the suite cases
at CPU-sized shapes (filters: --only, --scale, --max-elements). Output: a table on stdout
and benchmarks/results/cpu-<date>.json/.md, labelled with the CPU model and core count.
A thin wrapper: the command is `benchmarks.cpu_harness.command`, which `stitchfleet bench
cpu` runs too.

    PYTHONPATH=. python scripts/bench_cpu.py [--reps 30] [--only bert_encoder]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for `benchmarks`

from benchmarks.cpu_harness import command


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(argv, prog="bench_cpu.py")


if __name__ == "__main__":
    sys.exit(main())
