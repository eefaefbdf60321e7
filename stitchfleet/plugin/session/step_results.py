"""What a planned training step gave: the figures the hook hands the controller after the step.

Input: the step's plan, what its run fetched (loss, shapes read, check tensors, the consensus), its seconds and
a fault the twin met. Output: its `StepFigures` (the guard's findings on the kernels that ran, the summed
consensus, the signature measured); native faults polled once per step for the next step's figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np
from numpy.typing import NDArray

from stitchfleet import settings as settings_module
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.step_contract import StepFigures, StepPlan
from stitchfleet.plugin.graph.rewrite import Installed
from stitchfleet.plugin.guard import evidence
from stitchfleet.plugin.guard.numeric import Finding, judge
from stitchfleet.plugin.horovod.decision_sums import Consensus
from stitchfleet.plugin.native.dispatch_op import BridgeOp
from stitchfleet.plugin.native.kernels import poll_faults

if TYPE_CHECKING:
    from stitchfleet.plugin.shapes.signature_kernels import SignatureKernels

Arrays = list[NDArray[np.generic]]
Checked = tuple[Arrays, Arrays, Arrays]  # a cluster's inputs, original, stitched


class StepResults:
    """Reads a planned step's results into its figures (see the module docstring)."""

    def __init__(
        self,
        settings: settings_module.Settings,
        consensus: Consensus,
        installed: list[tuple[Cluster, Installed]],
        signatures: SignatureKernels | None,
        *,
        bridge: BridgeOp | None,
        faults_seen: int,
    ) -> None:
        self.settings, self.consensus, self.installed, self.signatures = settings, consensus, installed, signatures
        self.bridge, self.faults_seen = bridge, faults_seen
        self.kernels = [c.kernel for c, _ in installed]  # polled every step: listed once

    def figures(
        self, plan: StepPlan, results: dict[str, object], seconds: float, step: int, fault: str | None
    ) -> StepFigures:
        """The step's figures from what it fetched (`StepArgs.planned` named the fetches)."""
        signatures = self.signatures
        if signatures is not None:  # with an iterator among the sources, the step's signature is known now
            signatures.after(cast("Sequence[Iterable[int]] | None", results.get("shapes")), step)
        loss, checks = results.get("loss"), cast("Sequence[Checked]", results.get("checks") or ())
        findings = tuple((k, self.judge(k, *checks[k])) for k in plan.judged) if checks else ()
        if signatures is not None:  # a bound signature's faulty kernel is unbound alone when it is safe
            findings = signatures.screen(findings, step)
        summed = self.consensus.result(plan.local, results)
        measured = signatures.probes.measured(signatures.signature, plan.switches) if signatures else ("", (), "")
        if loss is not None and not isinstance(loss, (np.generic, np.ndarray)):
            loss = np.asarray(loss)  # a fetched loss is numpy's already: `float` reads it without a copy per step
        value = None if loss is None else float(cast("float", loss))
        return StepFigures(seconds, value, findings, summed, fault, *measured)

    def poll(self) -> None:
        """The native op counts faults while a step runs: read after it, for the next step's figures."""
        self.faults_seen = poll_faults(self.bridge, self.faults_seen, self.kernels)

    def judge(self, k: int, inputs: Arrays, original: Arrays, stitched: Arrays) -> Finding:
        """The guard's finding on the kernel that ran for this step's signature (`signature_kernels.graph`)."""
        cluster, done = self.installed[k]
        graph = self.signatures.graph(cluster.index) if self.signatures is not None else None
        factor = self.settings.tolerance_factor
        finding = judge(graph or done.site.graph, inputs, original, stitched, factor)
        if finding.ok:
            return finding
        kept = evidence.captured(graph or done.site.graph, inputs, original, stitched, factor)
        return replace(finding, evidence=evidence.kept(kept, finding, self.settings.cache_dir / "evidence"))
