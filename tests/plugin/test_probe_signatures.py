"""Probe decisions of a job with shape signatures (TF-free): a probe pair's steps that ran TF's ops for want of a
kernel for their signature are left out of its figures, and its fleet finding is keyed by the shapes of the kernel
of the signature it measured (`Controller(shapes=...)`, `signature_kernels.SignatureKernels.shapes_of` in the hook).

The controllers get real compiled cluster kernels and a real SQLite ledger (test_probe_controller's); only the step
times and each step's signature are synthetic (what the hook would have measured and said)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stitchfleet.plugin.controller import Controller
from stitchfleet.plugin.verdict_keys import shape_signature
from stitchfleet.telemetry import models as tables
from tests.plugin.test_probe_controller import _controller, _rows, kernels  # noqa: F401 (the fixture)

FED, COMPILING = "x=16x16,y=16", None  # the signature with kernels, and steps on TF's ops (no kernel yet)


def _drive(controller: Controller, compiling: set[int], steps: int = 40) -> None:
    """Cluster 0 is 0.5 ms faster on a step whose signature had kernels; a step on TF's ops (`compiling`) costs
    2 ms more with any switch on (TF's ops inside the dispatch op, a compile thread beside them)."""
    for step in range(steps):
        local = controller.local(step)
        on, checked = controller.switches(step), controller.checks(step)
        measured = COMPILING if step in compiling and on.any() else FED
        ms = 3.0 + (2.0 if measured is None else -0.5 * float(on[0]))
        controller.timed(step, ms * 1e-3 + (0.05 if checked else 0.0), checked, measured)
        controller.decide(step, np.asarray(local))
    controller.finish()
    controller.ledger.close()


def test_steps_on_tfs_ops_are_left_out_of_the_probe_and_its_finding_has_the_measured_shapes(
    tmp_path: Path,
    kernels: Any,  # noqa: F811 (the fixture imported above)
) -> None:
    # cluster 0's pair: reference 3-6, probe 7-10 (7 checked); its signature compiles on steps 5-9
    controller = _controller(tmp_path, kernels)
    measured = {(c.index, FED): shape_signature(kernels[(c.index + 1) % 3][1].graph) for c in controller.clusters}
    controller.shapes_of = lambda index, key: measured.get((index, key))
    for c in controller.clusters:
        c.profile, c.shapes = "cpu:test x2", shape_signature(c.kernel.graph)  # begin's (a guess)
    _drive(controller, compiling=set(range(5, 10)))
    fast = controller.clusters[0]
    # before, 2 of the probe half's 3 timed steps ran TF's ops: "slower than TF" (+2 ms), a slower finding
    assert fast.kept and fast.reason.startswith("faster than TF: -0.50 ms/step (2.50 vs 3.00 ms, 1+2 steps at")
    assert f"at {FED}, 4 on TF's ops left out," in fast.reason  # 5, 6 (reference), 8, 9 (probe)
    found = {(p.fingerprint, p.shapes, p.outcome) for p in _rows(tmp_path, tables.ProbeVerdict)}
    assert (fast.fingerprint, measured[0, FED], "faster") in found
    # every finding has the shapes its cluster's probe measured, none begin's
    assert all(
        shapes == measured[controller.clusters.index(c), FED] != c.shapes
        for c in controller.clusters
        for fingerprint, shapes, _ in found
        if fingerprint == c.fingerprint
    )


def test_the_group_probe_leaves_out_steps_where_every_cluster_on_ran_tfs_ops(tmp_path: Path, kernels: Any) -> None:  # noqa: F811
    """The group pair: baseline 3-6, every cluster on 7-10 (7 checked). Signature "b" is over the bound: no cluster
    has a kernel for it, so its steps with every cluster on ran TF's ops (`plain`: all of them) and time nothing
    of the group's; "a" has kernels that save 1 ms. Before, "b" (more steps in both halves) decided the group on
    TF's ops against TF's ops: not proven."""
    controller = _controller(tmp_path, kernels, probe_group=True)
    fed = {3: "a", 4: "b", 5: "b", 6: "a", 7: "a", 8: "b", 9: "b", 10: "a"}
    for step in range(12):
        local = controller.local(step)
        on, checked = controller.switches(step), controller.checks(step)
        signature = fed.get(step, "a")
        plain = tuple(k for k, switch in enumerate(on) if switch) if signature == "b" else ()
        ms = 3.0 - (1.0 if on.any() and not plain else 0.0)
        controller.timed(step, ms * 1e-3 + (0.05 if checked else 0.0), checked, signature, plain)
        controller.decide(step, np.asarray(local))
    controller.ledger.close()
    assert controller.group_proven, controller.group_probe
    assert controller.group_probe.startswith("-1.00 ms/step (2.00 vs 3.00 ms, 1+2 steps at a, 2 on TF's ops left out")
