"""The probe phase of the schedule: every step's phase, probed cluster, decision and check (TF-free)."""

from __future__ import annotations

import dataclasses

import pytest

from stitchfleet import settings
from stitchfleet.plugin.control.schedule import BASELINE, GROUP, PROBE, REFERENCE, STITCHED, WARMUP, Probes, Timing
from stitchfleet.plugin.control.step_windows import Windows

# Without the group probe (today's schedule before it, and STITCHFLEET_PROBE_GROUP=0 now):
# warmup 0-1, baseline 2-4, pair 0: reference 5-8 + probe 9-12, pair 1: reference 13-16 + probe 17-20,
# stitched from 21; the next baseline window starts 20 stitched-phase steps after the first one ended
PROBING = Timing(
    warmup_steps=2,
    baseline_steps=3,
    rebaseline_every=20,
    check_every=10,
    check_first=2,
    probe_steps=4,
    clusters=2,
    probe_rounds=1,
    probe_group=False,
    probe_min_steps=1,  # these pairs time 1-3 steps a half; the minimum is tested apart (test_probe_min_steps)
)


def test_every_step_has_its_phase() -> None:
    phases = [PROBING.phase(s) for s in range(45)]
    expected = (
        [WARMUP] * 2
        + [BASELINE] * 3
        + ([REFERENCE] * 4 + [PROBE] * 4) * 2
        + [STITCHED] * 8
        + [BASELINE] * 3  # the confirmation window: 2 first checks and two brackets' room after the probes
        + [STITCHED] * 6
        + [BASELINE] * 3
        + [STITCHED] * 4
    )
    assert phases == expected and PROBING.confirm_start == 29
    assert (PROBING.probe_start, PROBING.stitched_start) == (5, 21)


def test_each_probe_pair_names_its_cluster_and_is_decided_right_after() -> None:
    probed = {s: PROBING.probed(s) for s in range(30) if PROBING.probed(s) is not None}
    assert probed == {**dict.fromkeys(range(5, 13), 0), **dict.fromkeys(range(13, 21), 1)}
    decided = {s: PROBING.decides(s) for s in range(60) if PROBING.decides(s) is not None}
    assert decided == {13: 0, 21: 1}


def test_first_step_of_each_only_k_window_and_the_first_stitched_steps_are_checks() -> None:
    checked = [s for s in range(60) if PROBING.checks(s)]
    # probe checks 9 and 17; stitched 21, 22 (check_first); 30 and 40 are baseline steps; 50 (every 10)
    assert checked == [9, 17, 21, 22, 50]
    assert PROBING.probe_checks == 1


def test_probe_checks_leave_a_timed_step_and_follow_check_first() -> None:
    assert Timing(probe_steps=1, check_first=5).probe_checks == 0
    assert Timing(probe_steps=10, check_first=0).probe_checks == 0
    assert Timing(probe_steps=10, check_first=5).probe_checks == 1


def test_no_probing_is_the_old_schedule_whatever_the_cluster_count() -> None:
    old = Timing(warmup_steps=2, baseline_steps=3, rebaseline_every=10, check_every=10, check_first=2, probe_steps=0)
    many = Timing(
        warmup_steps=2, baseline_steps=3, rebaseline_every=10, check_every=10, check_first=2, probe_steps=0, clusters=7
    )
    assert [many.phase(s) for s in range(40)] == [old.phase(s) for s in range(40)]
    assert [many.checks(s) for s in range(40)] == [old.checks(s) for s in range(40)]
    assert all(many.probed(s) is None and many.decides(s) is None for s in range(40))
    assert PROBE not in {many.phase(s) for s in range(40)}


def test_no_clusters_means_no_probe_phase() -> None:
    empty = Timing(warmup_steps=1, baseline_steps=2, probe_steps=5, clusters=0)
    assert [empty.phase(s) for s in range(5)] == [WARMUP, BASELINE, BASELINE, STITCHED, STITCHED]
    assert all(empty.decides(s) is None for s in range(30))


def test_probes_keep_the_medians_of_timed_steps_only() -> None:
    probes = Probes(PROBING)
    for step in range(5, 13):
        probes.add(step, seconds=float(step), timed=PROBING.checks(step) is False)
    probes.add(3, seconds=99.0, timed=True)  # the first baseline window is not part of a probe pair
    assert probes.medians(0) == (11.0, 6.5)  # probe 0: 10, 11, 12 (9 was the check); reference: 5..8
    assert probes.medians(1) is None
    probes.add(13, 1.0, timed=True)
    assert probes.medians(1) is None  # its probe half has no timed step yet


def test_reference_windows_are_booked_as_stitched_and_never_as_the_baseline() -> None:
    """Both halves of a cluster's pair run stitched clusters on the twin: neither is plain TF, so neither
    may become the baseline the savings and the slowdown guard compare with."""
    windows = Windows(size=10)
    for step, (mode, seconds) in enumerate([(BASELINE, 2.0), (BASELINE, 2.0), (REFERENCE, 1.0), (PROBE, 1.5)]):
        windows.add(step, mode, seconds, timed=True)
    *_, last = windows.close()
    assert windows.baseline_median == 2.0  # the reference step (1.0) did not move it
    assert last is not None and last.mode == PROBE and last.row_mode == STITCHED
    reference = Windows(size=10)
    reference.add(0, REFERENCE, 1.0, timed=True)
    [closed] = reference.close()
    assert closed.row_mode == STITCHED and reference.baseline_median is None


def test_probe_windows_are_booked_as_stitched_against_their_paired_baseline() -> None:
    windows = Windows(size=10)
    closed = []
    for step, (mode, seconds) in enumerate([(BASELINE, 2.0), (BASELINE, 2.0), (PROBE, 3.0), (PROBE, 2.5)]):
        closed += windows.add(step, mode, seconds, timed=True)
    *_, last = windows.close()
    assert last.mode == PROBE and last.row_mode == STITCHED
    assert last.saved_seconds == pytest.approx(2 * 2.0 - 5.5)
    assert windows.stitched_median is None  # the job-level slowdown guard only reads stitched-phase windows
    assert closed[0].row_mode == BASELINE


@pytest.mark.parametrize("name", ["probe_steps", "clusters", "warmup_steps"])
def test_negative_counts_are_rejected_with_their_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"Timing.{name}=-1: expected >= 0"):
        Timing(**{name: -1})


def test_probe_knobs_come_from_settings_and_are_validated() -> None:
    current = settings.load({"STITCHFLEET_PROBE_STEPS": "6", "STITCHFLEET_PROBE_MARGIN": "0.02"})
    timing = Timing.from_settings(current, clusters=3)
    assert (timing.probe_steps, timing.probe_margin, timing.clusters) == (6, 0.02, 3)
    assert Timing.from_settings(settings.load({})).probe_steps == 10
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_PROBE_STEPS=-2: expected a value >= 0"):
        settings.load({"STITCHFLEET_PROBE_STEPS": "-2"})
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_PROBE_MARGIN"):
        settings.load({"STITCHFLEET_PROBE_MARGIN": "-0.1"})


def test_rounds_repeat_every_pair_with_the_order_swapped_and_decide_after_the_last() -> None:
    """Two rounds: round 0 runs reference then probe, round 1 probe then reference (a steady drift lands
    on both halves); each cluster is decided once, after its last pair, from the pooled steps."""
    two = dataclasses.replace(PROBING, probe_rounds=2)
    assert two.stitched_start == 5 + 2 * 4 * 2 * 2
    phases = [two.phase(s) for s in range(5, 37)]
    assert phases == ([REFERENCE] * 4 + [PROBE] * 4) * 2 + ([PROBE] * 4 + [REFERENCE] * 4) * 2
    assert [two.probed(s) for s in (5, 13, 21, 29, 36)] == [0, 1, 0, 1, 1]
    assert {s: two.decides(s) for s in range(60) if two.decides(s) is not None} == {29: 0, 37: 1}
    assert [s for s in range(5, 37) if two.checks(s)] == [9, 17, 21, 29]
    probes = Probes(two)
    for step in range(5, 37):
        probes.add(step, seconds=float(step), timed=not two.checks(step))
    alone, base = probes.medians(0) or (0.0, 0.0)
    assert alone == 17.0 and base == 16.5  # probe 0: 10-12, 22-24; reference: 5-8, 25-28


def test_probe_noise_is_the_standard_error_of_the_median_difference() -> None:
    probes = Probes(PROBING)
    for step in range(5, 13):
        probes.add(step, seconds=1.0 + (0.1 if step % 2 else -0.1), timed=not PROBING.checks(step))
    noise = probes.noise(0)
    assert 0.05 < noise < 0.2  # spread 0.1 per half, 3 and 4 steps
    assert Probes(PROBING).noise(0) == 0.0


# With the group probe (the default): warmup 0-1, baseline 2-4, group pair: baseline 5-8 + every cluster on
# 9-12, decided at 13; pair 0: reference 13-16 + probe 17-20, pair 1: reference 21-24 + probe 25-28; stitched
# from 29
GROUPED = dataclasses.replace(PROBING, probe_group=True)


def test_the_group_pair_comes_first_and_is_decided_before_any_cluster() -> None:
    assert (GROUPED.probe_start, GROUPED.cluster_start, GROUPED.stitched_start) == (5, 13, 29)
    phases = [GROUPED.phase(s) for s in range(35)]
    group = [BASELINE] * 4 + [PROBE] * 4  # every cluster on against plain TF
    assert phases == [WARMUP] * 2 + [BASELINE] * 3 + group + ([REFERENCE] * 4 + [PROBE] * 4) * 2 + [STITCHED] * 6
    assert [s for s in range(40) if GROUPED.grouped(s)] == list(range(5, 13))
    assert {s: GROUPED.subject(s) for s in (4, 5, 12, 13, 28, 29)} == {
        4: None,
        5: GROUP,
        12: GROUP,
        13: 0,
        28: 1,
        29: None,
    }
    assert all(GROUPED.probed(s) is None for s in range(5, 13))
    assert [s for s in range(60) if GROUPED.decides_group(s)] == [13]
    assert {s: GROUPED.decides(s) for s in range(60) if GROUPED.decides(s) is not None} == {21: 0, 29: 1}


def test_the_first_step_with_every_cluster_on_is_a_check() -> None:
    # group 9; probe 0 17, probe 1 25; stitched 29, 30 (check_first), 40, 50 (every 10; 46-48 is a baseline)
    assert [s for s in range(60) if GROUPED.checks(s)] == [9, 17, 25, 29, 30, 40, 50]


def test_group_rounds_alternate_their_order_and_pool_their_steps() -> None:
    two = dataclasses.replace(GROUPED, probe_rounds=2)
    assert (two.cluster_start, two.stitched_start) == (5 + 2 * 4 * 2, 21 + 2 * 4 * 2 * 2)
    assert [two.phase(s) for s in range(5, 21)] == [BASELINE] * 4 + [PROBE] * 4 + [PROBE] * 4 + [BASELINE] * 4
    assert [s for s in range(60) if two.decides_group(s)] == [21]
    assert {s: two.decides(s) for s in range(80) if two.decides(s) is not None} == {45: 0, 53: 1}
    probes = Probes(two)
    for step in range(5, 21):
        probes.add(step, seconds=float(step), timed=not two.checks(step))
    assert probes.medians(GROUP) == (13.0, 12.5)  # group: 10-12, 14-16 (9 and 13 checks); baseline: 5-8, 17-20
    assert probes.medians(0) is None and probes.noise(GROUP) > 0.0


def test_a_single_cluster_gets_no_group_phase() -> None:
    one = dataclasses.replace(GROUPED, clusters=1)
    assert not one.grouping and one.cluster_start == one.probe_start == 5
    assert not any(one.grouped(s) or one.decides_group(s) for s in range(40))


def test_the_group_setting_off_is_the_schedule_without_a_group_phase() -> None:
    """PROBING (group off) keeps the schedule the tests above pin; from settings the same."""
    assert not PROBING.grouping and PROBING.cluster_start == PROBING.probe_start
    assert not any(PROBING.grouped(s) or PROBING.decides_group(s) for s in range(60))
    off = Timing.from_settings(settings.load({"STITCHFLEET_PROBE_GROUP": "0"}), clusters=2)
    on = Timing.from_settings(settings.load({}), clusters=2)
    assert (off.probe_group, on.probe_group) == (False, True)
    assert on.group_rounds == 4 * on.probe_rounds  # STITCHFLEET_PROBE_GROUP_FACTOR's default
    assert on.stitched_start - off.stitched_start == 2 * on.probe_steps * on.group_rounds
    with pytest.raises(settings.SettingsError, match="STITCHFLEET_PROBE_GROUP"):
        settings.load({"STITCHFLEET_PROBE_GROUP": "maybe"})


def test_the_group_factor_multiplies_the_group_rounds_and_keeps_their_alternation() -> None:
    four = dataclasses.replace(GROUPED, group_factor=4)
    assert four.group_rounds == 4 * GROUPED.probe_rounds
    assert four.cluster_start == four.probe_start + 2 * four.probe_steps * four.group_rounds
    firsts = [four.phase(four.probe_start + 2 * four.probe_steps * r) for r in range(four.group_rounds)]
    assert firsts == ["baseline", "probe"] * (four.group_rounds // 2)  # odd rounds run the group first
    assert four.decides_group(four.cluster_start) and not four.decides_group(four.cluster_start - 1)
    with pytest.raises(ValueError, match="group_factor=0"):
        Timing(group_factor=0)


def test_probes_leave_out_steps_on_tfs_ops_and_compare_halves_within_one_signature() -> None:
    """Cluster 0's pair: reference 5-8, probe 9-12 (5 and 9 checked). Steps of signature "b" are 1 ms slower
    whatever runs; a step whose switched-on clusters ran TF's ops for want of a kernel (None) counts nowhere.
    Pooled, the probe half's "a" steps against the reference's "b" steps passed for a 1 ms gain."""
    probes = Probes(PROBING)
    fed = {6: ("b", 4.0), 7: ("b", 4.0), 8: ("a", 3.0), 10: ("a", 3.0), 11: ("a", 3.0), 12: (None, 9.0)}
    for step, (signature, ms) in fed.items():
        probes.add(step, ms * 1e-3, True, signature)
    assert probes.measured(0) == "a"  # one "a" step in the reference half; "b" has none in the probe half
    assert probes.medians(0) == (0.003, 0.003)
    assert probes.halves(0, "a") == ([0.003, 0.003], [0.003]) and probes.left_out == {0: 1}
    probes.add(9, 0.004, True, "b")
    probes.add(9 + 100, 0.004, True, "b")  # outside the probe phase: no subject, counted nowhere
    assert probes.measured(0) == "a"  # "b": 2 reference steps, 1 probe step; "a": 2 and 1: the first key wins
    probes.add(12, 0.004, True, "b")
    assert probes.measured(0) == "b" and probes.medians(0) == (0.004, 0.004)
    assert probes.measured(1) is None and probes.medians(1) is None and probes.noise(1) == 0.0
    # cluster 1's pair (reference 13-16, probe 17-20): at "c" cluster 1 has no kernel for good (`plain`: it ran
    # TF's ops), cluster 0 neither: its probe steps count nowhere, its reference steps (1 off) count
    probes.add(14, 0.005, True, "c", plain=(0,))
    probes.add(18, 0.005, True, "c", plain=(0, 1))
    probes.add(19, 0.002, True, "d", plain=(0,))  # 0 on TF's ops in both halves alike: 1's step counts
    probes.add(15, 0.003, True, "d", plain=(0,))
    assert probes.halves(1, "c") == ([], [0.005]) and probes.left_out[1] == 1
    assert probes.measured(1) == "d" and probes.medians(1) == (0.002, 0.003)


# --- reruns: a pair decided without figures from every rank runs again --------------------------------


def test_a_rerun_inserts_the_pair_after_its_decision_step_and_replays_that_step() -> None:
    """Cluster 0 is decided at 13 (PROBING); its rerun runs 14-21 (reference 14-17, probe 18-21), step 22 then
    replays 13 (the first step of cluster 1's pair) and decides cluster 0 again; everything after shifts
    by the rerun's 8 steps and the replayed one (periodic checks stay on every `check_every`-th step)."""
    rerun = PROBING.rerun(13, 0)
    assert rerun.rerun_length(0) == 8 and rerun.reruns_of(0) == 1 and rerun.reruns_of(1) == 0
    assert [rerun.phase(s) for s in range(14, 22)] == [REFERENCE] * 4 + [PROBE] * 4
    assert [rerun.probed(s) for s in range(14, 22)] == [0] * 8
    assert {s: rerun.decides(s) for s in range(60) if rerun.decides(s) is not None} == {13: 0, 22: 0, 30: 1}
    for step in range(22, 60):  # after the rerun: the schedule without it, 9 steps later
        assert (rerun.phase(step), rerun.probed(step)) == (PROBING.phase(step - 9), PROBING.probed(step - 9)), step
    assert [s for s in range(22, 32) if rerun.checks(s)] == [s + 9 for s in range(13, 23) if PROBING.checks(s)]
    assert [s for s in range(32, 60) if rerun.checks(s)] == [50]  # 38-40: the confirmation window, shifted
    assert [s for s in range(14, 22) if rerun.checks(s)] == [18]  # the probe half's first step, as in a pair
    assert rerun.first_checks(30) and not rerun.first_checks(21)
    assert [rerun.phase(s) for s in range(0, 14)] == [PROBING.phase(s) for s in range(0, 14)]


def test_a_group_rerun_keeps_its_rounds_alternating_and_the_group_decides_again() -> None:
    grouped = dataclasses.replace(PROBING, probe_group=True, probe_rounds=2)
    decided = grouped.cluster_start
    assert grouped.decides_group(decided)
    rerun = grouped.rerun(decided, GROUP)
    length = rerun.rerun_length(GROUP)
    assert length == 2 * 4 * 2
    phases = [rerun.phase(s) for s in range(decided + 1, decided + 1 + length)]
    assert phases == [BASELINE] * 4 + [PROBE] * 4 + [PROBE] * 4 + [BASELINE] * 4
    assert all(rerun.grouped(s) for s in range(decided + 1, decided + 1 + length))
    assert [s for s in range(100) if rerun.decides_group(s)] == [decided, decided + 1 + length]
    twice = rerun.rerun(decided + 1 + length, GROUP)
    assert twice.reruns_of(GROUP) == 2
    assert [s for s in range(200) if twice.decides_group(s)] == [
        decided,
        decided + 1 + length,
        decided + 2 + 2 * length,
    ]


def test_reruns_come_in_step_order_and_the_knob_is_validated() -> None:
    rerun = PROBING.rerun(13, 0)
    with pytest.raises(ValueError, match="already reruns from step 14"):
        rerun.rerun(5, 1)
    with pytest.raises(ValueError, match="probe_reruns=-1"):
        dataclasses.replace(PROBING, probe_reruns=-1)
    assert Timing.from_settings(settings.load({"STITCHFLEET_PROBE_RERUNS": "0"})).probe_reruns == 0


def test_a_subject_waits_for_kernels_only_when_some_of_its_steps_had_them_still_to_come() -> None:
    """`Probes.waiting`: a rerun helps a pair whose steps were left out because kernels were still to come
    (signature None; another signature over the bound beside them does not matter), not one whose cluster ran
    TF's ops for good (`plain`) on every step."""
    compiling, mixed, withheld, timed = Probes(PROBING), Probes(PROBING), Probes(PROBING), Probes(PROBING)
    for step in range(5, 13):  # cluster 0's pair
        compiling.add(step, 1.0, True, None)
        mixed.add(step, 1.0, True, None if step % 2 else "20", plain=() if step % 2 else (0, 1))
        withheld.add(step, 1.0, True, "16", plain=(0,))
        timed.add(step, 1.0, True, "16")
    assert compiling.waiting(0) and not compiling.waiting(1)
    assert mixed.waiting(0) and mixed.left_out[0] == 8 and mixed.unsettled[0] == 4
    assert not withheld.waiting(0) and withheld.left_out[0] == 8
    assert not timed.waiting(0) and timed.medians(0) == (1.0, 1.0)
