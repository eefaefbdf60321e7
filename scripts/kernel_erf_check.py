"""The generated code's erf (csrc/vmath.h `sf_erff`) on every float in [0, 4.5] (figures, not tests).

Input: scripts/kernel_erf_check.c and the working tree's vmath.h. Output: per build (with FMA, -march=native;
without, the x86-64 baseline), the largest distance in float32 ulps from glibc's double erf rounded to float,
how many inputs are beyond 1 and 2 ulp, the largest relative error of normal results in units of 2^-24, and the
largest absolute error of 1 + erf(x) for x in [-4.5, 0] in units of 2^-24 (what a GELU's 1 + erf(x / sqrt 2)
keeps of it: the cancellation a candidate erf must survive, see benchmarks/README.md, helper "kernels",
session 21); exit 1 when sf_erff is not odd or mishandles NaN, an infinity or -0. test_vmath asserts the bound
on two million inputs per build; this is the whole range, for a change to the function.

    python scripts/kernel_erf_check.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "stitchfleet" / "compiler" / "targets" / "cpu" / "csrc"
BUILDS: tuple[tuple[str, list[str]], ...] = (("FMA, -march=native", ["-march=native"]), ("no FMA, x86-64", []))


def main() -> int:
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for label, flags in BUILDS:
            binary = Path(tmp) / "erf_check"
            source = ROOT / "scripts" / "kernel_erf_check.c"
            subprocess.run(["cc", "-O2", *flags, f"-I{CSRC}", str(source), "-o", str(binary), "-lm"], check=True)
            run = subprocess.run([str(binary)], capture_output=True, text=True, check=False)
            print(f"{label}: {run.stdout.strip()}", flush=True)
            status |= run.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
