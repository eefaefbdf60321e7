"""The kernel cache the TF tests share across runs (.pytest_cache/stitchfleet-cpu), one per pytest-xdist worker.

Input: PYTEST_XDIST_WORKER, set in each worker. Output: the STITCHFLEET_CACHE_DIR of the hook tests and their
job scripts. Compiled kernels are safe to share, but the signature books beside them (cache_dir/signatures) are
state a test resets (unlinks) and then reads back: two workers running tests of the same graph at once must not
share them, so each worker keeps its own cache (`make test`'s first run compiles a kernel once per worker).
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
