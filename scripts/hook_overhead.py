"""Prints what the StitchHook costs a step where nothing is stitched, against plain TF in the same process.

Input: none (small BERT encoder from stitchfleet/demo/models.py, TF CPU); optional
arguments: steps per window and rounds. Output: on stdout, median step times, interleaved window
by window over the rounds, of four sessions of the same model: plain TF (no hook), twice (their
difference is the measurement's noise); the hook in
its warmup phase (every step runs the user's graph; the hook adds its bookkeeping: the loss
fetch, the window bookkeeping and decisions); and the hook once stitching is over for the job
(`Controller.done`: as after probes that kept nothing, or a revert; the hook adds nothing to the
step and only times and counts it). Also the mean time spent inside before_run + after_run.
Run from the repository root: PYTHONPATH=. python scripts/hook_overhead.py [steps] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import models
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import _feeds

SETTLE = 5  # untimed steps at the start of each window


class _Timed(StitchHook):
    spent: list[float]

    def before_run(self, run_context: Any) -> Any:
        started = time.perf_counter()
        args = super().before_run(run_context)
        self.spent.append(time.perf_counter() - started)
        return args

    def after_run(self, run_context: Any, run_values: Any) -> None:
        started = time.perf_counter()
        super().after_run(run_context, run_values)
        self.spent[-1] += time.perf_counter() - started


def _session(hook: StitchHook | None) -> tuple[Any, Any, Any]:
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        fetches = [graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")]
        session = tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else [])
        return session, fetches, _feeds(graph)


def _hook(tmp: str, name: str) -> _Timed:
    env = {"STITCHFLEET_STATE_DIR": f"{tmp}/{name}", "STITCHFLEET_JOB_UID": f"overhead-{name}"}
    env["STITCHFLEET_WARMUP_STEPS"] = "100000000"  # stays in warmup: every step runs the user's graph
    hook = _Timed(settings.load(env), backend="cpu", db_url=f"sqlite:///{Path(tmp) / f'{name}.db'}")
    hook.spent = []
    return hook


def _window(session: Any, fetches: Any, feeds: Any, steps: int) -> list[float]:
    times = []
    for i in range(steps):
        started = time.perf_counter()
        session.run(fetches, feeds)
        if i >= SETTLE:
            times.append(time.perf_counter() - started)
    return times


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with tempfile.TemporaryDirectory() as tmp:
        warm, done = _hook(tmp, "warmup"), _hook(tmp, "done")
        sessions = {
            "plain TF": _session(None),
            "plain TF, 2nd session": _session(None),  # what two identical sessions differ by: the noise
            "hook, warmup": _session(warm),
            "hook, stitching over": _session(done),
        }
        assert done.controller is not None, "the model has no stitched cluster: nothing to measure"
        done.controller.stitching_off = "benchmark: as a job whose probes kept no cluster"
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for r in range(rounds):
            print(f"  round {r + 1}/{rounds}", flush=True)
            for name, (session, fetches, feeds) in sessions.items():
                times[name] += _window(session, fetches, feeds, steps)
        inside = {name: statistics.mean(hook.spent[SETTLE:]) for name, hook in (("warmup", warm), ("done", done))}
        for session, _, _ in sessions.values():
            session.close()
    plain = statistics.median(times["plain TF"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:22s} median {median * 1e3:.3f} ms ({(median - plain) / plain * 100:+.2f}% vs plain TF)")
    warmup, over = inside["warmup"] * 1e6, inside["done"] * 1e6
    print(f"mean time in before_run + after_run: warmup {warmup:.1f} us, stitching over {over:.1f} us")


if __name__ == "__main__":
    main()
