"""Probe decisions of a job with shape signatures (TF-free): a probe pair's steps that ran TF's ops for want of a
kernel for their signature are left out of its figures, and its fleet finding is keyed by the shapes of the kernel
of the signature it measured (`Controller(kernels=...)`, `signature_kernels.SignatureKernels` in the hook); a kept
cluster's kernel for a signature where it was slower than TF's ops is withdrawn, on every rank that timed it.

The controllers get real compiled cluster kernels and a real SQLite ledger (test_probe_controller's); only the step
times and each step's signature are synthetic (what the hook would have measured and said)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.signature_decisions import slot_of
from stitchfleet.plugin.fleet.verdict_keys import input_shapes
from stitchfleet.telemetry import models as tables
from tests.plugin.control.test_probe_controller import _controller, _rows

FED, COMPILING = "x=16x16,y=16", None  # the signature with kernels, and steps on TF's ops (no kernel yet)


class Lookup:
    """The kernels per signature as the controller sees them (`SignatureLookup`): the shapes of each cluster's
    kernel per signature, and the withdrawals asked for (the real `withdraw` is tested with TF in
    test_hook_probe_signatures)."""

    def __init__(self, shapes: dict[tuple[int, str], str]) -> None:
        self.shapes = shapes
        self.withdrawn: list[tuple[int, str, str, int]] = []
        self.restricted: list[tuple[int, frozenset[tuple[int, float]], int]] = []

    def shapes_of(self, index: int, key: str) -> str | None:
        return self.shapes.get((index, key))

    def withdraw(self, index: int, key: str, reason: str, step: int) -> bool:
        if (index, key) not in self.shapes:
            return False
        del self.shapes[index, key]
        self.withdrawn.append((index, key, reason, step))
        return True

    def restrict(self, index: int, allowed: frozenset[tuple[int, float]], reason: str, step: int) -> list[str]:
        self.restricted.append((index, allowed, step))
        keys = [key for i, key in list(self.shapes) if i == index and slot_of(key) not in allowed]
        return [key for key in keys if self.withdraw(index, key, reason, step)]


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
    kernels: Any,
) -> None:
    # cluster 0's pair: reference 3-6, probe 7-10 (7 checked); its signature compiles on steps 5-9, so the probe
    # half's one step with kernels (10) is cluster 0's first call at FED (7 ran TF's ops), and 3 the others':
    # both left out, the pair runs again (12-19), decided at 20
    controller = _controller(tmp_path, kernels)
    measured = {(c.index, FED): input_shapes(kernels[(c.index + 1) % 3][1].graph) for c in controller.clusters}
    controller.kernels = Lookup(measured)
    for c in controller.clusters:
        c.profile, c.shapes = "cpu:test x2", input_shapes(c.kernel.graph)  # begin's (a guess)
    _drive(controller, compiling=set(range(5, 10)))
    fast = controller.clusters[0]
    # before, 2 of the probe half's 3 timed steps ran TF's ops: "slower than TF" (+2 ms), a slower finding
    assert controller.timing.reruns == ((12, 0),)
    assert fast.kept and fast.reason.startswith("faster than TF: -0.50 ms/step (2.50 vs 3.00 ms, 3+5 steps at")
    assert f"at {FED}, 4 on TF's ops left out, 2 first calls left out," in fast.reason  # 5, 6, 8, 9; 3 and 10
    found = {(p.fingerprint, p.shapes, p.outcome) for p in _rows(tmp_path, tables.ProbeVerdict)}
    assert (fast.fingerprint, measured[0, FED], "faster") in found
    # every finding has the shapes its cluster's probe measured, none begin's
    assert all(
        shapes == measured[controller.clusters.index(c), FED] != c.shapes
        for c in controller.clusters
        for fingerprint, shapes, _ in found
        if fingerprint == c.fingerprint
    )


def test_the_group_probe_leaves_out_steps_where_every_cluster_on_ran_tfs_ops(tmp_path: Path, kernels: Any) -> None:
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


# --- per-signature decisions: a kept cluster slower at one signature loses that signature's kernel --------------

SMALL, LARGE = "x=16x16,y=16", "x=20x16,y=20"


def _per_signature(
    controllers: list[Controller], fed: Any, gain_ms: dict[str, float], steps: int = 30, ranks_fed: Any = None
) -> None:
    """Cluster 0 changes the step time by gain_ms[signature] when on (negative: faster); the others change nothing.
    `fed(step)` is the signature a step feeds; `ranks_fed(rank, step)` overrides it per rank."""
    for step in range(steps):
        local = [c.local(step) for c in controllers]
        for rank, controller in enumerate(controllers):
            on, checked = controller.switches(step), controller.checks(step)
            signature = ranks_fed(rank, step) if ranks_fed is not None else fed(step)
            ms = 3.0 + gain_ms.get(signature, 0.0) * float(on[0]) + 0.001 * (step % 3)
            controller.timed(step, ms * 1e-3 + (0.05 if checked else 0.0), checked, signature)
        summed = np.sum(local, axis=0)
        for controller in controllers:
            controller.decide(step, summed)
    for controller in controllers:
        controller.ledger.close()


def _lookup(controller: Controller, *keys: str) -> Lookup:
    lookup = Lookup({(c.index, key): f"{key}:{c.index}" for c in controller.clusters for key in keys})
    controller.kernels = lookup
    for c in controller.clusters:
        c.profile = "cpu:test x2"
    return lookup


def test_a_kept_cluster_slower_at_one_signature_loses_that_kernel_and_keeps_the_other(
    tmp_path: Path,
    kernels: Any,
) -> None:
    """Cluster 0's pair (reference 3-14, probe 15-26, decided at 27) alternates 16 and 20 rows: at 16 it saves 1 ms,
    at 20 it costs 0.5 ms. Before, the decision on the signature timed most held for both: the cluster ran its
    slower kernel at 20 rows for the whole job. Now it is kept, and its 20-row kernel is withdrawn."""
    controller = _controller(tmp_path, kernels, probe_steps=12)
    lookup = _lookup(controller, SMALL, LARGE)
    _per_signature([controller], lambda step: LARGE if step % 2 else SMALL, {SMALL: -1.0, LARGE: 0.5}, steps=50)
    first = controller.clusters[0]
    assert first.kept and first.enabled, first.reason
    assert [(index, key, step) for index, key, _, step in lookup.withdrawn] == [(first.index, LARGE, 27)]
    assert lookup.withdrawn[0][2].startswith(f"slower than TF at these shapes: cluster {first.index} at {LARGE}: +0.50")
    said = [(e.reason, e.step, e.detail) for e in _rows(tmp_path, tables.Event) if e.reason == "slower at a signature"]
    assert [(reason, step) for reason, step, _ in said] == [("slower at a signature", 27)]
    assert "on 1 rank(s)" in said[0][2] and said[0][2].endswith("its other signatures keep their kernels")
    found = {(p.fingerprint, p.shapes, p.outcome) for p in _rows(tmp_path, tables.ProbeVerdict)}
    assert (first.fingerprint, f"{LARGE}:{first.index}", "slower") in found
    assert (LARGE not in {key for _, key, _, _ in lookup.withdrawn[1:]}) and (first.index, SMALL) in lookup.shapes


def test_a_signature_within_the_noise_or_timed_too_little_keeps_its_kernel(tmp_path: Path, kernels: Any) -> None:
    controller = _controller(tmp_path, kernels, probe_steps=12)
    lookup = _lookup(controller, SMALL, LARGE, "x=24x16,y=24")
    rare = {5, 9, 17, 21}  # 24 rows on two reference and two probe steps only: below MIN_SIGNATURE_STEPS

    def fed(step: int) -> str:
        return "x=24x16,y=24" if step in rare else (LARGE if step % 2 else SMALL)

    _per_signature([controller], fed, {SMALL: -1.0, LARGE: 0.0, "x=24x16,y=24": 5.0}, steps=50)
    assert controller.clusters[0].kept and lookup.withdrawn == []


def test_ranks_withdraw_the_same_signature_at_the_same_step(tmp_path: Path, kernels: Any) -> None:
    ranks = [_controller(tmp_path, kernels, rank, size=2, probe_steps=12) for rank in (0, 1)]
    lookups = [_lookup(controller, SMALL, LARGE) for controller in ranks]
    _per_signature(ranks, lambda step: LARGE if step % 2 else SMALL, {SMALL: -1.0, LARGE: 0.5}, steps=50)
    assert [[(i, k, s) for i, k, _, s in lookup.withdrawn] for lookup in lookups] == [[(0, LARGE, 27)]] * 2


def test_two_ranks_different_signatures_in_one_slot_are_not_decided_on(tmp_path: Path, kernels: Any) -> None:
    """Slots are a hash of the key: when rank 0's slower signature and rank 1's meet in one, the summed figures
    are of two signatures, and nobody withdraws on them (their identities do not add up)."""
    taken = slot_of(LARGE)[0]
    other = next(k for k in (f"x={n}x16,y={n}" for n in range(21, 400)) if slot_of(k)[0] == taken)
    ranks = [_controller(tmp_path, kernels, rank, size=2, probe_steps=12) for rank in (0, 1)]
    lookups = [_lookup(ranks[0], SMALL, LARGE), _lookup(ranks[1], SMALL, other)]

    def ranks_fed(rank: int, step: int) -> str:
        return (LARGE if rank == 0 else other) if step % 2 else SMALL

    _per_signature(ranks, None, {SMALL: -1.0, LARGE: 0.5, other: 0.5}, steps=50, ranks_fed=ranks_fed)
    assert all(controller.clusters[0].kept for controller in ranks)
    assert [lookup.withdrawn for lookup in lookups] == [[], []]


def test_a_cluster_slower_at_its_main_signature_stays_on_where_it_was_faster_only(
    tmp_path: Path,
    kernels: Any,
) -> None:
    """At 16 rows (the signature timed most) cluster 0 costs 0.5 ms, at 20 rows it saves 1 ms. Before, the probe
    left it to TF at every signature; now it stays on, restricted to 20 rows (its 16-row kernel withdrawn),
    with a slower finding for the 16-row kernel's shapes and a faster one for the 20-row kernel's."""
    controller = _controller(tmp_path, kernels, probe_steps=12)
    lookup = _lookup(controller, SMALL, LARGE)
    _per_signature([controller], lambda step: LARGE if step % 2 else SMALL, {SMALL: 0.5, LARGE: -1.0}, steps=50)
    first = controller.clusters[0]
    assert first.kept and first.enabled, first.reason
    assert first.reason.startswith(f"faster than TF at 1 signature(s) only: at {LARGE}: -1.00 ms/step"), first.reason
    assert "; elsewhere slower than TF: +0.50 ms/step" in first.reason
    assert lookup.restricted == [(first.index, frozenset({slot_of(LARGE)}), 27)]
    assert [(index, key) for index, key, _, _ in lookup.withdrawn] == [(first.index, SMALL)]
    found = {(p.shapes, p.outcome) for p in _rows(tmp_path, tables.ProbeVerdict) if p.fingerprint == first.fingerprint}
    assert found == {(f"{SMALL}:{first.index}", "slower"), (f"{LARGE}:{first.index}", "faster")}
    enabled = [e for e in _rows(tmp_path, tables.Event) if e.reason == "faster at some signatures"]
    assert len(enabled) == 1 and enabled[0].detail.endswith(f"kernels withdrawn: {SMALL}")
    assert all(controller.switches(s)[0] for s in range(90, 100))  # on in the stitched phase (75-80, from 83)


def test_ranks_keep_a_cluster_at_a_signature_one_of_them_never_fed(tmp_path: Path, kernels: Any) -> None:
    """The switch decision follows from the summed slots alone: rank 1 never fed 20 rows, yet keeps cluster 0 on
    as rank 0 does (its 16-row kernel withdrawn: its calls run TF's ops), so the ranks' switches stay equal."""
    ranks = [_controller(tmp_path, kernels, rank, size=2, probe_steps=12) for rank in (0, 1)]
    lookups = [_lookup(ranks[0], SMALL, LARGE), _lookup(ranks[1], SMALL)]

    def ranks_fed(rank: int, step: int) -> str:
        return LARGE if rank == 0 and step % 2 else SMALL

    _per_signature(ranks, None, {SMALL: 0.5, LARGE: -1.0}, steps=50, ranks_fed=ranks_fed)
    assert [c.clusters[0].kept for c in ranks] == [True, True]
    assert all((ranks[0].switches(s) == ranks[1].switches(s)).all() for s in range(60))
    assert [[key for _, key, _, _ in lookup.withdrawn] for lookup in lookups] == [[SMALL], [SMALL]]
