"""The built images work: stitchfleet runs in the operator image, the shim image lays out the shim.

Input: out/images/{operator,shim}.oci.tar, built by scripts/build_images.sh once per session
(reused when already there, e.g. after `make images`). Output: assertions, and the image sizes
printed. Slow tier; skipped with the reason when buildah is not installed (CI installs it when
scripts/install-system-deps.sh can).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchfleet import __version__

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah is not installed (make images installs it)"),
]

ROOT = Path(__file__).resolve().parents[2]
ARCHIVES = ROOT / "out" / "images"
BUILD_TIMEOUT_S = 600
# A system Python with nothing installed: the shim alone must bring stitchfleet in.
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
PROBE = "import stitchfleet, sys; print('PACKAGE', stitchfleet.__file__)"


def buildah(*args: str, timeout: int = 300) -> str:
    done = subprocess.run(
        ["buildah", "--storage-driver", "vfs", *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture(scope="session")
def archives() -> dict[str, Path]:
    found = {name: ARCHIVES / f"{name}.oci.tar" for name in ("operator", "shim")}
    if not all(path.is_file() for path in found.values()):
        subprocess.run(["sh", str(ROOT / "scripts" / "build_images.sh")], check=True, timeout=BUILD_TIMEOUT_S)
    for name, path in found.items():
        print(f"image {name}: {path.stat().st_size / 2**20:.0f} MiB ({path})")
    return found


def container(archive: Path) -> Iterator[str]:
    name = buildah("from", f"oci-archive:{archive}")
    yield name
    buildah("rm", name)


@pytest.fixture(scope="session")
def operator(archives: dict[str, Path]) -> Iterator[str]:
    yield from container(archives["operator"])


@pytest.fixture(scope="session")
def shim(archives: dict[str, Path]) -> Iterator[str]:
    yield from container(archives["shim"])


def run(ctr: str, *command: str, env: dict[str, str] | None = None) -> str:
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return buildah("run", "--isolation", "chroot", *flags, ctr, "--", *command)


def test_operator_image_runs_stitchfleet(operator: str) -> None:
    assert run(operator, "stitchfleet", "--version") == f"stitchfleet {__version__}"
    assert "usage" in run(operator, "stitchfleet", "operator", "--help")
    # The non-root user of the Containerfile.
    assert run(operator, "id", "-u") == "10001"


def test_operator_image_labels_its_content(archives: dict[str, Path], operator: str) -> None:
    labels = buildah("inspect", "--format", "{{.OCIv1.Config.Labels}}", operator)
    assert f"stitchfleet {__version__}" in labels
    assert "kopf==" in labels and "alembic==" in labels


def test_shim_image_lays_out_the_shim_a_bare_python_imports(shim: str) -> None:
    run(shim, "stitchfleet", "shim", "install", "/tmp/sf")
    listing = run(shim, "ls", "/tmp/sf", "/tmp/sf/shim")
    assert "sitecustomize.py" in listing and "stitchfleet" in listing
    out = run(shim, "python3", "-c", PROBE, env={"PATH": BARE_PATH, "PYTHONPATH": "/tmp/sf/shim"})
    assert "PACKAGE /tmp/sf/stitchfleet/__init__.py" in out
    # The layout made at build time is in the image too.
    assert "sitecustomize.py" in run(shim, "ls", "/usr/share/stitchfleet-shim/shim")
    # The native TF op prebuilt by the image's `ops` stage (CPU and GPU wheel builds) travels into the pod.
    ops = run(shim, "ls", "/tmp/sf/ops").split()
    assert len([name for name in ops if name.startswith("tfop-")]) == 2, ops
