"""What the stitched step of a job costs through the hook, against the same twin run raw and plain TF (figures).

Input: the command line (steps per window, rounds). Output: on stdout, median wall and process CPU time per
step of three sessions of the demo model in one process, windows alternated (order reversed every round):
plain TF (a MonitoredSession without the plugin), the hooked job in its stitched phase (every cluster on,
probes off, run through `MonitoredSession.run` as a job runs it: the hook's per-step work included), and the
same twin with every cluster on run on the raw session (the hook's Python left out). The difference between
the last two is what the hook's per-step work costs a stitched step.

    PYTHONPATH=. python scripts/hook_step.py 12 30
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import command
from stitchfleet.plugin.control.schedule import STITCHED
from stitchfleet.plugin.session.hook import StitchHook

SETTLE = 2  # untimed steps at the start of each window
START = 60  # steps before timing: warmup (10), baseline (20), the first stitched window's executor build


def _hook(tmp: str) -> StitchHook:
    env = {
        "STITCHFLEET_STATE_DIR": tmp,
        "STITCHFLEET_JOB_UID": "hook-step",
        "STITCHFLEET_BACKEND": "cpu",
        "STITCHFLEET_PROBE_STEPS": "0",  # every cluster on after the baseline: the stitched phase
        "STITCHFLEET_WARMUP_STEPS": "10",
        "STITCHFLEET_BASELINE_STEPS": "20",
        "STITCHFLEET_CHECK_FIRST": "1",
        "STITCHFLEET_CHECK_EVERY": "1000000",
        "STITCHFLEET_REBASELINE_EVERY": "1000000",
        "STITCHFLEET_WINDOW_STEPS": "20",
        "STITCHFLEET_JOB_STEPS": "100000",
        # the first stitched window holds the twin's executor build: the guard would revert on it
        "STITCHFLEET_SLOWDOWN_MARGIN": "100",
        "STITCHFLEET_CACHE_DIR": str(settings.current().cache_dir),
    }
    return StitchHook(settings.load(env), db_url=f"sqlite:///{Path(tmp) / 't.db'}")


def measure(steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per step of each session (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        hook = _hook(tmp)
        graph, loss, train_op, feeds = command._build(command.DIMS)
        with graph.as_default():
            hooked = tf.compat.v1.train.MonitoredSession(hooks=[hook])
        plain_graph, plain_loss, plain_train, plain_feeds = command._build(command.DIMS)
        with plain_graph.as_default():
            plain = tf.compat.v1.train.MonitoredSession()
        for _ in range(START):
            hooked.run([loss, train_op], feeds())
        controller = hook.controller
        if controller is None or controller.mode(hook.step) != STITCHED:
            raise SystemExit(f"the hooked job is not stitching at step {hook.step}: nothing to measure")
        raw, count = hooked._tf_sess(), len(hook.installed)
        on = {**feeds(), hook.switches: np.ones(count, bool)}

        def twin_raw() -> None:
            assert hook.diverter is not None
            hook.diverter.armed = True
            raw.run([loss, train_op], on)

        runs: dict[str, Callable[[], object]] = {
            "plain TF": lambda: plain.run([plain_loss, plain_train], plain_feeds()),
            "the job through the hook (stitched phase)": lambda: hooked.run([loss, train_op], feeds()),
            "the same twin, all on, run raw": twin_raw,
        }
        wall: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(rounds):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                for i in range(steps):
                    started, started_cpu = time.perf_counter(), time.process_time()
                    runs[name]()
                    if i >= SETTLE:
                        wall[name].append(time.perf_counter() - started)
                        cpu[name].append(time.process_time() - started_cpu)
        if controller.job_reverted or controller.mode(hook.step) != STITCHED:
            raise SystemExit(f"the hooked job left its stitched phase: {controller.job_reverted}")
        hooked.close()
        plain.close()
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in runs}


def main(argv: list[str]) -> int:
    steps = int(argv[0]) if argv else 12
    rounds = int(argv[1]) if len(argv) > 1 else 20
    if steps <= SETTLE or rounds < 1:
        print(f"usage: hook_step.py [steps > {SETTLE}] [rounds >= 1]", file=sys.stderr)
        return 2
    found = measure(steps, rounds)
    base_wall, base_cpu = found["plain TF"]
    for name, (wall, cpu) in found.items():
        print(
            f"{name:42s} wall {wall * 1e3:7.3f} ms ({wall / base_wall:.3f}x)  CPU {cpu * 1e3:7.3f} ms"
            f" ({cpu / base_cpu:.3f}x plain TF)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
