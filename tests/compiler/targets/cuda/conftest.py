"""Fixtures of the CUDA renderer tests: the nvcc to compile with (skip when absent), its cache, snapshots.

Snapshots are rewritten instead of compared when STITCHFLEET_UPDATE_SNAPSHOTS=1 is set for
the test run (read here, in test code: package code never reads the environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.nvcc import Nvcc, find_nvcc

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE_HINT = (
    "STITCHFLEET_UPDATE_SNAPSHOTS=1 python -m pytest tests/compiler/targets/cuda  (then review and commit the diff)"
)


@pytest.fixture(scope="session")
def nvcc() -> Nvcc:
    found = find_nvcc()
    if found is None:
        pytest.skip("nvcc is not on PATH: CUDA compile checks need the CUDA toolkit (any machine, no GPU needed)")
    return found


@pytest.fixture(scope="session")
def nvcc_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ArtifactCache:
    """Compiled code cached across test runs by source hash (pytest's cache directory).

    With pytest's cache plugin off (-p no:cacheprovider) the cache lives for this run only.
    """
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("stitchfleet-nvcc") if cache is not None else tmp_path_factory.mktemp("nvcc")
    return ArtifactCache(Path(folder))


@pytest.fixture(scope="session")
def update_snapshots() -> bool:
    return os.environ.get("STITCHFLEET_UPDATE_SNAPSHOTS", "") == "1"


def check_snapshot(name: str, text: str, update: bool) -> None:
    """Compares `text` with snapshots/<name>; rewrites it instead when updating."""
    path = SNAPSHOTS / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path.name}: create it with {UPDATE_HINT}")
    expected = path.read_text()
    if expected != text:
        import difflib

        diff = "".join(
            difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "snapshot", "rendered", n=2)
        )
        pytest.fail(f"rendered CUDA differs from snapshots/{path.name}:\n{diff[:6000]}\nIf intended: {UPDATE_HINT}")
