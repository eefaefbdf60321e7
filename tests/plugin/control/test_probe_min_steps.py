"""Probe figures from too few steps, or from a kernel's first call, decide nothing (issue 29, word2vec; TF-free).

Horovod's tensorflow_word2vec.py feeds a new batch size every step: its group probe was decided on "+71.92 ms/step
(72.62 vs 0.69 ms, 1+4 steps at Placeholder=108...)", one switched-on step, most likely that signature's first
stitched call, against four baseline steps, and stitching went off for the job. The controllers get real compiled
cluster kernels and a real SQLite ledger (test_probe_controller's); the step times and signatures are synthetic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.decision_figures import DecisionFigures
from stitchfleet.plugin.control.schedule import GROUP, Probes, Timing
from stitchfleet.telemetry import models as tables
from tests.plugin.control.test_probe_controller import TIMING, _controller, _group_events, _rows

FED, OTHER = "Placeholder=108", "Placeholder=96"  # the probe's signature, and another batch size beside it
# the group pair of TIMING: baseline 3-6 (the user's graph), every cluster on 7-10 (7 checked), decided at 11
GROUPED = {"probe_group": True}


def _steps(controllers: Sequence[Controller], fed: Mapping[int, tuple[str, float]], steps: int = 12) -> None:
    """Runs `steps` steps on every rank: fed[step] = (signature, ms) (else FED at 0.69 ms, 0.5 ms with the clusters
    on); a check step costs 50 ms more and is not timed. The consensus is the ranks' figures summed."""
    for step in range(steps):
        local = [c.local(step) for c in controllers]
        for controller in controllers:
            on, checked = controller.switches(step), controller.checks(step)
            signature, ms = fed.get(step, (FED, 0.5 if on.any() else 0.69))
            controller.timed(step, ms * 1e-3 + (0.05 if checked else 0.0), checked, signature, signature=signature)
        summed = np.sum(local, axis=0)
        for controller in controllers:
            controller.decide(step, summed)
    for controller in controllers:
        controller.ledger.close()


# The on-half of the word2vec verdict: 7 (a check step, not timed: the kernels' first call at OTHER) and 8 at another
# batch size, 9 the kernels' first call at FED (left out), 10 the one step left at FED.
ONE_STEP = {7: (OTHER, 0.5), 8: (OTHER, 0.5), 9: (FED, 72.62), 10: (FED, 72.62)}


def test_a_probe_with_one_switched_on_step_at_its_signature_gives_no_verdict(tmp_path: Path, kernels: Any) -> None:
    """Regression: before, the group was "not faster: +71.93 ms/step (72.62 vs 0.69 ms, 1+4 steps at FED)", with a
    slower finding for the fleet (word2vec, of unknown length, then turned stitching off). Now one step is no
    figure: the pair runs again (its rerun's steps add to the same signature's), and without reruns the group has
    no figures and no finding."""
    again = _controller(tmp_path / "again", kernels, probe_min_steps=3, **GROUPED)
    _steps([again], ONE_STEP)
    assert again.group_proven is None and again.timing.reruns == ((12, GROUP),)
    [(_, reason, detail, step)] = _group_events(tmp_path / "again")
    assert (reason, step) == ("probe rerun", 11) and "0 of 1 ranks had timed both halves" in detail
    once = _controller(tmp_path / "once", kernels, probe_min_steps=3, probe_reruns=0, **GROUPED)
    _steps([once], ONE_STEP)
    said = "no group figures: 0 of 1 ranks had timed both windows (3 steps each at one signature)"
    assert once.group_proven is False and once.group_probe == said
    assert [(reason, step) for _, reason, _, step in _group_events(tmp_path / "once")] == [("group not faster", 11)]
    assert _rows(tmp_path / "once", tables.ProbeVerdict) == []  # no finding: nothing was measured
    assert once.probes.halves(GROUP, FED) == ([0.07262], [0.00069] * 4)  # what the verdict was taken on before


def test_the_rerun_adds_the_steps_the_signature_lacked_and_the_group_is_decided(tmp_path: Path, kernels: Any) -> None:
    """After the rerun (12-19: baseline 12-15, every cluster on 16-19, 16 checked; every step at FED), FED has 4
    switched-on steps: the group is proven at 20 on the steps of both runs, the 72.62 ms one among them no longer
    enough to move the median (16 is checked: the second check of the clusters, `check_first` 2)."""
    controller = _controller(tmp_path, kernels, probe_min_steps=3, **GROUPED)
    _steps([controller], ONE_STEP, steps=21)
    assert controller.group_proven is True, controller.group_probe
    said = "-0.19 ms/step (0.50 vs 0.69 ms, 4+8 steps at Placeholder=108, 1 first call left out, noise 0.00 ms)"
    assert controller.group_probe == said


def test_a_first_call_outlier_at_a_new_signature_does_not_decide_the_group(tmp_path: Path, kernels: Any) -> None:
    """Regression: the kernels' first call at FED (9: 72.62 ms) was a sample of the group's on-half, so with one
    more step there the median (36.56 ms) called every cluster on 36 ms slower than TF. Its one-off cost is not
    the kernels': left out, the group is proven on the step after it (a minimum of 1 step, to show this rule
    alone). The first call at OTHER was a check step (7), which times nothing: 8 there is a sample."""
    controller = _controller(tmp_path, kernels, probe_min_steps=1, **GROUPED)
    _steps([controller], {7: (OTHER, 0.5), 8: (OTHER, 0.5), 9: (FED, 72.62)})
    assert controller.group_proven is True, controller.group_probe
    said = "-0.19 ms/step (0.50 vs 0.69 ms, 1+4 steps at Placeholder=108, 1 first call left out, noise 0.00 ms)"
    assert controller.group_probe == said
    assert controller.probes.halves(GROUP, OTHER) == ([0.0005], [])


def test_ranks_short_of_steps_at_the_signature_take_the_same_decision_from_the_summed_figures(
    tmp_path: Path, kernels: Any
) -> None:
    """Rank 0 timed 3 switched-on steps at FED (8-10; 7 checked), rank 1 only 1 (7 and 8 at another batch size, 9
    its kernels' first call at FED): rank 1 sends no figures and waits, so both ranks run the group pair again
    from the same step and decide it together after it, on the summed figures."""
    ranks = [_controller(tmp_path, kernels, rank, size=2, probe_min_steps=3, **GROUPED) for rank in (0, 1)]
    fed: list[dict[int, tuple[str, float]]] = [{}, {7: (OTHER, 0.5), 8: (OTHER, 0.5)}]
    n = len(ranks[0].clusters)
    for step in range(21):
        figures = [c.local(step) for c in ranks]
        if step == 11:  # the group's decision step: rank 0 has figures, rank 1 waits for steps
            assert [DecisionFigures.unpack(f, n).group.waiting for f in figures] == [0.0, 1.0]
            assert [DecisionFigures.unpack(f, n).group.ready for f in figures] == [1.0, 0.0]
        for rank, controller in enumerate(ranks):
            on, checked = controller.switches(step), controller.checks(step)
            signature, ms = fed[rank].get(step, (FED, 0.5 if on.any() else 0.69))
            controller.timed(step, ms * 1e-3 + (0.05 if checked else 0.0), checked, signature)
        summed = np.sum(figures, axis=0)
        for controller in ranks:
            controller.decide(step, summed)
    for controller in ranks:
        controller.ledger.close()
    assert ranks[0].timing == ranks[1].timing and ranks[0].timing.reruns == ((12, GROUP),)
    assert ranks[0].group_proven is ranks[1].group_proven is True
    events = sorted((rank, reason, step) for rank, reason, _, step in _group_events(tmp_path))
    assert events == [(0, "group proven", 20), (0, "probe rerun", 11), (1, "group proven", 20), (1, "probe rerun", 11)]


def test_a_first_call_is_left_out_of_whichever_half_runs_it_and_the_plain_graph_has_none() -> None:
    """`Probes`: the group's baseline runs the user's graph (nothing on): a new signature there is TF's own cost,
    a sample. A cluster's reference half runs the twin with the others on: their first call at a signature is
    left out there too. A check step times nothing, but its calls count: the step after it is no first call."""
    timing = dataclasses.replace(TIMING, clusters=2, probe_group=True, probe_min_steps=1)
    probes = Probes(timing)
    assert timing.subject(3) == GROUP and timing.phase(3) == "baseline" and timing.subject(11) == 0
    probes.add(3, 0.004, True, "a")  # the group's baseline at a new signature: nothing on, a sample
    probes.add(7, 0.059, False, "a", on=(0, 1))  # a check step: both kernels' first call at "a", not timed
    probes.add(8, 0.009, True, "a", on=(0, 1))
    probes.add(9, 0.009, True, "b", on=(0, 1))  # both kernels' first call at "b", on a timed step: left out
    probes.add(10, 0.003, True, "b", on=(0, 1))
    assert probes.halves(GROUP, "a") == ([0.009], [0.004]) and probes.halves(GROUP, "b") == ([0.003], [])
    assert probes.first == {GROUP: 1}
    probes.add(11, 0.005, True, "c", on=(1,))  # cluster 0's reference half: 1's first call at "c"
    probes.add(12, 0.004, True, "c", on=(1,))
    probes.add(15, 0.003, True, "c", on=(0, 1), plain=(0,))  # 0 on TF's ops at "c": no call of its kernel there
    probes.add(16, 0.002, True, "c", on=(0, 1))  # 0's first call at "c"
    probes.add(17, 0.003, True, "c", on=(0, 1))
    assert probes.halves(0, "c") == ([0.003], [0.004]) and probes.first[0] == 2 and probes.left_out[0] == 1
    probes.add(18, 0.003, True, None, on=(0, 1))  # kernels still to come: nothing of theirs ran, no call recorded
    assert probes.called == {(0, "a"), (1, "a"), (0, "b"), (1, "b"), (1, "c"), (0, "c")}


def test_a_half_short_of_the_minimum_has_no_medians_and_waits_for_a_rerun() -> None:
    probes = Probes(dataclasses.replace(TIMING, clusters=2, probe_min_steps=3))
    for step in (3, 4, 5, 6):  # cluster 0's reference half
        probes.add(step, 0.003, True, "a")
    probes.add(8, 0.002, True, "a")  # one timed step of its probe half (7 is checked)
    assert probes.measured(0) == "a" and probes.medians(0) is None and probes.waiting(0)
    probes.add(9, 0.002, True, "a")
    assert probes.medians(0) is None
    probes.add(10, 0.002, True, "a")
    assert probes.medians(0) == (0.002, 0.003) and not probes.waiting(0)
    assert not probes.waiting(1)  # nothing timed for it: no rerun is asked on its account


def test_the_minimum_is_a_setting_of_its_own_and_at_least_one() -> None:
    assert settings.load({}).probe_min_steps == 3 == Timing.from_settings(settings.load({})).probe_min_steps
    current = settings.load({"STITCHFLEET_PROBE_MIN_STEPS": "5"})
    assert Timing.from_settings(current, clusters=2).probe_min_steps == 5
    assert settings.area_of("probe_min_steps") == "probes"
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_PROBE_MIN_STEPS=0: expected a value >= 1"):
        settings.load({"STITCHFLEET_PROBE_MIN_STEPS": "0"})
    with pytest.raises(ValueError, match="probe_min_steps=0"):
        dataclasses.replace(TIMING, probe_min_steps=0)
