"""The report's held-out check against the wall clock (figures, not a test): plugin runs, holdouts among them, and
plain processes.

Input: the command line: a job of `ab_jobs.py` (demo, mlp, transformer), its steps, the number of plugin runs, the
holdout share (STITCHFLEET_HOLDOUT_EVERY) and plain processes between them. Output: on stdout, each run as it ends,
then the wall clock's saving of the plugin's stitched runs against the plain processes (the mean plain wall x the
stitched runs less their walls, with its 95% interval from the plain walls' spread), the holdout runs' walls against
the plain processes' (a holdout stands for plain TF when they agree), and the weekly report's held-out check and
in-job claim for the same runs (telemetry/holdout.py) beside that clock.

A first run under the plugin, under another job name, fills the kernel cache, the node's record and the fleet's
memory (not counted); then plugin and plain runs alternate. Every run is its own process, as a user's job is.

    PYTHONPATH=. python scripts/holdout_check.py --job mlp --steps 6000 --runs 12 --every 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import idle_policy  # noqa: E402
from stitchfleet.telemetry.paired import t_quantile  # noqa: E402


@dataclass(frozen=True)
class Run:
    """One process of the job: its mode, its wall (the session's creation to its close), its steps' seconds."""

    mode: str  # plain, stitched (the plugin set up), holdout (the plugin held it out), or skipped (anything else)
    wall: float
    steps: int
    uid: str = ""


@dataclass(frozen=True)
class Clock:
    """What the wall clock says the stitched runs saved against the plain processes, with a 95% interval."""

    saved: float
    half_width: float | None  # None with fewer than two plain processes
    plain_mean: float
    plain_sd: float


def clock_saving(plain: Sequence[float], stitched: Sequence[float]) -> Clock:
    """The stitched runs' walls against the plain processes' mean wall: sum of (mean - wall), and the interval of
    that sum as a prediction (the mean's error plus each stitched run's own deviation, both from the plain spread)."""
    mean = statistics.fmean(plain)
    saved = sum(mean - wall for wall in stitched)
    if len(plain) < 2:
        return Clock(saved, None, mean, 0.0)
    sd = statistics.stdev(plain)
    n = len(stitched)
    return Clock(saved, t_quantile(len(plain) - 1) * sd * math.sqrt(n * n / len(plain) + n), mean, sd)


def _child(args: argparse.Namespace) -> None:
    """One run of the job in this process: its wall and steps; its mode read back from its telemetry."""
    import ab_jobs
    import tensorflow as tf

    from stitchfleet import settings
    from stitchfleet.plugin.session.hook import StitchHook

    hook = None
    if args.child == "plugin":
        env = {**os.environ, "STITCHFLEET_STATE_DIR": args.state, "STITCHFLEET_JOB_NAME": args.name}
        hook = StitchHook(settings.load({**env, "STITCHFLEET_JOB_UID": args.uid}), db_url=args.url)
    graph, fetches, feeds, hooks = ab_jobs._job_parts(args.job, args.steps, hook)
    steps = 0
    began = time.perf_counter()
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
        while not session.should_stop():
            session.run(fetches, feeds)
            steps += 1
    wall = time.perf_counter() - began
    Path(args.out).write_text(json.dumps({"wall": wall, "steps": steps}))


def _mode(url: str, uid: str, spool: Path) -> str:
    """A plugin run's mode from its telemetry: holdout (its setup event says so), stitched (a stitched window) or
    skipped."""
    import sqlalchemy as sa

    from stitchfleet.telemetry import spool_ingest
    from stitchfleet.telemetry.kinds import HOLDOUT_REASON

    spool_ingest.claim(spool, url)  # rows a run spooled (a skipped setup's) go into the database first
    job = "(select id from jobs where job_uid = :uid)"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            held = connection.execute(
                sa.text(f"select count(*) from events where job_id in {job} and reason = :reason"),
                {"uid": uid, "reason": HOLDOUT_REASON},
            ).scalar()
            stitched = connection.execute(
                sa.text(f"select count(*) from step_windows where job_id in {job} and mode = 'stitched'"), {"uid": uid}
            ).scalar()
    finally:
        engine.dispose()
    return "holdout" if held else "stitched" if stitched else "skipped"


def _run(mode: str, args: argparse.Namespace, folders: dict[str, str], name: str) -> Run:
    """One child process, its figures."""
    uid = f"holdout-{mode}-{time.time_ns()}"
    url = f"sqlite:///{Path(folders['fleet']) / 'telemetry.db'}"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", mode, "--job", args.job, "--steps", str(args.steps)]
        command += ["--state", folders["state"], "--url", url, "--name", name, "--uid", uid, "--out", out.name]
        env = {
            **os.environ,
            "STITCHFLEET_CACHE_DIR": folders["cache"],
            "STITCHFLEET_HOLDOUT_EVERY": str(args.every),
            "PYTHONPATH": str(ROOT),
        }
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found: dict[str, Any] = json.loads(Path(out.name).read_text())
    kind = _mode(url, uid, Path(folders["state"]) / "spool") if mode == "plugin" else "plain"
    return Run(kind, float(found["wall"]), int(found["steps"]), uid)


def _report(url: str, name: str, device_kind: str = "cpu") -> list[str]:
    """The weekly report's held-out check and in-job claim for the job, as lines."""
    from stitchfleet.telemetry import savings
    from stitchfleet.telemetry.weeks import week_of

    report = savings.weekly_summary(url, week_of(dt.datetime.now(dt.UTC)))
    checks = [c for c in report.held_out if c.job_name == name and c.device_kind == device_kind]
    if not checks:
        return [f"the report holds no held-out check for {name} this week"]
    check = checks[0]
    # the report's hours back to the wall's seconds: hours x 3600 are device-seconds (a CPU task's devices per rank
    # are its usable cores), over the devices per rank of the job's tasks
    devices = {task.devices_per_rank for task in (*report.jobs, *report.bottom) if task.job_name == name}
    if len(devices) != 1:
        return [f"the job's tasks do not share one devices-per-rank figure ({sorted(devices)}): not converted"]
    per = 3600.0 / devices.pop()

    def said(hours: float) -> str:
        return f"{hours * per:+.2f} s"

    after = report.net_after_check(device_kind)
    return [
        f"the report's held-out check: {check.holdout_runs} holdouts at {check.plain_step_seconds * 1e3:.3f} ms a step"
        f" (sd {check.plain_step_sd * 1e3:.3f}), {check.stitched_runs} stitched runs at"
        f" {check.stitched_step_seconds * 1e3:.3f} ms; saving between runs {said(check.saving_hours)}"
        f" ({said(check.low_hours)} to {said(check.high_hours)})",
        f"the report in-job: claim {said(check.claimed_hours)}, net {said(check.in_job_net_hours)}"
        f" ({check.verdict} the interval); net after the check {said(after.after_check_hours)}"
        f" of the week's {said(after.net_hours)}, the cold run's included (seconds of a rank's wall)",
    ]


def summary(runs: Sequence[Run]) -> list[str]:
    """The clock's lines: plain, holdout and stitched walls, the stitched runs' saving with its interval."""
    by = {mode: [r.wall for r in runs if r.mode == mode] for mode in ("plain", "holdout", "stitched", "skipped")}
    lines = [
        f"{mode}: {len(walls)} runs, wall {statistics.fmean(walls):.2f} s"
        + (f" (sd {statistics.stdev(walls):.2f} s)" if len(walls) > 1 else "")
        for mode, walls in by.items()
        if walls
    ]
    if by["plain"] and by["stitched"]:
        clock = clock_saving(by["plain"], by["stitched"])
        within = f" +- {clock.half_width:.2f} s" if clock.half_width is not None else ""
        lines.append(f"the clock: the stitched runs saved {clock.saved:+.2f} s{within} against the plain processes")
    if len(by["plain"]) > 1 and len(by["holdout"]) > 1:
        gap = statistics.fmean(by["holdout"]) - statistics.fmean(by["plain"])
        noise = math.hypot(
            statistics.stdev(by["plain"]) / math.sqrt(len(by["plain"])),
            statistics.stdev(by["holdout"]) / math.sqrt(len(by["holdout"])),
        )
        lines.append(f"holdout walls minus plain walls: {gap:+.2f} s (standard error {noise:.2f} s)")
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="mlp", choices=("demo", "mlp", "transformer"))
    parser.add_argument("--steps", type=int, default=6000, help="each run's steps (its StopAtStepHook)")
    parser.add_argument("--runs", type=int, default=12, help="plugin runs after the first (cold) one")
    parser.add_argument("--every", type=int, default=4, help="STITCHFLEET_HOLDOUT_EVERY for the plugin runs")
    parser.add_argument("--plain", type=int, default=6, help="plain processes, spread between the plugin runs")
    parser.add_argument("--keep", type=Path, help="keep the runs' state, cache and telemetry database in DIR (new)")
    for hidden in ("--child", "--state", "--url", "--name", "--uid", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        args.steps = int(args.steps)
        _child(args)
        return 0
    if args.steps < 1 or args.runs < 1 or args.every < 0 or args.plain < 0:
        raise SystemExit("holdout_check: --steps and --runs must be at least 1, --every and --plain at least 0")
    name = f"holdout-{args.job}"
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="holdout-check-") as scratch:
        tmp = str(args.keep) if args.keep is not None else scratch
        folders = {key: str(Path(tmp) / key) for key in ("state", "fleet", "cache")}
        for folder in folders.values():
            Path(folder).mkdir(parents=True)
        started = time.perf_counter()
        print(f"{args.job}, {args.steps} steps a run; the machine's {idle_policy.read().describe()}", flush=True)
        print("a cold run fills the kernel cache, the node's record and the fleet's memory (not counted)", flush=True)
        _run("plugin", args, folders, f"{name}-cold")
        # plain processes spread evenly among the plugin runs, so that a drift of the machine hits both
        order = sorted(
            [((k + 0.5) / args.runs, "plugin") for k in range(args.runs)]
            + [((k + 0.5) / args.plain, "plain") for k in range(args.plain)]
        )
        for _, mode in order:
            found = _run(mode, args, folders, name)
            runs.append(found)
            print(f"{found.mode} ({time.perf_counter() - started:.0f} s): wall {found.wall:.2f} s", flush=True)
        print("\n".join(summary(runs)))
        print("\n".join(_report(f"sqlite:///{Path(folders['fleet']) / 'telemetry.db'}", name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
