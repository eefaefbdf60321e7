"""Lowering of stitch plans to kernel IR (plan -> kernels), and running them on the sim.

Input: a cluster graph and its `StitchPlan`. Output: `Lowered` kernels; see program.py.
"""

from stitchfleet.compiler.lower.program import Lowered, lower, run_lowered

__all__ = ["Lowered", "lower", "run_lowered"]
