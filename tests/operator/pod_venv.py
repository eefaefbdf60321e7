"""A virtualenv that holds what a training image holds: numpy and TensorFlow, nothing of ours.

A plain module (imported by the tests next to it). `pod_venv()` builds it once under a cache dir
(`$STITCHFLEET_TEST_CACHE`, default ~/.cache/stitchfleet-tests), keyed by the Python and the
versions installed, and reuses it afterwards (creating it costs about a minute: pip installs
tensorflow-cpu and numpy from the local index/cache). No --system-site-packages: that would bring
SQLAlchemy, psycopg and prometheus_client. A lock file keeps two sessions from building it at once;
a half-built one is never used (built under a temporary name, renamed when complete).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy

TENSORFLOW = "tensorflow-cpu==2.15.1"
NUMPY = f"numpy=={numpy.__version__}"
# What a training image does not have, and what must therefore never be importable in the venv.
ABSENT = ("sqlalchemy", "alembic", "psycopg", "prometheus_client", "kubernetes", "kopf", "stitchfleet")
BUILD_SECONDS = 900


def cache_root() -> Path:
    return Path(os.environ.get("STITCHFLEET_TEST_CACHE") or Path.home() / ".cache" / "stitchfleet-tests")


def _base_python() -> str:
    # sys.executable may itself be a venv's; the new venv must not inherit its packages.
    return getattr(sys, "_base_executable", sys.executable)


def pod_venv() -> Path:
    """The venv's python, built on first use."""
    key = f"pod-venv-py{sys.version_info.major}{sys.version_info.minor}-{TENSORFLOW}-{NUMPY}".replace("==", "-")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "bin" / "python").exists():
            _build(target)
    return target / "bin" / "python"


def _build(target: Path) -> None:
    building = target.with_name(target.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([_base_python(), "-m", "venv", str(building)], check=True, timeout=BUILD_SECONDS)
    pip = [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, TENSORFLOW, NUMPY], check=True, timeout=BUILD_SECONDS)
    building.rename(target)


def missing_modules(python: Path) -> list[str]:
    """Which of ABSENT the venv's python cannot import (all of them, for a faithful pod)."""
    code = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    done = subprocess.run(
        [str(python), "-c", code, *ABSENT],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
        cwd="/",  # `-c` puts the working directory on sys.path: never the repository's
    )
    return done.stdout.split()
