"""The seam every backend sits behind: its profile, the `Target` protocol, the `Backend` protocol.

Input: a cluster graph and its `StitchPlan` (a `Target`), or a program, the kernels of one
cluster in launch order (a `Backend`, for targets that run kernel IR). Output: an executable:
a `Target` renders the cluster's code, builds it (through the artifact cache, cache.py) and
returns a callable that maps the cluster's inputs by name to its outputs by name, graph-shaped.
`Profile` is what the rest of stitchfleet may know of a target without importing its code:
its name, the device kind whose clusters it stitches, its warp width, whether the TF bridge
op runs it natively and whether a job or `stitchfleet compile --device` may name it. A target
whose profile says `native_op` is also a `NativeTarget`: it hands the plugin each cluster as a
`NativeKernel`, what the TF dispatch op's kernel for that device takes (the plugin imports no
target's code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # the protocols only name these; a profile import stays light
    from stitchfleet.compiler.ir import Graph
    from stitchfleet.compiler.kernel.ir import Kernel
    from stitchfleet.compiler.plan import StitchPlan

Program = Sequence["Kernel"]
Arrays = dict[str, npt.NDArray[np.generic]]
HostArray = npt.NDArray[Any]
OpAttr = str | int | list[str] | list[int]  # a value of one of the dispatch op's attributes
KINDS = ("cpu", "gpu")
SOURCE_FROM = (None, "plan", "kernels")


@dataclass(frozen=True)
class LibraryFusion:
    """A compute op's epilogue the target's TF library runs fused: TF op types, stage by stage, from the
    compute op's output (each stage the single consumer of the one before; the first stage is required, the
    later ones optional), and why those ops stay out of clusters (kept with the compute op).
    `constant_operand`: a stage whose other operand must be a constant (a scalar scale), per stage index.
    `without_onednn`: the stages TF fuses when its oneDNN kernels are off in the job's process (TF's Eigen CPU
    kernels, whose remapper fuses fewer); None: the same `stages`, (): no fusion. `reason` may name the
    `{library}` that fuses ("oneDNN" or "Eigen")."""

    compute: tuple[str, ...]
    stages: tuple[tuple[str, ...], ...]
    reason: str
    constant_operand: tuple[int, ...] = ()
    without_onednn: tuple[tuple[str, ...], ...] | None = None


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
    # What the TF library of this device fuses with a compute op (grappler's remapper): those epilogue ops
    # stay with TF, out of every cluster, each with the fusion's reason (`LibraryFusion`).
    library_fusions: tuple[LibraryFusion, ...] = ()
    # What STITCHFLEET_BACKEND=auto picks for clusters placed on its device kind (exactly one target per kind).
    automatic: bool = False
    # Its clusters build in parallel processes (each its own system-compiler run), `compile_workers` at a time;
    # else one after another (a GPU toolchain's builds share the device's compiler and driver).
    parallel_builds: bool = False
    # The TF kernel library that runs beside it on its device ("onednn": TF's default CPU build), whose own
    # behaviour some rules weigh (`graph/fallback.fallback_hazard`); "" when no rule needs it.
    beside_library: str = ""

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


@dataclass(frozen=True)
class Placement:
    """Where the dispatch op runs a cluster, as the plugin read it from TF: the device's kind, its TF name
    (`/device:GPU:1`; '' when not placed explicitly) and, for a GPU, its arch as NVRTC names it (`sm_90`)."""

    kind: str  # "cpu" or "gpu"
    device: str = ""
    arch: str = ""


class NativeKernel(Protocol):
    """One cluster compiled for the TF dispatch op: what the op's kernel for its device takes."""

    @property
    def symbol(self) -> str:
        """The cluster's key for the op library's counters (and a CPU entry's symbol)."""
        ...

    @property
    def passthrough(self) -> tuple[int, ...]:
        """Per output, the input it passes through unchanged, or -1 when the kernel computes it."""
        ...

    @property
    def repeats(self) -> tuple[int, ...]:
        """Per output, the earlier output whose value it holds (the kernel stores it once; the op hands out that
        output's buffer, with this output's shape), or -1 (`StitchPlan.repeats`)."""
        ...

    @property
    def input_shapes(self) -> list[list[int]]:
        """The shape signature it was built for (-1: a dimension not checked)."""
        ...

    @property
    def output_shapes(self) -> list[list[int]]: ...

    @property
    def binds(self) -> bool:
        """Whether the op can bind it for another shape signature beside its own kernel (a CPU entry)."""
        ...

    @property
    def cached(self) -> bool:
        """Whether it came from the artifact cache (nothing was compiled)."""
        ...

    def op_attrs(self) -> dict[str, OpAttr]:
        """The attributes of the op's kernel for its device (beside the attributes every kernel shares)."""
        ...

    def run(self, arrays: Sequence[HostArray]) -> tuple[tuple[HostArray, ...], bool]:
        """On the host: outputs by position from inputs by position, and whether a computed output is
        non-finite; a kernel that runs only inside the op raises."""
        ...


class NativeTarget(Protocol):
    """A target the TF dispatch op runs natively (`Profile.native_op`), as the plugin reaches it."""

    profile: Profile

    def native(self, graph: Graph, plan: StitchPlan, placement: Placement) -> NativeKernel: ...

    def native_unavailable(self) -> str | None:
        """Why its kernels cannot run in the op here (a compiler or library it needs), or None."""
        ...

    def builder(self) -> dict[str, str] | None:
        """What its kernels' cache keys depend on beside their source (this machine, its compiler), or None when
        its kernels are no files a job's setup can record (the plugin's `setup_record`)."""
        ...

    def prebuild(self, folder: Path) -> list[Path]:
        """Builds into `folder` what a pod without a compiler needs beside the op; the files' names say
        their sources, so a shim's folder is found again by `native_target(..., shipped=[folder])`."""
        ...
