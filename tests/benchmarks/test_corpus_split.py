"""scripts/corpus_split.py without running a corpus program: the phases of a plugin run against plain TF's sum to
the walls' difference, steps go to the mode of the window holding them, the report's bookings sit beside them and
the rest is unbooked; its clock marks come from a real MonitoredSession."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import corpus_split


def _plain(wall: float, first: float, step: float, steps: int = 8) -> dict[str, Any]:
    arrivals = [first + i * step for i in range(steps)]
    return {"mode": "plain", "wall": wall, "marks": {"session": 2.0, "created": 3.0}, "arrivals": arrivals}


def _plugin() -> dict[str, Any]:
    # the session at 2.5 s (plain's at 2.0 and 2.2), begin 3.0-7.0, created at 8.0 (its creation less begin 1.5 s,
    # plain's 1.0 s), the first step's end at 8.7 (0.7 s after creation, plain's 0.5 s); steps 1-2 warmup at 0.1 s
    # (plain's steps all 0.1 s), 3-5 stitched at 0.08 s, a decision step 6 at 0.3 s that no window holds, 7 baseline
    # at 0.1 s; 1.0 s after the last (plain: 0.5 s)
    gaps = [0.1, 0.1, 0.08, 0.08, 0.08, 0.3, 0.1]
    arrivals = [8.7]
    for gap in gaps:
        arrivals.append(arrivals[-1] + gap)
    windows = [[0, 2, "warmup", 0.0], [3, 5, "stitched", 0.05], [7, 7, "baseline", 0.0]]
    claim = {"setup": 4.5, "overhead": 0.1, "measured_gross": 0.05, "claimed_gross": 0.0}
    marks = {"session": 2.5, "begin_in": 3.0, "begin_out": 7.0, "created": 8.0}
    return {
        "mode": "cold",
        "wall": arrivals[-1] + 1.0,
        "marks": marks,
        "arrivals": arrivals,
        "windows": windows,
        "claim": claim,
    }


def test_the_phases_sum_to_the_walls_difference_and_name_where_it_went() -> None:
    plains = [_plain(3.5 + 0.7 + 0.5, 3.5, 0.1), _plain(3.7 + 0.7 + 0.5, 3.7, 0.1)]
    plains[1]["marks"] = {"session": 2.2, "created": 3.2}
    plugin = _plugin()
    phases = corpus_split.split(plugin, plains)
    mean_wall = (plains[0]["wall"] + plains[1]["wall"]) / 2
    assert sum(p.extra for p in phases) == pytest.approx(plugin["wall"] - mean_wall)
    by_name = {p.name.split(" (")[0]: p for p in phases}
    assert by_name["before the session"].extra == pytest.approx(2.5 - 2.1)
    assert by_name["the hook's begin"].extra == pytest.approx(4.0)
    assert by_name["the hook's begin"].booked == pytest.approx(4.5)
    assert by_name["the rest of the session's creation"].extra == pytest.approx(1.5 - 1.0)
    assert by_name["to the first step's end"].extra == pytest.approx(0.7 - 0.5)
    assert by_name["stitched steps"].steps == 3
    assert by_name["stitched steps"].extra == pytest.approx(3 * -0.02)
    assert by_name["stitched steps"].booked == pytest.approx(-0.05)
    assert by_name["warmup steps"].steps == 2 and by_name["warmup steps"].booked is None
    assert by_name["unwindowed steps"].extra == pytest.approx(0.2)
    assert by_name["baseline steps"].extra == pytest.approx(0.0, abs=1e-9)
    assert by_name["after the last step"].extra == pytest.approx(0.5)
    assert by_name["after the last step"].booked == pytest.approx(0.1)
    # the wall paid (phases' sum) beyond the setup and overhead booked and the windows' measured saving
    expected = plugin["wall"] - mean_wall - (4.5 + 0.1 - 0.05)
    assert corpus_split.unbooked(plugin, phases) == pytest.approx(expected)
    lines = corpus_split.render(0, plugin, plains)
    assert lines[0].startswith("round 1: plugin") and "unbooked" in lines[-1]


def test_a_plain_run_with_fewer_steps_bounds_the_steps_compared() -> None:
    plains = [_plain(6.0, 3.5, 0.1, steps=6)]
    phases = corpus_split.split(_plugin(), plains)
    assert sum(p.steps for p in phases) == 5  # the gaps of six arrivals
    with pytest.raises(ValueError, match="no plain run"):
        corpus_split.split(_plugin(), [])


@pytest.mark.tf
def test_the_marks_come_from_a_real_monitored_session_and_its_stitch_hook(tmp_path: Path) -> None:
    program = tmp_path / "trains.py"
    program.write_text(
        "import tensorflow.compat.v1 as tf\n"
        "tf.disable_v2_behavior()\n"
        "class StitchHook(tf.train.SessionRunHook):\n"  # what the marks look for, by name
        "    pass\n"
        "step = tf.train.get_or_create_global_step()\n"
        "train = tf.assign_add(step, 1)\n"
        "hooks = [StitchHook(), tf.train.StopAtStepHook(last_step=3)]\n"
        "with tf.train.MonitoredSession(hooks=hooks) as session:\n"
        "    while not session.should_stop():\n"
        "        print('CORPUS_LOSS', session.run(train), 1.0, flush=True)\n"
    )
    from tests.corpus import corpus_runs

    # as the script runs a program: the marks, then the corpus harness' own wrapper
    argv = [sys.executable, "-c", corpus_split.MARKS + corpus_runs.WRAPPER, str(program)]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    marks = [line.split()[1] for line in done.stdout.splitlines() if line.startswith(corpus_split.MARK)]
    assert marks == ["session", "begin_in", "begin_out", "created", "end_in", "end_out"]
    assert sum(line.startswith("CORPUS_LOSS") for line in done.stdout.splitlines()) == 3
