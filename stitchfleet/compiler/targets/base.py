"""The seam every backend sits behind: its profile, the `Target` protocol, the `Backend` protocol.

Input: a cluster graph and its `StitchPlan` (a `Target`), or a program, the kernels of one
cluster in launch order (a `Backend`, for targets that run kernel IR). Output: an executable:
a `Target` renders the cluster's code, builds it (through the artifact cache, cache.py) and
returns a callable that maps the cluster's inputs by name to its outputs by name, graph-shaped.
`Profile` is what the rest of stitchfleet may know of a target without importing its code:
its name, the device kind whose clusters it stitches, its warp width, whether the TF bridge
op runs it natively and whether a job or `stitchfleet compile --device` may name it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # the protocols only name these; a profile import stays light
    from stitchfleet.compiler.ir import Graph
    from stitchfleet.compiler.kernel.ir import Kernel
    from stitchfleet.compiler.plan import StitchPlan

Program = Sequence["Kernel"]
Arrays = dict[str, npt.NDArray[np.generic]]
KINDS = ("cpu", "gpu")
SOURCE_FROM = (None, "plan", "kernels")


@dataclass(frozen=True)
class Profile:
    """What a target is, read without importing its code (each target's `__init__.py` holds one)."""

    name: str  # the backend name users give: STITCHFLEET_BACKEND, `stitchfleet compile --device`
    runs_on: str  # "cpu" or "gpu": the device kind whose clusters it stitches
    warp: int  # lanes of a warp in the code it runs (devices.WARP)
    summary: str  # what runs, in a few words, for reports and help texts
    native_op: bool = False  # the TF bridge op runs it natively (else tf.numpy_function calls it)
    in_jobs: bool = True  # a training job may choose it (STITCHFLEET_BACKEND)
    checks_here: bool = True  # `stitchfleet compile --device` runs it on any machine (no GPU needed)
    # What its source text (the pipeline's `sources` stage, its dumps) is rendered from: "plan" or "kernels"
    # (the kernel IR), by `targets/<name>/source_text.py`'s `render`; None: it has no source text.
    source_from: str | None = None

    def __post_init__(self) -> None:
        if self.runs_on not in KINDS:
            raise ValueError(f"target {self.name!r}: runs_on must be one of {KINDS}, got {self.runs_on!r}")
        if self.warp <= 0:
            raise ValueError(f"target {self.name!r}: warp must be positive, got {self.warp}")
        if self.source_from not in SOURCE_FROM:
            raise ValueError(
                f"target {self.name!r}: source_from must be one of {SOURCE_FROM}, got {self.source_from!r}"
            )


class Executable(Protocol):
    """A compiled program: inputs by buffer name -> outputs by buffer name (flat arrays)."""

    def __call__(self, inputs: Mapping[str, Any]) -> Arrays: ...


class Backend(Protocol):
    """Something that turns kernel IR (one program) into an executable: sim, cuda, cuda-cpu."""

    name: str

    def compile(self, program: Program) -> Executable: ...


class ClusterRun(Protocol):
    """One built cluster: its inputs by graph input name -> its outputs by graph output name, shaped."""

    def __call__(self, inputs: Mapping[str, Any]) -> Arrays: ...


class Target(Protocol):
    """A backend behind the seam: render, build (cached) and hand back the cluster's run."""

    profile: Profile

    def build(self, graph: Graph, plan: StitchPlan) -> ClusterRun: ...
