"""The GPU benchmark: stitched kernels vs per_op, JAX jit, torch.compile and copy bandwidth.

Input: the command line (cases, size ceiling, runs; `--dry-run` for the CPU plumbing
check on the sim backend at tiny shapes). Output: `<device>_<date>.json` and `.md`
under --out (default benchmarks/results/, a temp dir for --dry-run), progress lines
on stdout. A thin wrapper: the command is `benchmarks.harness.gpu_command`, which
`stitchfleet bench gpu` runs too. See benchmarks/README.md, "GPU session".

    PYTHONPATH=. python3 scripts/bench_gpu.py --max-bytes 300e6 --out $OUT/results
    PYTHONPATH=. python scripts/bench_gpu.py --dry-run --cases softmax_fwd
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for `benchmarks`

from benchmarks.harness import gpu_command


def main(argv: Sequence[str] | None = None) -> int:
    return gpu_command.main(argv, prog="bench_gpu.py")


if __name__ == "__main__":
    sys.exit(main())
