"""The targets: one folder per backend (render, build, run), found by name.

Input: a backend name ("sim", "cpu", "cuda", "cuda-cpu"). Output: its `Profile` (`profile`,
read from the folder's `__init__.py`, no heavy imports) or its `Target` (`load`, which imports
`targets.<name>.target` on demand, as tinygrad's runtime/ops_<name>.py). The names are the
folders on disk (`settings.TARGETS`), so every list of backends (settings, CLI choices, the
plugin's routes, `stitchfleet compile --device`) reads this registry. Shared by all targets:
base.py (the protocols and `Profile`), cache.py (the artifact cache), native_build.py (the
system C/C++ compiler). Adding a backend = a folder `targets/<name>/` with `__init__.py`
(docstring + `PROFILE`) and `target.py` (`target(cache_dir) -> Target`, and for a `native_op`
profile `native_target(cache_dir, shipped) -> NativeTarget`), plus its artifact
kind in cache.py when it builds files, and `source_text.py` (`render`) when its profile says what
its source text is rendered from (`source_from`): the pipeline's `sources` stage finds it here.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stitchfleet import settings

if TYPE_CHECKING:
    from stitchfleet.compiler.ir import Graph
    from stitchfleet.compiler.lower import Lowered
    from stitchfleet.compiler.plan import StitchPlan
    from stitchfleet.compiler.targets.base import NativeTarget, Profile, Target

NAMES: tuple[str, ...] = settings.TARGETS


class UnknownTargetError(ValueError):
    """A backend name that names no target folder."""


def _package(name: str) -> str:
    if name not in NAMES:
        raise UnknownTargetError(f"unknown backend {name!r} (targets: {', '.join(NAMES)})")
    return f"{__name__}.{name.replace('-', '_')}"


def profile(name: str) -> Profile:
    """The target's profile, from `targets/<name>/__init__.py` (cheap: nothing compiled or loaded)."""
    found: Profile = importlib.import_module(_package(name)).PROFILE
    return found


def load(name: str, cache_dir: Path) -> Target:
    """The target itself, its code imported now (`targets/<name>/target.py`), caching under `cache_dir`."""
    module = importlib.import_module(f"{_package(name)}.target")
    built: Target = module.target(Path(cache_dir))
    return built


def native(name: str, cache_dir: Path, shipped: Sequence[Path] = ()) -> NativeTarget:
    """The target as the TF dispatch op runs it (`targets/<name>/target.py`'s `native_target`), caching
    under `cache_dir` and using the prebuilt files found in the `shipped` folders (a shim's);
    ValueError for a target the op does not run."""
    if not profile(name).native_op:
        raise ValueError(f"target {name!r} does not run in the TF dispatch op")
    module = importlib.import_module(f"{_package(name)}.target")
    built: NativeTarget = module.native_target(Path(cache_dir), tuple(Path(p) for p in shipped))
    return built


def render_source(name: str, cluster: int, graph: Graph, plan: StitchPlan, lowered: Lowered | None) -> str:
    """One cluster's source text for the target (`targets/<name>/source_text.py`, imported now: renderers
    are the compiler's heaviest modules and most compiles render nothing); ValueError for a target without."""
    if profile(name).source_from is None:
        raise ValueError(f"target {name!r} has no source text")
    module = importlib.import_module(f"{_package(name)}.source_text")
    text: str = module.render(cluster, graph, plan, lowered)
    return text


def automatic(runs_on: str) -> str:
    """The target STITCHFLEET_BACKEND=auto picks for clusters placed on `runs_on` ("cpu" or "gpu"): the one whose
    profile says `automatic` for that device kind."""
    found = [name for name in NAMES if profile(name).automatic and profile(name).runs_on == runs_on]
    if len(found) != 1:
        raise ValueError(f"{len(found)} targets are automatic on {runs_on!r} devices ({found}); exactly one must be")
    return found[0]


def names(
    *,
    runs_on: str | None = None,
    in_jobs: bool | None = None,
    checks_here: bool | None = None,
    with_sources: bool | None = None,
) -> tuple[str, ...]:
    """The target names whose profile matches every filter given."""
    chosen = []
    for name in NAMES:
        p = profile(name)
        if with_sources is not None and (p.source_from is not None) != with_sources:
            continue
        if runs_on is not None and p.runs_on != runs_on:
            continue
        if in_jobs is not None and p.in_jobs != in_jobs:
            continue
        if checks_here is not None and p.checks_here != checks_here:
            continue
        chosen.append(name)
    return tuple(chosen)
