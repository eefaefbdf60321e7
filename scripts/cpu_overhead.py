"""Where the time of a stitched step goes: the demo model with the plugin, measured per layer.

Input: none (the demo's BERT-like encoder, `stitchfleet.demo.command.DIMS`, or the dims given
as `batch seq hidden heads` arguments; TF CPU, `cpu` backend). Output: on stdout, the median
step time of baseline windows (every switch off) and stitched windows, interleaved (20 steps
each, no reverts, no checks), and per stitched step the time spent inside the clusters' C
functions, inside `ClusterKernel.__call__` (bridge: argument checks, output allocation,
finiteness check) and the rest (tf.numpy_function and its Python/GIL round trip, cond). Run
from the repository root: PYTHONPATH=. python scripts/cpu_overhead.py [steps] [batch seq hidden heads]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf

from stitchfleet import settings
from stitchfleet.demo import command
from stitchfleet.plugin.native.kernels import ClusterKernel
from stitchfleet.plugin.session.hook import StitchHook

WINDOW = 20


class _Clock:
    def __init__(self) -> None:
        self.kernel = 0.0
        self.native = 0.0

    def wrap_native(self, run: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(*args)
            finally:
                self.native += time.perf_counter() - started

        return timed


def _instrument(hook: StitchHook, clock: _Clock) -> None:
    class Timed(ClusterKernel):
        def __call__(self, *arrays: Any) -> Any:
            started = time.perf_counter()
            try:
                return super().__call__(*arrays)
            finally:
                clock.kernel += time.perf_counter() - started

    for cluster, _ in hook.installed:
        kernel = cluster.kernel
        kernel.__class__ = Timed
        executable = kernel.executable
        fn = getattr(executable, "_fn", None)
        if fn is not None:  # the cpu executable: time its C function alone
            executable._fn = clock.wrap_native(fn)  # type: ignore[union-attr]


def measure(steps: int, dims: dict[str, int]) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "STITCHFLEET_STATE_DIR": tmp,
            "STITCHFLEET_JOB_UID": "cpu-overhead",
            "STITCHFLEET_BACKEND": "cpu",
            "STITCHFLEET_BRIDGE": "python",  # the per-call split below times the Python path
            "STITCHFLEET_PROBE_STEPS": "0",  # every cluster on in stitched windows (no per-cluster probe)
            "STITCHFLEET_WARMUP_STEPS": str(WINDOW),
            "STITCHFLEET_BASELINE_STEPS": str(WINDOW),
            "STITCHFLEET_REBASELINE_EVERY": str(2 * WINDOW),
            "STITCHFLEET_WINDOW_STEPS": str(WINDOW),
            "STITCHFLEET_CHECK_EVERY": str(10 * steps),
            "STITCHFLEET_CHECK_FIRST": "0",
            "STITCHFLEET_SLOWDOWN_MARGIN": "1000",
            "STITCHFLEET_CACHE_DIR": str(settings.current().cache_dir),
        }
        graph, loss, train_op, feeds = command._build(dims)
        hook = StitchHook(settings.load(env), db_url=f"sqlite:///{Path(tmp) / 't.db'}")
        out: dict[str, list[float]] = {"baseline": [], "stitched": [], "kernel": [], "native": []}
        clock = _Clock()
        with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            _instrument(hook, clock)
            assert hook.controller is not None
            for step in range(steps):
                mode = hook.controller.mode(step)
                clock.kernel = clock.native = 0.0
                started = time.perf_counter()
                session.run([loss, train_op], feeds())
                seconds = time.perf_counter() - started
                if mode in out and step % WINDOW >= 2:  # the first steps of a window settle the pools
                    out[mode].append(seconds)
                    if mode == "stitched":
                        out["kernel"].append(clock.kernel)
                        out["native"].append(clock.native)
        print(f"clusters stitched: {len(hook.installed)}, left off: {len(hook.off)}")
    return out


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    dims = dict(command.DIMS)
    if len(sys.argv) > 5:
        dims = dict(zip(("batch", "seq", "hidden", "heads"), map(int, sys.argv[2:6]), strict=True))
    out = measure(steps, dims)
    base, stitched = statistics.median(out["baseline"]), statistics.median(out["stitched"])
    kernel, native = statistics.median(out["kernel"]), statistics.median(out["native"])
    print(f"dims {dims}, {steps} steps, medians over interleaved {WINDOW}-step windows")
    print(f"baseline step:  {base * 1e3:8.3f} ms")
    print(f"stitched step:  {stitched * 1e3:8.3f} ms  ({base / stitched:.2f}x)")
    print(f"  in C functions:             {native * 1e3:8.3f} ms")
    print(f"  in ClusterKernel, not C:    {(kernel - native) * 1e3:8.3f} ms")
    print(f"  outside (TF, numpy_function, cond, unstitched ops): {(stitched - kernel) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
