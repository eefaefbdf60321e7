"""Prints the report's saving on the demo job against plain TF's steps run beside it, finely alternated.

Input: optional arguments: the job's steps (default 3000) and the plain steps per chunk (at least 20, default 25);
--no-probe: no probe phase (STITCHFLEET_PROBE_STEPS=0: every cluster kept from the start), so the stitched windows
are measured where the probes would turn stitching off (the demo's group probe does on a loaded 2-core machine).
Output: on stdout, over the stitched windows' steps: the clock's saving (each chunk's plain TF mean step minus the
hooked job's steps, its wall and its own timer), the windows' measured saving as booked (`step_windows`: the blocks'
mean, the plugin's own work charged), and what the former rule booked on the same steps (the blocks' median, no
own work); and the plugin overhead the job books beside them (its own work on the steps no saving pays,
`plugin_cost.PluginCost`); and the hooked job's baseline steps against plain TF's beside them (a block's first step
after a stitched window apart), which the booked saving takes to stand for plain TF. The hooked job runs until just
after a baseline block, then plain TF as many steps, so the two share the machine's load within ~0.2 s. Run from the
repository root:
PYTHONPATH=. python scripts/savings_bias.py
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from stitchfleet.demo import command
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.plugin_cost import PluginCost
from stitchfleet.plugin.control.schedule import BASELINE, STITCHED
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.telemetry import paired

START = 400  # the hooked job's first steps (warmup, probes) before the alternation starts


def _step(job: command.Job) -> float:
    started = time.perf_counter()
    job.session.run([job.loss, job.train_op], job.feeds())
    return time.perf_counter() - started


def _median_rule(booked: list[tuple[int, str, float, bool, float]]) -> float:
    """The former rule on the same steps: each stitched run against the median of the blocks beside it, whose
    timed steps pool, the plugin's own work left out."""
    runs: list[tuple[str, list[tuple[float, bool]]]] = []
    for _, mode, seconds, timed, _ in booked:
        if runs and runs[-1][0] == mode:
            runs[-1][1].append((seconds, timed))
        else:
            runs.append((mode, [(seconds, timed)]))
    saved = 0.0
    for i, (mode, steps) in enumerate(runs):
        if mode != STITCHED or i == 0 or runs[i - 1][0] != BASELINE:
            continue
        after = runs[i + 1][1] if i + 1 < len(runs) and runs[i + 1][0] == BASELINE else []
        base = statistics.median(s for s, timed in runs[i - 1][1] + after if timed)
        saved += sum(base - s for s, _ in steps)
    return saved


def main(steps: int, chunk: int, *, probe: bool = True) -> None:
    directory = Path(tempfile.mkdtemp())
    plain = command.Job(None)
    plain.run(range(0, 50), 1000, [])
    current = command.demo_settings(directory, "cpu", steps, 0.0)
    current = current if probe else dataclasses.replace(current, probe_steps=0)
    hook = StitchHook(current, db_url=f"sqlite:///{directory / 't.db'}")
    hooked = command.Job(hook)
    hooked.run(range(0, 1), 1000, [])
    controller = hook.controller
    assert controller is not None, "the demo job set up"
    booked: list[tuple[int, str, float, bool, float]] = []  # step, mode, seconds, timed, own
    timed = controller.timed

    def recorded(step: int, seconds: float, checked: bool, *args: Any, own: float = 0.0, **kwargs: Any) -> None:
        booked.append((step, controller.mode(step), seconds, not checked, own))
        timed(step, seconds, checked, *args, own=own, **kwargs)

    controller.timed = recorded  # type: ignore[method-assign]
    rows: list[dict[str, Any]] = []
    window = controller.ledger.window

    def row(**fields: Any) -> None:
        rows.append(fields)
        window(**fields)

    controller.ledger.window = row  # type: ignore[method-assign]
    hooked.run(range(1, START), 1000, [])
    walls: dict[int, float] = {}
    plain_mean: dict[int, float] = {}
    step = START
    while step < steps:
        first = step
        while step < steps and (step - first < chunk or controller.mode(step - 1) == BASELINE):
            walls[step] = _step(hooked)
            step += 1
        mean = statistics.fmean(_step(plain) for _ in range(step - first))
        plain_mean.update(dict.fromkeys(range(first, step), mean))
    hooked.close()  # the job's last windows
    plain.close()
    _report(controller, chunk, [b for b in booked if b[0] >= START], [r for r in rows if r["first_step"] >= START])
    _clock(walls, plain_mean, booked)
    cost = PluginCost.of(controller)
    print(f"  plugin overhead booked (own work on steps no saving pays, the whole job): {cost.overhead:.3f} s", end="")
    print(f" of {cost.own:.3f} s own work ({cost.charged:.3f} s paid in the windows' savings)")


def _report(
    controller: Controller, chunk: int, found: list[tuple[int, str, float, bool, float]], kept: list[Any]
) -> None:
    """The booked saving with its interval, and the former rule's, on the windows from START."""
    window_steps = {s for s, mode, *_ in found if mode == STITCHED}
    own = {s: o for s, *_, o in found}
    saved = sum(r["saved_seconds"] for r in kept if r["mode"] == STITCHED)
    sums = paired.PairedSums.windows(
        (r["mode"], r["iterations"], r["step_seconds_sum"], r["baseline_step_seconds"], r["saved_seconds"])
        for r in kept
    )
    interval = paired.claim(sums, saved)
    print(f"{len(window_steps)} stitched steps from step {START}, plain TF in chunks of {chunk}+ steps beside them:")
    if not window_steps:
        print(f"  stitching off: {controller.stitching_off or controller.job_reverted}")
        return
    charged = sum(own[s] for s in window_steps)
    print(f"  booked (blocks' mean, own work charged: {charged:.3f} s): {saved:+.3f} s")
    print(f"    95% interval {interval.low:+.3f} to {interval.high:+.3f} s (`telemetry.paired`)")
    print(f"  the former rule (blocks' median, no own work): {_median_rule(found):+.3f} s")


def _clock(walls: dict[int, float], plain_mean: dict[int, float], booked: list[Any]) -> None:
    """Plain TF's steps beside the stitched windows' steps minus theirs: wall, and their timed runs only."""
    window_steps = [s for s, mode, *_ in booked if mode == STITCHED and s in walls]
    if window_steps:
        inner = {s: seconds for s, _, seconds, *_ in booked}
        clock = sum(plain_mean[s] - walls[s] for s in window_steps)
        on_timer = sum(plain_mean[s] - inner[s] for s in window_steps)
        print(f"  clock: plain TF minus the hooked job's wall {clock:+.3f} s; minus its timed runs {on_timer:+.3f} s")
    # The booked saving holds only if the baseline blocks cost what plain TF does: their steps against plain TF's
    # beside them, the block's first step after a stitched window (the switch) apart from the rest.
    modes = {s: mode for s, mode, *_ in booked}
    for name, before in (("switch", STITCHED), ("settled", BASELINE)):
        steps = [s for s in walls if modes.get(s) == BASELINE and modes.get(s - 1) == before]
        if steps:
            own = statistics.fmean(walls[s] for s in steps) * 1e3
            beside = statistics.fmean(plain_mean[s] for s in steps) * 1e3
            print(f"  baseline steps, {name} ({len(steps)}): {own:.3f} ms against plain TF's {beside:.3f} ms beside")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=3000)
    parser.add_argument("chunk", nargs="?", type=int, default=25)
    parser.add_argument("--no-probe", action="store_true", help="no probe phase: every cluster kept from the start")
    args = parser.parse_args()
    main(args.steps, args.chunk, probe=not args.no_probe)
