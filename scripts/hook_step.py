"""What the stitched step of a job costs through the hook, against the same twin run raw and plain TF (figures).

Input: the command line (steps per window, rounds). Output: on stdout, median wall and process CPU time per
step of three sessions of the demo model in one process, windows alternated (order reversed every round): plain
TF (a MonitoredSession with an empty hook, timed as the plugin's is), the hooked job in its stitched phase (every
cluster on, probes off, run through `MonitoredSession.run` as a job runs it: the hook's per-step work included),
and the same twin with every cluster on run on the raw session (the hook's Python left out). The difference
between the last two is what the hook's per-step work costs a stitched step. Also the mean and median time spent
inside the hook's before_run + after_run per stitched step (wall and thread CPU): the mean includes the steps
that close a telemetry window (every STITCHFLEET_WINDOW_STEPS steps: 20 here unless the environment says, 100 by
default in a job), which a median of steps leaves out; beside them the same figures of the empty hook on plain
TF's steps (the clock's own cost and two calls into a hook after a step), and the plugin's mean less the empty
hook's. The hooked job has a cache of its own: a record in the user's could skip its setup.

    PYTHONPATH=. python scripts/hook_step.py 12 30
    PYTHONPATH=. python scripts/hook_step.py 12 30 off   # the same once stitching is off for the job
    STITCHFLEET_WINDOW_STEPS=100 PYTHONPATH=. python scripts/hook_step.py 12 30 off   # the default windows

`off`: the job is reverted (`Controller._revert_job`, as its slowdown guard does) before timing, so every timed
hooked step is one the hook only times and counts: the hook's cost once stitching is off (issue 29 item 6).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import command
from stitchfleet.plugin.control.schedule import STITCHED
from stitchfleet.plugin.session.hook import StitchHook

SETTLE = 2  # untimed steps at the start of each window
START = 60  # steps before timing: warmup (10), baseline (20), the first stitched window's executor build


class _Clock:
    """Times a hook's two calls per step (when `timing`): what `super()`'s before_run and after_run take."""

    timing = False
    inside: list[tuple[float, float]]

    def before_run(self, run_context: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        args = super().before_run(run_context)  # type: ignore[misc]
        if self.timing:
            self.inside.append((time.perf_counter() - wall, time.thread_time() - cpu))
        return args

    def after_run(self, run_context: Any, run_values: Any) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        super().after_run(run_context, run_values)  # type: ignore[misc]
        if self.timing:
            before_wall, before_cpu = self.inside[-1]
            self.inside[-1] = (before_wall + time.perf_counter() - wall, before_cpu + time.thread_time() - cpu)


class _Timed(_Clock, StitchHook):
    """The plugin's hook, timed."""


class _Floor(_Clock, tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """A hook that does nothing, timed the same way on plain TF's session: what the clock itself and two calls into
    a hook read, right after a step with cold caches (~14 us on the demo model). Inside less this is the hook's own."""


def _hook(tmp: str) -> _Timed:
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
        "STITCHFLEET_WINDOW_STEPS": os.environ.get("STITCHFLEET_WINDOW_STEPS", "20"),
        "STITCHFLEET_JOB_STEPS": "100000",
        # the first stitched window holds the twin's executor build: the guard would revert on it
        "STITCHFLEET_SLOWDOWN_MARGIN": "100",
        # its own cache: an earlier run's record in the user's could skip the setup ("its last run ... slower")
        "STITCHFLEET_CACHE_DIR": str(Path(tmp) / "cache"),
    }
    hook = _Timed(settings.load(env), db_url=f"sqlite:///{Path(tmp) / 't.db'}")
    hook.inside = []
    return hook


def measure(
    steps: int, rounds: int, off: bool = False
) -> tuple[dict[str, tuple[float, float, float, float]], list[tuple[float, float]], list[tuple[float, float]]]:
    """Per session (median wall, median CPU, mean wall, mean CPU) seconds per step, per hooked step the (wall,
    thread CPU) seconds inside the hook, and per plain step those inside an empty hook (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        hook = _hook(tmp)
        graph, loss, train_op, feeds = command._build(command.DIMS)
        with graph.as_default():
            hooked = tf.compat.v1.train.MonitoredSession(hooks=[hook])
        plain_graph, plain_loss, plain_train, plain_feeds = command._build(command.DIMS)
        floor = _Floor()
        floor.inside = []
        with plain_graph.as_default():
            plain = tf.compat.v1.train.MonitoredSession(hooks=[floor])
        for _ in range(START):
            hooked.run([loss, train_op], feeds())
        controller = hook.controller
        if controller is None or controller.mode(hook.step) != STITCHED:
            raise SystemExit(f"the hooked job is not stitching at step {hook.step}: nothing to measure")
        if off:
            controller._revert_job(hook.step, "measurement", "hook_step.py off: the hook's cost once stitching is off")
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
        hook.timing = floor.timing = True
        for r in range(rounds):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                for i in range(steps):
                    started, started_cpu = time.perf_counter(), time.process_time()
                    runs[name]()
                    if i >= SETTLE:
                        wall[name].append(time.perf_counter() - started)
                        cpu[name].append(time.process_time() - started_cpu)
        if not off and (controller.job_reverted or controller.mode(hook.step) != STITCHED):
            raise SystemExit(f"the hooked job left its stitched phase: {controller.job_reverted}")
        hooked.close()
        plain.close()
    found = {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in runs}
    means = {name: (statistics.mean(wall[name]), statistics.mean(cpu[name])) for name in runs}
    return {name: (*found[name], *means[name]) for name in runs}, hook.inside, floor.inside


def main(argv: list[str]) -> int:
    steps = int(argv[0]) if argv else 12
    rounds = int(argv[1]) if len(argv) > 1 else 20
    off = len(argv) > 2 and argv[2] == "off"
    if steps <= SETTLE or rounds < 1 or (len(argv) > 2 and not off):
        print(f"usage: hook_step.py [steps > {SETTLE}] [rounds >= 1] [off]", file=sys.stderr)
        return 2
    found, inside, empty = measure(steps, rounds, off)
    base_wall, base_cpu, base_mean_wall, base_mean_cpu = found["plain TF"]
    for name, (wall, cpu, mean_wall, mean_cpu) in found.items():
        print(
            f"{name:42s} median wall {wall * 1e3:7.3f} ms ({wall / base_wall:.3f}x)  CPU {cpu * 1e3:7.3f} ms"
            f" ({cpu / base_cpu:.3f}x plain TF); mean wall {mean_wall * 1e3:7.3f} ms"
            f" ({mean_wall / base_mean_wall:.3f}x)  CPU {mean_cpu * 1e3:7.3f} ms ({mean_cpu / base_mean_cpu:.3f}x)"
        )
    hooked = f"the hook, {len(inside)} {'quiet' if off else 'stitched'} steps"
    for what, timed in ((hooked, inside), (f"an empty hook, {len(empty)} plain TF steps", empty)):
        walls, cpus = [w for w, _ in timed], [c for _, c in timed]
        print(
            f"inside before_run + after_run, {what}: wall mean {statistics.mean(walls) * 1e6:.1f} us"
            f" median {statistics.median(walls) * 1e6:.1f} us max {max(walls) * 1e6:.0f} us; thread CPU mean"
            f" {statistics.mean(cpus) * 1e6:.1f} us median {statistics.median(cpus) * 1e6:.1f} us"
        )
    own = statistics.mean(w for w, _ in inside) - statistics.mean(w for w, _ in empty)
    print(f"the hook's own, mean, less the empty hook's: {own * 1e6:.1f} us, {own / 2e-3:.1%} of a 2 ms step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
