"""The report's saving against the clock between processes, over many alternated pairs (figures, not a test).

Input: the command line: a job of `ab_jobs.py` (demo, mlp, transformer), its steps, the number of pairs. Output: on
stdout, per pair and over all pairs: the report's measured gross over the warm run's stitched windows (each window's
paired reference x its steps minus its steps' seconds, as `step_windows` books them) against the clock on the same
step numbers (the plain process's seconds at those steps minus the warm process's), and the warm run's settled
baseline steps (a block's steps after SETTLE_STEPS) against the plain process's median step; their mean over the
pairs with its standard error. That mean is a bias which a two-round A/B (`ab_jobs.py`) cannot tell from the noise
between two processes: on this 2-core VM plain processes of the MLP ran 1.11-1.54 ms a step in one sitting.

Each run is its own process, as a user's job is; a first warm-up run (cold, not counted) fills the kernel cache the
warm runs share, and the pairs alternate which of their two runs goes first. --record FILE appends each pair's
figures as one JSON line.

    PYTHONPATH=. python scripts/claim_pairs.py --job mlp --steps 6000 --pairs 30
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchmarks import idle_policy  # noqa: E402
from stitchfleet.plugin.control.step_windows import SETTLE_STEPS  # noqa: E402

# A window as the child reads it back from the telemetry database: mode, first and last step, steps, their seconds,
# and the paired reference step (None where a window has none)
Window = tuple[str, int, int, int, float, float | None]


@dataclass(frozen=True)
class Pair:
    """One plain process against one warm one: seconds over the warm run's stitched windows' steps."""

    report: float  # the report's measured gross: sum of (reference x steps - the steps' seconds)
    clock: float  # the plain process's seconds at the same step numbers minus the warm process's
    settled: float  # the warm run's settled baseline steps' median over the plain process's median step
    steps: int  # stitched steps compared

    @property
    def gap(self) -> float:
        return self.report - self.clock


def compare(plain: Sequence[float], warm: Sequence[float], windows: Sequence[Window]) -> Pair | None:
    """The pair's figures, or None when the warm run has no stitched window with a reference (its setup skipped, or
    stitching went off before one), or the runs differ in length."""
    stitched = [w for w in windows if w[0] == "stitched" and w[5]]
    if not stitched or len(plain) != len(warm):
        return None
    report = sum(float(w[5] or 0.0) * w[3] - w[4] for w in stitched)
    clock = sum(plain[k] - warm[k] for w in stitched for k in range(w[1], w[2] + 1))
    blocks = [w for w in windows if w[0] == "baseline" and w[3] > SETTLE_STEPS]
    settled = [warm[k] for w in blocks for k in range(w[1] + SETTLE_STEPS, w[2] + 1)]
    ratio = statistics.median(settled) / statistics.median(plain[len(plain) // 2 :]) if settled else math.nan
    return Pair(report, clock, ratio, sum(w[3] for w in stitched))


def summary(pairs: Sequence[Pair]) -> list[str]:
    """The lines that close the run: the gap's mean, standard error and median, and the settled steps' ratio."""
    if len(pairs) < 2:
        return [f"{len(pairs)} pair(s) with stitched windows: too few for a mean and its error"]
    gaps = [p.gap for p in pairs]
    error = statistics.stdev(gaps) / math.sqrt(len(gaps))
    reported = statistics.fmean(p.report for p in pairs)
    logs = [math.log(p.settled) for p in pairs if p.settled > 0]
    share = f", {statistics.fmean(gaps) / reported:+.1%} of the report's gross" if reported > 0 else ""
    lines = [
        f"{len(pairs)} pairs: the report's gross {reported:.3f} s a run on average; report minus clock on the same"
        f" steps {statistics.fmean(gaps):+.3f} s (standard error {error:.3f} s;"
        f" median {statistics.median(gaps):+.3f} s){share}"
    ]
    if len(logs) > 1:
        drift = statistics.stdev(logs) / math.sqrt(len(logs))
        lines.append(
            f"the warm runs' settled baseline steps against the plain processes' median step:"
            f" {math.exp(statistics.fmean(logs)) - 1:+.1%} (standard error {drift:.1%})"
        )
    return lines


def _child(mode: str, args: argparse.Namespace) -> None:
    """One run of the job in this process, every step timed; a warm run's windows read back from its telemetry."""
    import ab_jobs
    import tensorflow as tf

    job, steps, state, fleet = args.job, args.steps, args.state, args.fleet

    uid = f"pairs-{mode}-{time.time_ns()}"
    hook, url = ab_jobs._plugin_hook(job, state, fleet, uid) if mode == "warm" else (None, "")
    graph, fetches, feeds, hooks = ab_jobs._job_parts(job, steps, hook)
    times: list[float] = []
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
        while not session.should_stop():
            began = time.perf_counter()
            session.run(fetches, feeds)
            times.append(time.perf_counter() - began)
    windows: list[Any] = []
    if hook is not None:
        import sqlalchemy as sa

        from stitchfleet.telemetry import spool_ingest

        spool_ingest.claim(Path(state) / "spool", url)
        query = (
            "select mode, first_step, last_step, iterations, step_seconds_sum, baseline_step_seconds"
            " from step_windows where job_id in (select id from jobs where job_uid = :uid) order by first_step"
        )
        engine = sa.create_engine(url)
        try:
            with engine.connect() as connection:
                windows = [list(row) for row in connection.execute(sa.text(query), {"uid": uid})]
        finally:
            engine.dispose()
    Path(args.out).write_text(json.dumps({"times": times, "windows": windows}))


def _run(mode: str, args: argparse.Namespace, state: str, fleet: str, cache: str) -> dict[str, Any]:
    """One child process; its step times and windows."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", mode, "--job", args.job, "--steps", str(args.steps)]
        command += ["--state", state, "--fleet", fleet, "--out", out.name]
        env = {**os.environ, "STITCHFLEET_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found: dict[str, Any] = json.loads(Path(out.name).read_text())
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="mlp", choices=("demo", "mlp", "transformer"))
    parser.add_argument("--steps", type=int, default=6000, help="each run's steps (its StopAtStepHook)")
    parser.add_argument("--pairs", type=int, default=20, help="plain / warm pairs, alternated")
    parser.add_argument("--record", type=Path, help="append each pair's figures to FILE as JSON lines")
    parser.add_argument("--child", choices=("plain", "warm"), help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        _child(args.child, args)
        return 0
    if args.steps < 1 or args.pairs < 1:
        raise SystemExit("claim_pairs: --steps and --pairs must be at least 1")
    pairs: list[Pair] = []
    with tempfile.TemporaryDirectory(prefix="claim-pairs-") as tmp:
        state, fleet, cache = (str(Path(tmp) / name) for name in ("state", "fleet", "cache"))
        for folder in (state, fleet, cache):
            Path(folder).mkdir()
        started = time.perf_counter()
        idle = idle_policy.read()
        print(f"{args.job}, {args.steps} steps a run; the machine's {idle.describe()}", flush=True)
        print("a cold run fills the kernel cache (not counted)", flush=True)
        _run("warm", args, state, fleet, cache)
        for index in range(args.pairs):
            order = ("plain", "warm") if index % 2 == 0 else ("warm", "plain")
            runs = {mode: _run(mode, args, state, fleet, cache) for mode in order}
            windows = [tuple(w) for w in runs["warm"]["windows"]]
            found = compare(runs["plain"]["times"], runs["warm"]["times"], windows)
            elapsed = time.perf_counter() - started
            if found is None:
                print(f"pair {index + 1}/{args.pairs} ({elapsed:.0f} s): no stitched windows (setup skipped?)")
                continue
            pairs.append(found)
            print(
                f"pair {index + 1}/{args.pairs} ({elapsed:.0f} s): report {found.report:+.3f} s, clock"
                f" {found.clock:+.3f} s on the same {found.steps} steps, gap {found.gap:+.3f} s; settled baseline"
                f" steps {found.settled - 1:+.1%} over plain's median",
                flush=True,
            )
            if args.record is not None:
                with args.record.open("a") as record:
                    figures = {"job": args.job, "run_steps": args.steps, "idle": asdict(idle), **asdict(found)}
                    record.write(json.dumps(figures) + "\n")
    print("\n".join(summary(pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
