"""A job's graph as the compiler sees it: the frontend's conversion, then one compile with a job's options.

Input: the user's `tf.Graph` (through `StepOps`, the ops a training step runs), the job's `Specialisation`
(the shapes its signature gives where TF's are partial) and the settings (job name, remote stitching
budget, dump directory). Output: the `Conversion` (IR graph and origins) and the compiler's `Artifacts`.

Why these options: the compiler is handed the frontend's origins so that it draws clusters TF can
compute and plans each once (the plugin plans nothing); kernel IR and rendered sources are produced only
when the job dumps its artifacts, so a job's setup does not pay for stages it does not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stitchfleet import settings as settings_module
from stitchfleet.compiler.pipeline import SOURCE_TARGETS, Artifacts, Options, compile_graph
from stitchfleet.plugin.frontend import Conversion
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.signatures import Specialisation


def compiled(steps: Any, shapes: Specialisation, current: settings_module.Settings) -> tuple[Conversion, Artifacts]:
    """The conversion of the training step's ops and its compile (see the module docstring)."""
    conversion = convert(steps, name=current.job_name or "graph", shapes=shapes.known)
    dump = Path(current.dump_dir) if current.dump_dir else None
    options = Options(
        remote_budget=current.remote_stitch_budget,
        dump_dir=dump,
        baselines=("per_op",),
        origins=frozenset(conversion.origins),  # the compiler draws clusters TF can compute: planned once
        kernels=dump is not None,  # a dump holds the kernel IR and sources too; otherwise setup skips them
        sources=SOURCE_TARGETS if dump is not None else (),
    )
    art = compile_graph(conversion.graph, options)
    assert art.report is not None
    return conversion, art
