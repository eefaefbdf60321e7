"""The kernel cache the TF tests share across runs (.pytest_cache/stitchfleet-cpu), one per pytest-xdist worker.

Input: PYTEST_XDIST_WORKER. Output: the STITCHFLEET_CACHE_DIR of the hook tests and their job scripts. Kernels
are safe to share; the signature books beside them are state a test resets and reads back, so two workers
running tests of one graph at once must not share them (a cold run compiles a kernel once per worker).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kernel_cache() -> Path:
    """The shared cache directory in one process (`WORKERS=0`); a worker's own under xdist."""
    base = ROOT / ".pytest_cache" / "stitchfleet-cpu"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return base / "workers" / worker if worker else base
