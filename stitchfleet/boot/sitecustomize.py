"""The boot shim: the `sitecustomize` of an opted-in job's Python processes.

Input: the interpreter's startup state (sys.path, STITCHFLEET_* through settings).
Output: side effects only. Installed as <dir>/shim/sitecustomize.py next to a copy
of the stitchfleet package in <dir>, with <dir>/shim first on PYTHONPATH (the
admission webhook arranges that), Python's `site` imports it at startup. It then
1. runs the sitecustomize our directory shadows (the next one on sys.path), so the
   image's own startup customisation still happens;
2. puts <dir> on sys.path right after the shim directory, so `import stitchfleet`
   finds the injected copy;
3. when STITCHFLEET_ENABLED is on, imports `stitchfleet.plugin.session.auto_attach` if that module
   exists (it attaches the TensorFlow hook).
Nothing here may fail the user's process: every step catches everything and
prints one warning line to stderr. Only the standard library is imported at top
level, because this runs before anything else in every Python process of the job.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

# Set by a copy of this shim that chain-loads another copy, so that one never loads the first again.
SEEN_DIRS = "_stitchfleet_seen_dirs"
PLUGIN_BOOT = "stitchfleet.plugin.session.auto_attach"


def _real(entry: str) -> str:
    return str(Path(entry or os.curdir).resolve())


def _warn(step: str, error: BaseException) -> None:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    print(f"stitchfleet: boot shim: {step} failed, continuing without it: {text}", file=sys.stderr)


def _guarded(step: str, action: Callable[[], object]) -> None:
    try:
        action()
    except Exception as error:  # the shim must never break the user's interpreter
        _warn(step, error)


def chain_load(seen: frozenset[str]) -> ModuleType | None:
    """Runs the first sitecustomize on sys.path outside the `seen` directories; returns it."""
    others = [entry for entry in sys.path if _real(entry) not in seen]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    setattr(module, SEEN_DIRS, seen)
    spec.loader.exec_module(module)
    return module


def add_package_root(shim_dir: str) -> None:
    """Puts the directory holding the injected stitchfleet package right after the shim's."""
    root = str(Path(shim_dir).parent)
    if any(_real(entry) == root for entry in sys.path):
        return
    positions = [i for i, entry in enumerate(sys.path) if _real(entry) == shim_dir]
    sys.path.insert(positions[0] + 1 if positions else len(sys.path), root)


def boot_plugin() -> None:
    """Imports stitchfleet.plugin.session.auto_attach when STITCHFLEET_ENABLED is on and the module exists."""
    from stitchfleet import settings

    if not settings.load().enabled or importlib.util.find_spec(PLUGIN_BOOT) is None:
        return
    importlib.import_module(PLUGIN_BOOT)


def run(shim_dir: str, seen: frozenset[str]) -> None:
    """The three steps, each guarded on its own."""
    seen = seen | {shim_dir}
    _guarded("loading the shadowed sitecustomize", lambda: chain_load(seen))
    _guarded("adding stitchfleet to sys.path", lambda: add_package_root(shim_dir))
    _guarded(f"importing {PLUGIN_BOOT}", boot_plugin)


if __name__ == "sitecustomize":
    _guarded(
        "starting",
        lambda: run(_real(str(Path(__file__).parent)), frozenset(globals().get(SEEN_DIRS, ()))),
    )
