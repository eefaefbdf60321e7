"""Stitched step time by the loop size from which kernels use TF's worker threads (figures, not tests).

Input: the command line (the model: demo dims or a `bench_step` model name; hand-out thresholds in elements
touched, rounds, steps per window).
Output: a table on stdout: plain TF and the twin with every cluster on at each threshold, median wall and process
CPU per step, against plain TF. One process, windows interleaved round by round, the threshold set between windows
through the op library (`BridgeOp.pool_elements`, csrc/pool.h): what a machine's load moves, it moves for all.

    PYTHONPATH=. python scripts/bench_pool.py --dims 16 64 256 4 --thresholds 1099511627776 262144 32768
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
NEVER = 1 << 40  # a threshold no loop reaches: every loop on the op's thread


def measure(dims: dict[str, int], thresholds: list[int], rounds: int, steps: int, model: str = "demo") -> list[str]:
    """The table's lines (see the module docstring)."""
    from bench_step import _diverter, _hooked_session, _plain_session, _window  # the timing benchmark's sessions

    from stitchfleet import settings
    from stitchfleet.plugin.native import dispatch_op

    with tempfile.TemporaryDirectory() as tmp:
        session, hook, fetches, feeds = _hooked_session(dims, "native", tmp, model)
        plain, plain_fetches, plain_feeds = _plain_session(dims, model)
        bridge = dispatch_op.load(settings.current().cache_dir)  # the hook's: loaded once per process
        raw = session._tf_sess()  # the switches are fed directly: no schedule, no guard
        diverter = _diverter(hook)
        feed = {**feeds(), hook.switches: np.ones(len(hook.installed), bool)}

        def on() -> Any:
            diverter.armed = True  # what the hook does on a step with a cluster on
            return raw.run(fetches, feed)

        default = bridge.pool_elements()
        names: list[str | int] = ["plain TF", *thresholds]  # plain TF, then each hand-out threshold
        walls: dict[str | int, list[float]] = {name: [] for name in names}
        cpu: dict[str | int, list[float]] = {name: [] for name in names}
        backoffs = bridge.pool_backoffs()
        for r in range(rounds):
            print(f"  round {r + 1}/{rounds}", flush=True)
            # the order turns each round: a window's place in the round moved its median by ~5% (two identical
            # configurations differed by that much in a fixed order)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if isinstance(name, str):
                    walls[name] += _window(lambda: plain.run(plain_fetches, plain_feeds()), steps, cpu[name])
                    continue
                bridge.pool_elements(name)
                walls[name] += _window(on, steps, cpu[name])
        bridge.pool_elements(default)
        backoffs = bridge.pool_backoffs() - backoffs
        session.close()
        plain.close()
    base, base_cpu = statistics.median(walls["plain TF"]), statistics.median(cpu["plain TF"])
    lines = [
        f"Model {model if model != 'demo' else dims}, {rounds} rounds x {steps} steps; median ms per step"
        f" (default threshold {default}).",
        "",
        "| configuration | wall ms | vs plain TF | CPU ms | vs plain TF |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        label = name if isinstance(name, str) else f"all on, hand-out from {'never' if name >= NEVER else name}"
        wall, used = statistics.median(walls[name]), statistics.median(cpu[name])
        lines.append(f"| {label} | {wall * 1e3:.3f} | {wall / base:.3f}x | {used * 1e3:.3f} | {used / base_cpu:.3f}x |")
    lines += ["", f"hand-out turned off for a while {backoffs} times (a worker descheduled mid-block)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_pool.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs=4, default=[16, 64, 256, 4], metavar=("B", "S", "H", "HEADS"))
    parser.add_argument("--thresholds", type=int, nargs="+", default=[NEVER, 1 << 18, 1 << 15])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds over the configurations")
    parser.add_argument("--steps", type=int, default=6, help="steps per window (the first 2 untimed)")
    parser.add_argument("--model", default="demo", help="demo (--dims), an ab_jobs job, a corpus or Keras model")
    args = parser.parse_args(argv)
    dims = dict(zip(("batch", "seq", "hidden", "heads"), args.dims, strict=True))
    print("\n".join(measure(dims, args.thresholds, args.rounds, args.steps, args.model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
