"""The guard's judgement leaves no BLAS worker spinning after it (`compiler/blas_threads.py`).

OpenBLAS's workers spin ~100 ms after a multi-threaded call; a check step's judgement on the training thread
took a core from the next 15-20 steps of a 2-core job. Here one judgement runs in a process of its own
(`blas_spin.py`) and the process's other threads must have used no CPU in the 0.3 s after it; without the
one-thread context they used ~110 ms of it (11 clock ticks) on the 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS runs one thread on one core: nothing spins")
def test_a_judgement_leaves_no_blas_thread_spinning() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OPENBLAS_NUM_THREADS", None)  # the library's own default: a thread per core
    done = subprocess.run(
        [sys.executable, "-m", "tests.plugin.guard.blas_spin", "guarded"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ok, ticks = done.stdout.split()
    assert ok == "True"  # a pass judged on the fp64 path (one ulp off everywhere), where the dot products are
    assert int(ticks) == 0, f"other threads used {ticks} clock ticks after the judgement"
