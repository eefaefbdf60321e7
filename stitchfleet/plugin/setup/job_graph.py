"""A job's graph as the compiler sees it: the frontend's conversion, then one compile with a job's options.

Input: the user's `tf.Graph` (through `StepOps`), the job's `Specialisation` and the settings. Output: the
compiler's artifacts, with the epilogues the backend's TF library fuses and the ops plain TF's step prunes held out
of clusters (docs/plugin/setup.md).
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet import settings as settings_module
from stitchfleet.compiler import targets
from stitchfleet.compiler.pipeline import SOURCE_TARGETS, Artifacts, Options, compile_graph
from stitchfleet.compiler.targets.base import LibraryFusion
from stitchfleet.plugin.frontend import Conversion, library_fusions, pruned_ops
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.mapping import StepOps
from stitchfleet.plugin.graph.training_steps import data_path, update_path
from stitchfleet.plugin.native import gpu_device
from stitchfleet.plugin.shapes.signatures import Specialisation


def fusions(backend: str) -> tuple[LibraryFusion, ...]:
    """What the TF library beside the job's backend fuses (`auto`: the backend of the device TF places on)."""
    name = targets.automatic("gpu" if gpu_device.gpu_visible() else "cpu") if backend == "auto" else backend
    return targets.profile(name).library_fusions


def compiled(steps: StepOps, shapes: Specialisation, current: settings_module.Settings) -> tuple[Conversion, Artifacts]:
    """The conversion of the training step's ops and its compile (see the module docstring)."""
    conversion = convert(steps, name=current.job_name or "graph", shapes=shapes.known)
    dump = Path(current.dump_dir) if current.dump_dir else None
    options = Options(
        remote_budget=current.remote_stitch_budget,
        dump_dir=dump,
        baselines=("per_op",),
        origins=frozenset(conversion.origins),  # the compiler draws clusters TF can compute: planned once
        # what TF's library fuses, and what grappler prunes from plain TF's step (no variable write reads it)
        held={
            **pruned_ops.held(conversion, update_path(steps.graph)),
            **library_fusions.held(conversion, fusions(current.backend), data_path(steps.graph)),
        },
        kernels=dump is not None,  # a dump holds the kernel IR and sources too; otherwise setup skips them
        sources=SOURCE_TARGETS if dump is not None else (),
        modeled=dump is not None,  # the report's GPU time model: read by `stitchfleet compile`, not by a job
    )
    art = compile_graph(conversion.graph, options)
    assert art.report is not None
    return conversion, art
