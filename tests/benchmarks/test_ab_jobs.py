"""scripts/ab_jobs.py's bookkeeping without running a job: the modes' order per round with the control (plain TF
a second time), and the noise of a difference between two processes that the table judges claims by."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ab_jobs


def _plain(wall: float, steps: float) -> dict[str, Any]:
    return {"wall": wall, "to_last": wall, "steps_seconds": steps, "steady": 0.02, "losses": [1.0, 0.5], "steps": 10}


def test_the_warm_run_sits_between_the_rounds_two_plain_processes() -> None:
    """Session 36: the host slowed cold, XLA and warm (31.4-44.0 ms a step) between plain runs at 23.2 and 23.4 ms;
    with plain three runs before the warm run, a slow window that spared plain TF booked the warm run 1.26x."""
    assert ab_jobs._order(0, control=True) == ("cold", "xla", "plain", "warm", "again")
    assert ab_jobs._order(1, control=True) == ("xla", "cold", "again", "warm", "plain")
    for round_ in range(4):
        order = ab_jobs._order(round_, inproc=True, control=True)
        assert order[-1] == "inproc"
        warm = order.index("warm")
        assert {order[warm - 1], order[warm + 1]} == {"plain", "again"}
        assert order.index("cold") < warm
    assert "again" not in ab_jobs._order(0)


def test_the_warm_run_is_told_the_step_of_the_plain_process_before_it() -> None:
    steady = {"plain": [{"steady": 0.020}, {"steady": 0.030}], "again": [{"steady": 0.021}, {"steady": 0.031}]}
    assert ab_jobs._known_step_ms(steady["plain"][:1], steady["again"][:0], 0) == pytest.approx(20.0)
    # round 1: plain again ran before the warm run, plain after it
    assert ab_jobs._known_step_ms(steady["plain"][:1], steady["again"][:2], 1) == pytest.approx(31.0)
    assert ab_jobs._known_step_ms([{"steady": 0.020}, {"error": "stopped"}], [], 1) == pytest.approx(20.0)
    assert ab_jobs._known_step_ms([], [], 0) == 0.0


def test_a_run_is_weighed_against_the_mean_of_the_two_plain_runs_beside_it() -> None:
    plain, again = [_plain(50.0, 40.0), _plain(60.0, 50.0)], [_plain(54.0, 44.0), _plain(56.0, 46.0)]
    warm = [_plain(53.0, 43.0), _plain(57.0, 47.0)]
    assert ab_jobs._beside(list(zip(plain, again, warm, strict=True))) == "1.019x / 0.983x (median 1.001x)"
    assert ab_jobs._beside([(plain[0], {"error": "stopped"}, warm[0])]) == "-"
    assert ab_jobs._beside([]) == ""
    rows = {
        line.split(" | ")[1]: line.split(" | ")
        for line in ab_jobs.table({"job": {"plain": plain, "warm": warm, "again": again}})[2:]
    }
    assert rows["warm"][4] == "1.019x / 0.983x (median 1.001x)"
    assert rows["again"][4] == rows["plain"][4] == ""


def test_noise_is_plain_against_plain_again_in_the_same_round() -> None:
    # Across rounds plain TF moves by 10 s (a slower machine in round 2), within a round by 1 s and 3 s: a run is
    # compared with its own round's plain run, so the noise is the within-round figure, RMS over the rounds.
    by_mode = {
        "plain": [_plain(50.0, 40.0), _plain(60.0, 50.0)],
        "again": [_plain(51.0, 41.0), _plain(57.0, 47.0)],
    }
    assert ab_jobs._noise(by_mode, "wall") == pytest.approx(math.sqrt((1.0 + 9.0) / 2))
    assert ab_jobs._noise(by_mode, "steps_seconds") == pytest.approx(math.sqrt(5.0))


def test_noise_leaves_out_failed_runs_and_falls_back_to_the_spread_without_the_control() -> None:
    failed = {"error": "stopped"}
    by_mode = {"plain": [_plain(50.0, 40.0), _plain(52.0, 42.0)], "again": [failed, _plain(53.0, 43.0)]}
    assert ab_jobs._noise(by_mode, "wall") == pytest.approx(1.0)
    without = {"plain": [_plain(50.0, 40.0), _plain(52.0, 42.0)]}
    assert ab_jobs._noise(without, "wall") == pytest.approx(2.0)  # stdev sqrt 2, x sqrt 2
    assert math.isnan(ab_jobs._noise({"plain": [_plain(50.0, 40.0)]}, "wall"))


def test_the_clock_may_lie_students_t_of_the_noises_rounds_from_the_claim() -> None:
    """Session 54: a noise measured over two rounds (two plain / plain again pairs) is an estimate with two degrees of
    freedom, and a 95% bound on a difference from it is t(2) = 4.30 times it, not 2 (the MLP's cold run: its clock
    1.18 s, its claim's low end 1.97 s less 0.29 s of noise: "no" at 2x, "yes" at t). With no control, plain TF's
    rounds less one; none: no bound."""
    two = {"plain": [_plain(50.0, 8.39), _plain(50.0, 7.89)], "again": [_plain(50.0, 7.95), _plain(50.0, 7.70)]}
    assert ab_jobs._noise_width(two, "steps_seconds") == pytest.approx(4.303)
    three = {"plain": [_plain(50.0, 40.0), _plain(51.0, 41.0), _plain(52.0, 42.0)]}
    assert ab_jobs._noise_width(three, "wall") == pytest.approx(4.303)  # three rounds, no control: 2 degrees
    assert math.isnan(ab_jobs._noise_width({"plain": [_plain(50.0, 40.0)]}, "wall"))
    plain = _plain(50.0, (8.39 + 7.95) / 2)
    cold = {**_plain(50.0, 6.99), "claimed_gross": 2.59, "measured_gross": 2.59, "interval": [2.15, 3.02]}
    cold.update(setup=1.6, overhead=0.04, setup_from_steps=0.18)
    noise = (0.29, 0.5)
    assert ab_jobs._agrees(plain, {**cold, "overhead": 0.0}, noise) == "no (+1.18)"  # 2 x noise: 1.38 to 3.42
    assert ab_jobs._agrees(plain, {**cold, "overhead": 0.0}, noise, (4.303, 4.303)) == "yes"


def test_the_table_shows_the_control_against_plain_and_judges_by_its_noise() -> None:
    skipped = {"decided": "setup skipped", "claimed_gross": 0.0, "measured_gross": 0.0, "setup": 0.0, "overhead": 0.0}
    skipped.update(interval=[-math.inf, math.inf], setup_from_steps=0.0)
    warm = [{**_plain(50.5, 40.65), **skipped}, {**_plain(50.5, 39.9), **skipped}]
    results = {
        "job": {
            "plain": [_plain(50.0, 40.0), _plain(50.0, 40.0)],
            "xla": [_plain(70.0, 60.0), _plain(70.0, 60.0)],
            "cold": warm,
            "warm": warm,
            "again": [_plain(50.2, 40.3), _plain(49.6, 39.7)],
        }
    }
    rows = {line.split(" | ")[1]: line for line in ab_jobs.table(results)[2:]}
    assert set(rows) == {"plain", "xla", "cold", "warm", "again"}
    assert "1.004x; 1.004x / 0.992x; 0.992x" in rows["again"]
    assert "| 0.3 / 0.3 |" in rows["warm"]  # RMS of 0.3 and 0.3 s (steps), 0.2 and 0.4 s (wall)
    # nothing claimed; -0.5 and -0.05 s from the mean of each round's two plain runs: within 2 x 0.3 x sqrt(3/4) s
    # (against plain TF's run alone, round 1 was "no (-0.65)": over 2 x 0.3 s)
    assert "yes / yes" in rows["warm"]


def test_the_clock_is_read_against_the_mean_of_the_plain_runs_beside_the_run() -> None:
    """Session 36: BERT's warm run, which skipped its setup and claimed nothing, ran 13.4 s faster than a plain run
    slowed by the host and was booked "no". Against the mean of the round's two plain runs, the difference's noise
    being sqrt(3/4) of one pair's, a run that claims nothing agrees unless it differs from both beyond the noise."""
    plain, again = _plain(85.0, 80.0), _plain(77.0, 72.0)
    warm = {**_plain(76.5, 71.5), "claimed_gross": 0.0, "measured_gross": 0.0, "interval": [-math.inf, math.inf]}
    warm.update(setup=0.0, overhead=0.0, setup_from_steps=0.0)
    assert ab_jobs._agrees(plain, warm, (3.0, 3.0)) == "no (+8.50)"  # against the slow plain run alone
    reference, noise = ab_jobs._plain_beside(plain, again, (3.0, 3.0))
    assert reference["steps_seconds"] == pytest.approx(76.0) and reference["wall"] == pytest.approx(81.0)
    assert noise == pytest.approx((3.0 * math.sqrt(0.75), 3.0 * math.sqrt(0.75)))
    assert ab_jobs._agrees(reference, warm, noise) == "yes"  # +4.5 s within 2 x 2.60 s
    # plain again failed: plain TF's run alone, at the full noise
    assert ab_jobs._plain_beside(plain, {"error": "stopped"}, (3.0, 3.0)) == (plain, (3.0, 3.0))
    assert ab_jobs._plain_beside(plain, None, (3.0, 3.0)) == (plain, (3.0, 3.0))


def test_a_corpus_program_is_judged_on_its_wall_with_its_whole_setup_booked() -> None:
    """A program in its own interpreter (session 34): its report books 9 s of setup, 4 s before its first step and 5 s
    in its steps, which nothing outside tells apart. Its steps' difference (-6 s) judged with no setup booked said
    "no"; its wall's (-10 s) against the claim less the whole setup agrees."""
    plain, again = _plain(70.0, 60.0), _plain(70.5, 60.3)
    cold = {**_plain(80.0, 66.0), "claimed_gross": 0.0, "measured_gross": 0.2, "interval": [-1.0, 1.0]}
    cold.update(setup=9.0, overhead=0.1, setup_from_steps=0.0, clock="wall")
    noise = (ab_jobs._noise({"plain": [plain], "again": [again]}, "steps_seconds"), 0.5)
    assert ab_jobs._agrees(plain, cold, noise) == "yes (wall)"
    assert ab_jobs._agrees(plain, {**cold, "wall": 90.0}, noise) == "no (-20.00) (wall)"  # beyond what it booked
    own = {key: value for key, value in cold.items() if key != "clock"}  # a job of this script: its steps
    assert ab_jobs._agrees(plain, own, noise) == "no (-6.00)"
    assert ab_jobs._agrees(plain, {**own, "setup_from_steps": 5.0}, noise) == "yes"
    assert ab_jobs._agrees(plain, cold, (0.3, math.nan)) == "n/a"


def test_a_corpus_programs_wall_leaves_out_tfs_own_session_close() -> None:
    """Session 38: BERT's runs end 35-64 s after their last step in 2-3 of 8 runs, in TF's own `TF_CloseSession`
    (tf.data's autotune thread misses its cancellation), in any mode. The table judges a corpus program's wall less
    that close and shows the close beside it; the whole wall is kept."""
    closes = {"plain": [0.4, 0.3], "again": [0.3, 61.5], "warm": [43.0, 0.5]}  # again's stall would be the noise
    results: dict[str, dict[str, list[dict[str, Any]]]] = {"bert": {}}
    for mode, found in closes.items():
        results["bert"][mode] = [{**_plain(80.0 + close, 70.0), "tf_close": close, "clock": "wall"} for close in found]
    for run in results["bert"]["warm"]:
        run.update(claimed_gross=0.0, measured_gross=0.0, interval=[-math.inf, math.inf], setup=0.0, overhead=0.0)
    rows = {line.split(" | ")[1]: line for line in ab_jobs.table(results)[2:]}
    assert "| 80.0 (+43.0 TF close) / 80.0 |" in rows["warm"] and "| 80.0 / 80.0 (+61.5 TF close) |" in rows["again"]
    assert "1.000x; " in rows["warm"] and "| 0.0 / 0.0 |" in rows["warm"]  # walls and noise without the closes
    assert "yes (wall) / yes (wall)" in rows["warm"]
    assert ab_jobs._less_close({"wall": 90.0, "tf_close": 10.0}) == {"wall": 80.0, "tf_close": 10.0, "whole": 90.0}
    assert ab_jobs._less_close({"wall": 90.0}) == {"wall": 90.0}  # a job of this script, or an older record


@pytest.mark.tf
def test_the_close_timer_times_tfs_own_session_close(tmp_path: Path) -> None:
    program = tmp_path / "closes.py"
    program.write_text(
        "import tensorflow.compat.v1 as tf\n"
        "tf.disable_v2_behavior()\n"
        "with tf.Session() as session:\n"
        "    session.run(tf.constant(1.0))\n"
        "print('CORPUS_LOSS 0 1.0', flush=True)\n"
    )
    wrapper = ab_jobs.CLOSE_TIMER + "import runpy, sys\nrunpy.run_path(sys.argv[1], run_name='__main__')\n"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", wrapper, str(program)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "CORPUS_LOSS 0 1.0" and lines[-1].startswith(ab_jobs.CLOSE_LINE)
    assert 0.0 < float(lines[-1][len(ab_jobs.CLOSE_LINE) :]) < 60.0  # the session's close was timed, once


def test_the_one_process_pair_gets_twice_a_runs_time_limit() -> None:
    """It runs the job twice (plain, then under the plugin): at 4x the plain wall the demo's pair was stopped on a
    slow day (189 s against plain's 47.3 s, session 35) and its round kept no one-process figure."""
    plain = [{"wall": 40.0}, {"wall": 47.3}, {"error": "stopped"}]
    assert ab_jobs._limit(plain, 4.0) == pytest.approx(189.2)
    assert ab_jobs._limit(plain, 4.0, "inproc") == pytest.approx(378.4)
    assert ab_jobs._limit([], 4.0, "inproc") == ab_jobs._limit(plain, 0.0) == 1800.0


def test_the_cpu_the_host_stole_during_a_run_is_read_from_proc_stat(tmp_path: Path) -> None:
    """Session 36: whole runs 20-35% slower with nothing else on the machine, while the hypervisor took up to 30% of
    the CPU (the steal column): each run now carries that share, and the table shows it beside its wall."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  1000 0 100 800 10 0 5 85 0 0\ncpu0 500 0 50 400 5 0 2 43 0 0\n")
    before = ab_jobs._host_ticks(stat)
    assert before == (85, 2000)
    stat.write_text("cpu  1800 0 150 900 10 0 5 335 30 0\n")  # guest ticks (30) are in user's already
    after = ab_jobs._host_ticks(stat)
    assert after == (335, 3200)
    assert ab_jobs._stolen(before, after) == pytest.approx(250 / 1200)
    assert ab_jobs._stolen(None, after) is None
    assert ab_jobs._stolen(after, after) is None
    assert ab_jobs._host_ticks(tmp_path / "absent") is None
    stat.write_text("cpu  1000 0 100 800\n")  # no steal column
    assert ab_jobs._host_ticks(stat) is None
    plain = [_plain(50.0, 40.0), {**_plain(65.0, 55.0), "steal": 0.214}]
    rows = {line.split(" | ")[1]: line.split(" | ") for line in ab_jobs.table({"job": {"plain": plain}})[2:]}
    assert rows["plain"][5] == "- / 21.4"
    assert "21.4% of the CPU stolen" in ab_jobs._progress("round 2/2: job plain", plain[1], 60.0)
