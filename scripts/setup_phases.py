"""Where a setup's seconds go on the demo model, cold (empty kernel cache) or warm, phase by phase.

Input: command-line arguments: runs per mode, the modes (alternated run by run: `cold`, an empty kernel cache;
`op`, a cache holding the native op only, as on a machine where another job set up before; `warm`, the cache a
first run of the same job filled) and where the
shim's prebuilt native op lies (`--op-dir DIR`; without it the op is built from source into the cache, as by
`stitchfleet demo` on a fresh cache). Output: on stdout, per run (a fresh Python process each, as a pod is): the
plain session's creation and first steps, then the plugin's: `begin` split into its phases (the conversion and
compile, the clusters' mapping, C generation and C compiler runs, the native op's build and load, the translation
check, the twin, the rewrite), the rest of session creation, and the first steps over the steady step (the twin's
executor builds); then the medians per mode and the load average. Phases run in threads (compiles overlap) are
summed over threads: their sum can exceed the wall of the phase that holds them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIRST_STEPS = 10  # the demo's warmup: the executor builds land in these
STEADY_STEPS = 20  # after them: the steady step the first ones are compared with


class Timers:
    """Seconds and calls per named function, summed over threads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Replaces `owner.attribute` (a module's function, as its callers look it up) by a timed call."""
        original: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                with self.lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + spent
                    self.calls[name] = self.calls.get(name, 0) + 1

        setattr(owner, attribute, timed)


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its finished children (the C compilers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _steps(session: Any, loss: Any, train_op: Any, feeds: Callable[[], Any], count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        session.run([loss, train_op], feeds())
        times.append(time.perf_counter() - started)
    return times


def child(cache_dir: str, state_dir: str, op_dir: str) -> dict[str, Any]:
    """A plain session of the demo model, then the plugin's, in this process (what a demo run pays)."""
    os.environ["STITCHFLEET_CACHE_DIR"] = cache_dir
    started = time.perf_counter()
    import tensorflow as tf

    from stitchfleet.compiler.targets.cpu import executable, source_cache
    from stitchfleet.demo import command
    from stitchfleet.plugin.native import dispatch_op
    from stitchfleet.plugin.session import hook as hook_module
    from stitchfleet.plugin.session import job_setup
    from stitchfleet.plugin.setup import job_graph, selection

    imported = time.perf_counter() - started
    dispatch_op.prebuilt_dirs = lambda: [Path(op_dir) / dispatch_op.PREBUILT_DIR] if op_dir else []
    timers = Timers()
    for owner, attribute, name in (
        (job_graph, "compiled", "convert + cluster + plan"),
        (selection, "choose", "choose (map + build every cluster)"),
        (selection, "_mapped", "  map onto TF"),
        (source_cache, "cluster_source", "  C generation"),
        (source_cache, "cached_source", "  C source (cache or generation)"),
        (executable, "_build", "  C compiler runs"),
        (executable, "load_library", "  kernel key + compile or cache + dlopen"),
        (dispatch_op, "_build", "native op C++ build"),
        (dispatch_op, "_load", "native op load"),
        (job_setup, "choose_bridge", "bridge (waits for the op build, loads it)"),
        (job_setup, "check_sites", "translation check"),
        (job_setup, "build_twin", "twin"),
        (job_setup, "rewire", "rewrite"),
    ):
        timers.wrap(owner, attribute, name)

    plain_graph, plain_loss, plain_train, plain_feeds = command._build(command.DIMS)
    with plain_graph.as_default():
        started, cpu = time.perf_counter(), _cpu()
        plain = tf.compat.v1.train.MonitoredSession()
        plain_created = time.perf_counter() - started
    plain_times = _steps(plain, plain_loss, plain_train, plain_feeds, FIRST_STEPS)
    plain_cpu = _cpu() - cpu  # creation and the first steps
    plain_times += _steps(plain, plain_loss, plain_train, plain_feeds, STEADY_STEPS)
    plain.close()

    settings = command.demo_settings(Path(state_dir), "cpu")  # length and step time unknown: setup runs
    graph, loss, train_op, feeds = command._build(command.DIMS)
    hook = hook_module.StitchHook(settings, db_url=f"sqlite:///{Path(state_dir) / 'telemetry.db'}")
    begin = hook.begin

    def timed_begin() -> None:
        began = time.perf_counter()
        begin()
        timers.seconds["begin"] = time.perf_counter() - began

    hook.begin = timed_begin  # type: ignore[method-assign]
    with graph.as_default():
        started, cpu = time.perf_counter(), _cpu()
        session = tf.compat.v1.train.MonitoredSession(hooks=[hook])
        created = time.perf_counter() - started
    times = _steps(session, loss, train_op, feeds, FIRST_STEPS)
    plugin_cpu = _cpu() - cpu
    times += _steps(session, loss, train_op, feeds, STEADY_STEPS)
    session.close()
    return {
        "imports": imported,
        "plain_created": plain_created,
        "plain_first": sum(plain_times[:FIRST_STEPS]),
        "plain_steady": statistics.median(plain_times[FIRST_STEPS:]),
        "created": created,
        "first": sum(times[:FIRST_STEPS]),
        "steady": statistics.median(times[FIRST_STEPS:]),
        "prebuild": hook.prebuild_seconds,
        "cpu": plugin_cpu - plain_cpu,  # CPU seconds of creation and first steps beyond plain TF's (background too)
        "seconds": timers.seconds,
        "calls": timers.calls,
        "installed": len(hook.installed),
    }


def _run_child(cache_dir: Path, env: dict[str, str], op_dir: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="setup-phases-state-") as state:
        command = [sys.executable, __file__, "--child", str(cache_dir), state, "--op-dir", op_dir]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _print(mode: str, got: dict[str, Any]) -> None:
    seconds, calls = got["seconds"], got["calls"]
    begin = seconds.get("begin", 0.0)
    extra = got["first"] - FIRST_STEPS * got["steady"]
    plain_extra = got["plain_first"] - FIRST_STEPS * got["plain_steady"]
    print(f"--- {mode}: {got['installed']} clusters installed; imports {got['imports']:.2f} s")
    print(f"  plain session: created {got['plain_created']:.2f} s, first {FIRST_STEPS} steps {plain_extra:+.2f} s")
    print(f"  plugin session: created {got['created']:.2f} s, of which begin {begin:.2f} s:")
    for name in seconds:
        if name != "begin":
            print(f"    {name:<45} {seconds[name]:6.2f} s  ({calls[name]} call(s))")
    print(
        f"  plugin's first {FIRST_STEPS} steps over its steady step: {extra:+.2f} s (warmup booked {got['prebuild']})"
    )
    fixed = got["created"] - got["plain_created"] + extra - plain_extra
    print(f"  setup beyond plain TF (creation + first steps): {fixed:.2f} s wall, {got['cpu']:.2f} s CPU")


def _fixed(got: dict[str, Any]) -> float:
    extra = got["first"] - FIRST_STEPS * got["steady"]
    plain_extra = got["plain_first"] - FIRST_STEPS * got["plain_steady"]
    return float(got["created"] - got["plain_created"] + extra - plain_extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per mode (alternated)")
    parser.add_argument("--modes", default="cold,op,warm", help="cold, op, warm (comma-separated)")
    parser.add_argument("--op-dir", default="", help="a shim dir holding ops/ (prebuilt op); empty: build it")
    parser.add_argument("--child", nargs=2, metavar=("CACHE_DIR", "STATE_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cache_dir, state_dir = args.child
        print(json.dumps(child(cache_dir, state_dir, args.op_dir)))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    modes = args.modes.split(",")
    fixed: dict[str, list[float]] = {mode: [] for mode in modes}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average before: {load} ({os.cpu_count()} cores); prebuilt op dir: {args.op_dir or 'none'}")
    with tempfile.TemporaryDirectory(prefix="setup-phases-warm-") as warm_dir:
        if "warm" in modes or "op" in modes:
            _run_child(Path(warm_dir), env, args.op_dir)  # fills the cache, as the job's first run does
        for _ in range(args.runs):
            for mode in modes:
                if mode in ("cold", "op"):
                    with tempfile.TemporaryDirectory(prefix="setup-phases-cold-") as cold_dir:
                        if mode == "op":  # the op library only, from the warm cache's folder of it
                            shutil.copytree(Path(warm_dir) / "tfop", Path(cold_dir) / "tfop")
                        got = _run_child(Path(cold_dir), env, args.op_dir)
                else:
                    got = _run_child(Path(warm_dir), env, args.op_dir)
                _print(mode, got)
                fixed[mode].append(_fixed(got))
    for mode in modes:
        print(f"median {mode}: setup beyond plain TF {statistics.median(fixed[mode]):.2f} s over {len(fixed[mode])}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after: {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
