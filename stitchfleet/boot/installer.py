"""`stitchfleet shim install DIR`: lays out the boot shim for a job's pod.

Input: a target directory (the webhook's shared emptyDir, /opt/stitchfleet).
Output: DIR/stitchfleet (a copy of this installed package with the bytecode it has),
DIR/shim/sitecustomize.py (stitchfleet/boot/sitecustomize.py) and DIR/ops, a copy of the
prebuilt native TF ops lying beside this package (`ops/` next to it: where the shim image's
builder stage puts them; `--with-op` builds them, see plugin.native.dispatch_op.build_prebuilt). Running it
again overwrites the same files, so a restarted init container is harmless.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import stitchfleet

SHIM_DIR = "shim"
SHIM_FILE = "sitecustomize.py"
OPS_DIR = "ops"  # prebuilt ops beside the package (plugin.native.dispatch_op.prebuilt_dirs reads it)


@dataclass(frozen=True)
class Installed:
    """Where the copy went, and how many files it holds."""

    package_dir: Path
    shim_file: Path
    files: int


def package_dir() -> Path:
    """The directory of the running stitchfleet package."""
    return Path(stitchfleet.__file__).resolve().parent


def install(target: Path) -> Installed:
    """Copies the package and the shim into `target`; OSError (with the path) when it cannot."""
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"shim target {target} exists and is not a directory")
    source = package_dir()
    # The bytecode goes too (the shim image compiles its venv): a job's interpreter whose image sets
    # PYTHONDONTWRITEBYTECODE would otherwise compile every module it imports in every process (~45 ms of the hook's
    # import alone on a 2-core machine). copytree keeps each source's mtime and size, which is what the import system
    # checks a timestamp pyc against; a stale one is recompiled as usual, and co_filename names the copy.
    copied = shutil.copytree(source, target / "stitchfleet", dirs_exist_ok=True)
    shim = target / SHIM_DIR / SHIM_FILE
    shim.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "boot" / SHIM_FILE, shim)
    files = sum(1 for path in Path(copied).rglob("*") if path.is_file())
    ops = source.parent / OPS_DIR
    if ops.is_dir() and ops.resolve() != (target / OPS_DIR).resolve():
        shutil.copytree(ops, target / OPS_DIR, dirs_exist_ok=True)
        files += sum(1 for path in (target / OPS_DIR).rglob("*") if path.is_file())
    return Installed(Path(copied), shim, files + 1)
