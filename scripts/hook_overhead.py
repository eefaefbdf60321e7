"""Prints the StitchHook's per-step bookkeeping overhead (no checks, every switch off).

Input: none (small BERT encoder from stitchfleet/plugin/training_graphs.py, TF CPU). Output: on stdout, the
median step time without the hook and with it (all steps in the untouched warm-up phase,
so only the hook's own work differs: the switch feed, loss fetch, window bookkeeping and
decisions), and the mean time spent inside before_run + after_run. Run from the repository
root: PYTHONPATH=. python scripts/hook_overhead.py [steps]
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
from stitchfleet.plugin import training_graphs as models
from stitchfleet.plugin.hook import StitchHook
from tests.plugin.hook_harness import _feeds


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


def _steps(steps: int, hook: StitchHook | None) -> list[float]:
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        times = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
            for _ in range(steps):
                started = time.perf_counter()
                session.run([loss, train_op], feeds)
                times.append(time.perf_counter() - started)
    return times[20:]


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    with tempfile.TemporaryDirectory() as tmp:
        env = {"STITCHFLEET_STATE_DIR": tmp, "STITCHFLEET_JOB_UID": "overhead", "STITCHFLEET_WARMUP_STEPS": str(steps)}
        hook = _Timed(settings.load(env), backend="cpu", db_url=f"sqlite:///{Path(tmp) / 't.db'}")
        hook.spent = []
        plain = statistics.median(_steps(steps, None))
        hooked = statistics.median(_steps(steps, hook))
        inside = statistics.mean(hook.spent[20:])
    print(f"median step without hook: {plain * 1e3:.3f} ms")
    print(f"median step with hook (switches off, no checks): {hooked * 1e3:.3f} ms ({(hooked - plain) * 1e3:+.3f} ms)")
    print(f"mean time in before_run + after_run: {inside * 1e6:.1f} us per step")


if __name__ == "__main__":
    main()
