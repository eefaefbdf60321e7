"""Probes of a job with `None` batch dimensions (issue 18 item 4, "probes per signature"): a probe pair times only
the steps whose switched-on clusters ran a kernel for the step's shape signature, and its fleet finding is keyed by
the shapes of the signature it measured, not begin's guess (signatures.GUESS, a batch the job never feeds).

The job alternates batches of 16 and 20 rows with room for one signature's kernels (STITCHFLEET_SIGNATURES_MAX=1):
16 is compiled before the probes start, 20 is over the bound and runs TF's ops all job long. Before, the probes
booked the 20-row steps, on TF's ops, as the stitched code's time, and the finding's shapes were the guess's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.control.signature_decisions import slot_of  # noqa: E402
from stitchfleet.plugin.fleet.verdict_keys import input_shapes  # noqa: E402
from stitchfleet.plugin.session.hook import StitchHook  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from stitchfleet.plugin.shapes.signature_kernels import BOUND, OVER  # noqa: E402
from stitchfleet.telemetry import models as tables  # noqa: E402
from tests.plugin.hook_harness import events, hooked  # noqa: E402
from tests.plugin.session.test_hook_fleet_slower import _findings  # noqa: E402
from tests.plugin.session.test_hook_signatures import SETTLE_S, alternating, fresh_book, train  # noqa: E402

pytestmark = pytest.mark.tf
SIXTEEN, TWENTY = "x=16x16,y=16", "x=20x16,y=20"
# warmup 0-1, baseline 2-4, then per cluster 4 reference and 4 probe steps (the first of each checked, untimed)
PROBING = {
    "STITCHFLEET_SIGNATURE_STEPS": "2",
    "STITCHFLEET_SIGNATURES_MAX": "1",
    "STITCHFLEET_PROBE_STEPS": "4",
    "STITCHFLEET_PROBE_ROUNDS": "1",
    "STITCHFLEET_PROBE_GROUP": "0",
    # speed is not what these tests judge: CI reverted one for a slowdown at step 44 (stitched 0.95 ms against
    # 0.74 ms a step on a loaded 2-core machine) and its job-level finding was not the signature's
    "STITCHFLEET_SLOWDOWN_MARGIN": "1000",
}


def verdicts(url: str) -> list[Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.select(tables.ProbeVerdict)))
    finally:
        engine.dispose()


def settle_at_two(step: int, hook: StitchHook) -> None:
    """16 rows fed on steps 0 and 2: its compile starts at step 2 and is bound from step 3, before the probes."""
    if step == 2 and hook.signatures is not None:
        assert hook.signatures.wait(SETTLE_S)


def test_probes_time_only_steps_whose_signature_had_kernels_and_key_findings_by_it(tmp_path: Path) -> None:
    hook, url = hooked(tmp_path, "probes", **PROBING)
    fresh_book(hook)
    probes = 5 + 8 * 6  # room for six clusters' pairs and their decisions
    train(None, hook, alternating, steps=probes + 1, after=settle_at_two)
    guessed = f"x={signatures.GUESS}x16,y={signatures.GUESS}"
    assert hook.shapes is not None and hook.shapes.guessed  # begin built for 32 rows: the job never feeds them
    assert hook.controller is not None and hook.signatures is not None
    assert hook.signatures.states() == {guessed: BOUND, SIXTEEN: BOUND, TWENTY: OVER}
    clusters = hook.controller.clusters
    assert clusters and hook.controller.timing.stitched_start <= probes
    decided = [c for c in clusters if c.probe]
    assert decided, [c.reason for c in clusters]
    for c in decided:
        # the probe's timed steps at 16 rows; those fed 20 rows are left out (TF's ops ran the clusters switched on)
        counts = re.search(rf"(\d+)\+(\d+) steps at {re.escape(SIXTEEN)}, (\d+) on TF's ops left out", c.probe)
        assert counts is not None and all(int(n) > 0 for n in counts.groups()), c.probe
        # the fleet key: the inputs of the 16-row kernel the probe timed (c.shapes: begin's, built for 32 rows)
        assert hook.controller.measured(c) == input_shapes(hook.signatures.entries[SIXTEEN].graphs[c.index])
    assert any(hook.controller.measured(c) != c.shapes for c in decided)  # batch-shaped inputs: not the guess's
    written = {(p.fingerprint, p.shapes) for p in verdicts(url)}
    # a finding is written only for a cluster found faster or slower (its timings decide which): whichever it is,
    # it is about the 16-row kernel that ran
    assert written <= {(c.fingerprint, hook.controller.measured(c)) for c in decided}


def test_a_signature_the_fleet_found_slower_runs_that_clusters_tf_ops_and_the_others_kernels(tmp_path: Path) -> None:
    """Two jobs found a cluster slower at the 16-row shapes: a later job that feeds 16 rows (its first process,
    built for the guess) binds the other clusters' 16-row kernels and leaves that one's to TF's ops, and says so.
    Before, the fleet's verdicts were read for begin's shapes only (the guess's, which the job never feeds)."""
    first, url = hooked(tmp_path, "first", **PROBING)
    fresh_book(first)
    train(None, first, alternating, steps=4, after=settle_at_two)
    assert first.signatures is not None and first.controller is not None
    kernels = first.signatures.entries[SIXTEEN].graphs
    # the last probed of the clusters whose inputs follow the batch: it is on in the other clusters' pairs
    slow = [c for c in first.controller.clusters if input_shapes(kernels[c.index]) != c.shapes][-1]
    key = (slow.fingerprint, slow.profile, input_shapes(kernels[slow.index]))
    _findings(url, [key], "slow-1", "slow-2")

    second, _ = hooked(tmp_path, "second", **PROBING)
    fresh_book(second)
    probes = 5 + 8 * 6  # room for six clusters' pairs and their decisions
    train(None, second, alternating, steps=probes + 1, after=settle_at_two)
    assert second.signatures is not None and second.controller is not None
    assert slow.fingerprint in {c.fingerprint for c in second.controller.clusters}  # on for begin's shapes
    bound = second.signatures.entries[SIXTEEN].graphs
    assert slow.index not in bound and set(bound) == set(kernels) - {slow.index}
    assert second.signatures.states()[SIXTEEN] == BOUND
    said = [e.detail for e in events(url, "compile_failure") if "fleet" in e.detail]
    assert len(said) == 1, said
    assert said[0].startswith(f"cluster {slow.index}: {SIXTEEN}: fleet: slower on {slow.profile} for these shapes")
    # the others' probes time batch 16 (the slow cluster on TF's ops in both halves alike); the slow cluster's
    # probe half never ran its kernel: no figures, no finding (before, every probe step at 16 was left out)
    clusters = second.controller.clusters
    assert second.controller.timing.stitched_start <= probes
    again = next(c for c in clusters if c.fingerprint == slow.fingerprint)
    assert again.reason.startswith("no probe figures") and not again.kept, again.reason
    others = [c for c in clusters if c is not again]
    assert others and all(f" at {SIXTEEN}, " in c.probe for c in others), [c.reason for c in others]


def settle_at_twelve(step: int, hook: StitchHook) -> None:
    """16 rows fed on steps 0, 2, ..., 12: with SIGNATURE_STEPS=7 its compile starts at step 12 and is bound from
    step 13, after cluster 0's first pair (5-12)."""
    if step == 12 and hook.signatures is not None:
        assert hook.signatures.wait(SETTLE_S)


def test_a_pair_timed_before_its_kernels_were_bound_runs_again_and_is_decided_on_them(tmp_path: Path) -> None:
    """Regression (issue 18): the first pair of a job whose fed batch compiles late (a first process, built for
    the guess) had no figures, counted as "not faster", and the cluster was left to TF's ops for the whole job
    without being measured. Now its pair runs again (14-21) once the kernels are bound, and it is decided on
    them at step 22 ("probe rerun" said at 13)."""
    hook, url = hooked(tmp_path, "rerun", **{**PROBING, "STITCHFLEET_SIGNATURE_STEPS": "7"})
    fresh_book(hook)
    train(None, hook, alternating, steps=5 + 9 + 8 * 6 + 1, after=settle_at_twelve)
    assert hook.controller is not None and hook.signatures is not None
    assert hook.signatures.states()[SIXTEEN] == BOUND
    first = hook.controller.clusters[0]
    assert hook.controller.timing.reruns == ((14, 0),)
    assert first.probe and not first.reason.startswith("no probe figures"), first.reason
    counts = re.search(rf"(\d+)\+(\d+) steps at {re.escape(SIXTEEN)}", first.probe)
    assert counts is not None and all(int(n) > 0 for n in counts.groups()), first.probe
    said = [(e.reason, e.step) for e in events(url, "probe") if e.reason == "probe rerun"]
    assert said == [("probe rerun", 13)]
    assert all(c.kept is not None for c in hook.controller.clusters)  # every pair decided, the shifted ones too


def test_a_withdrawn_kernel_leaves_its_signature_to_tfs_ops_and_the_others_run_on(tmp_path: Path) -> None:
    """`SignatureKernels.withdraw` (the per-signature probe decision's effect, `probe_verdicts`): at step 10 one
    cluster's 20-row kernel is withdrawn; its 20-row calls then run TF's ops (the kernel's call count stops), its
    16-row kernel and every other cluster's 20-row kernel keep running, the losses stay plain TF's, probes see
    that cluster on TF's ops for good at 20 rows, and its shapes are not bound again in this job."""
    hook, url = hooked(tmp_path, "withdraw", STITCHFLEET_SIGNATURE_STEPS="2")
    fresh_book(hook)
    plain = train(None, None, alternating)
    counted: dict[str, dict[int, int]] = {}
    chosen: list[int] = []

    def withdraw_at_ten(step: int, hook: StitchHook) -> None:
        if step == 6:
            assert hook.signatures is not None and hook.signatures.wait(SETTLE_S)
        if step == 10:
            assert hook.signatures is not None
            index = next(i for i, owner in hook.signatures.entries[TWENTY].owners.items() if owner == TWENTY)
            chosen.append(index)
            assert hook.signatures.probes.withdraw(index, TWENTY, "slower than TF at these shapes: test", step)
            assert not hook.signatures.probes.withdraw(index, TWENTY, "again", step)  # nothing left to withdraw
            counted.update({key: hook.signatures.calls(key) for key in (SIXTEEN, TWENTY)})
            symbol = hook.signatures.symbols[index]
            assert symbol is not None
            counted["withdrawn"] = {index: hook.signatures.bridge.signature_calls(symbol, TWENTY)}

    losses = train(None, hook, alternating, steps=18, after=withdraw_at_ten)
    assert hook.signatures is not None and chosen
    index, kernels = chosen[0], hook.signatures
    symbol = kernels.symbols[index]
    assert symbol is not None
    # unbound: its 20-row calls ran TF's ops since (4 of them: steps 11, 13, 15, 17), its count stood still
    assert kernels.bridge.signature_calls(symbol, TWENTY) == counted["withdrawn"][index] > 0
    assert index not in kernels.calls(TWENTY) and index not in kernels.entries[TWENTY].graphs
    after = {key: kernels.calls(key) for key in (SIXTEEN, TWENTY)}
    assert after[SIXTEEN][index] > counted[SIXTEEN][index]  # its 16-row kernel ran on
    assert all(after[TWENTY][i] > n for i, n in counted[TWENTY].items() if i != index)
    np.testing.assert_allclose(losses, plain, rtol=1e-4)
    position = kernels.order.index(index)
    kernels.signature = kernels.entries[TWENTY].signature  # what the probes see of a 20-row step now
    switches = [True] * len(kernels.order)
    assert kernels.probes.measured(kernels.signature, switches) == (TWENTY, (position,), TWENTY)
    key = (*kernels.keys[index], kernels.probes.shapes_of(index, SIXTEEN) or "")
    withdrawn = [k for k, v in kernels.slower.items() if getattr(v, "reason", "").endswith(": test")]
    assert len(withdrawn) == 1 and withdrawn[0][:2] == key[:2]
    said = [e.detail for e in events(url, "shape_signature") if e.reason == "withdrawn"]
    assert said == [f"cluster {index}, {TWENTY}: slower than TF at these shapes: test"]


def test_a_cluster_restricted_to_one_signature_runs_its_kernel_there_only(tmp_path: Path) -> None:
    """`SignatureKernels.restrict` (a cluster kept where its probe found it faster only): at step 10 one cluster is
    restricted to 16 rows; its 20-row kernel is withdrawn, its 16-row one runs on, no kernel of another signature
    is bound for it later (begin's, built for the guess, is withdrawn too), and the losses stay plain TF's."""
    hook, _ = hooked(tmp_path, "restrict", STITCHFLEET_SIGNATURE_STEPS="2")
    fresh_book(hook)
    plain = train(None, None, alternating)
    chosen: list[tuple[int, list[str], dict[int, int]]] = []

    def restrict_at_ten(step: int, hook: StitchHook) -> None:
        if step == 6:
            assert hook.signatures is not None and hook.signatures.wait(SETTLE_S)
        if step == 10:
            kernels = hook.signatures
            assert kernels is not None
            index = next(i for i, owner in kernels.entries[TWENTY].owners.items() if owner == TWENTY)
            withdrawn = kernels.probes.restrict(
                index, frozenset({slot_of(SIXTEEN)}), "kept at other signatures only", step
            )
            chosen.append((index, withdrawn, kernels.calls(SIXTEEN)))

    losses = train(None, hook, alternating, steps=18, after=restrict_at_ten)
    assert hook.signatures is not None and chosen
    index, withdrawn, before = chosen[0]
    guessed = f"x={signatures.GUESS}x16,y={signatures.GUESS}"  # begin's kernel, built for a batch never fed
    assert sorted(withdrawn) == [TWENTY, guessed] and index not in hook.signatures.entries[TWENTY].graphs
    assert hook.signatures.calls(SIXTEEN)[index] > before[index]
    assert hook.signatures.probes.allows(index, SIXTEEN) and not hook.signatures.probes.allows(index, "x=24x16,y=24")
    assert all(hook.signatures.probes.allows(i, TWENTY) for i in hook.signatures.order if i != index)
    np.testing.assert_allclose(losses, plain, rtol=1e-4)
