"""Lowering of stitch plans to kernel IR (plan -> kernels); running them is a target's work.

Input: a cluster graph and its `StitchPlan`. Output: `Lowered` kernels; see program.py.
Targets import lowering through this module only (import-linter keeps it so): `lower` and
`Lowered` for the SIMT targets, and the emission pieces a plan-level generator shares with
the kernel lowering (the cpu target's C: `Phase`, `store_results`, `COMBINE` from phases.py;
`Emitter`, `Namer`, `Sources`, `coords`, `flat` from values.py).
"""

from stitchfleet.compiler.lower.phases import COMBINE, Phase, store_results
from stitchfleet.compiler.lower.program import Lowered, lower
from stitchfleet.compiler.lower.values import Emitter, Namer, Sources, coords, flat

__all__ = ["COMBINE", "Emitter", "Lowered", "Namer", "Phase", "Sources", "coords", "flat", "lower", "store_results"]
