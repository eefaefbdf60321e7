"""One installed cluster as the controller sees it: its identity, its kernel and what was decided of it.

Input: set up by `setup.selection` for each installed cluster. Output: the record every decision updates
(enabled, reverted at which step and why, kept by its probe, what the probe measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stitchfleet.plugin.native.kernels import ClusterKernel


@dataclass
class Cluster:
    index: int
    fingerprint: str
    kernel: ClusterKernel
    op_count: int
    enabled: bool = True
    reverted_at: int | None = None
    reason: str = ""
    kept: bool | None = None  # the probe's decision; None until taken
    probe: str = ""  # what the probe measured, e.g. "-0.41 ms/step (2.49 vs 2.90 ms, 9+10 steps)"
    profile: str = ""  # the device profile it runs on and its inputs' shapes (verdict_keys): what a
    shapes: str = ""  # probe finding is about, besides the fingerprint
