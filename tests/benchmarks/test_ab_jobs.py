"""scripts/ab_jobs.py's bookkeeping without running a job: the modes' order per round with the control (plain TF
a second time), and the noise of a difference between two processes that the table judges claims by."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ab_jobs


def _plain(wall: float, steps: float) -> dict[str, Any]:
    return {"wall": wall, "to_last": wall, "steps_seconds": steps, "steady": 0.02, "losses": [1.0, 0.5], "steps": 10}


def test_the_control_runs_each_round_as_far_from_plain_as_the_other_modes() -> None:
    assert ab_jobs._order(0, control=True) == ("plain", "cold", "xla", "warm", "again")
    assert ab_jobs._order(1, control=True) == ("again", "xla", "cold", "plain", "warm")
    assert ab_jobs._order(0, inproc=True, control=True)[-1] == "inproc"
    assert "again" not in ab_jobs._order(0)


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


def test_the_table_shows_the_control_against_plain_and_judges_by_its_noise() -> None:
    warm = {**_plain(50.5, 40.4), "decided": "setup skipped", "claimed_gross": 0.0, "measured_gross": 0.0}
    warm.update(interval=[-math.inf, math.inf], setup=0.0, overhead=0.0, setup_from_steps=0.0)
    results = {
        "job": {
            "plain": [_plain(50.0, 40.0), _plain(50.0, 40.0)],
            "xla": [_plain(70.0, 60.0), _plain(70.0, 60.0)],
            "cold": [warm, warm],
            "warm": [warm, warm],
            "again": [_plain(50.2, 40.3), _plain(49.6, 39.7)],
        }
    }
    rows = {line.split(" | ")[1]: line for line in ab_jobs.table(results)[2:]}
    assert set(rows) == {"plain", "xla", "cold", "warm", "again"}
    assert "1.004x; 1.004x / 0.992x; 0.992x" in rows["again"]
    assert "| 0.3 / 0.3 |" in rows["warm"]  # RMS of 0.3 and 0.3 s (steps), 0.2 and 0.4 s (wall)
    assert "yes / yes" in rows["warm"]  # -0.4 s measured, nothing claimed: within 2 x 0.3 s


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


def test_the_one_process_pair_gets_twice_a_runs_time_limit() -> None:
    """It runs the job twice (plain, then under the plugin): at 4x the plain wall the demo's pair was stopped on a
    slow day (189 s against plain's 47.3 s, session 35) and its round kept no one-process figure."""
    plain = [{"wall": 40.0}, {"wall": 47.3}, {"error": "stopped"}]
    assert ab_jobs._limit(plain, 4.0) == pytest.approx(189.2)
    assert ab_jobs._limit(plain, 4.0, "inproc") == pytest.approx(378.4)
    assert ab_jobs._limit([], 4.0, "inproc") == ab_jobs._limit(plain, 0.0) == 1800.0
