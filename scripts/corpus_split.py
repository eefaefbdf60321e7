"""Where a corpus program's wall goes under the plugin (figures, not tests): phase by phase against plain TF.

Input: a corpus program and its step cap (`PROGRAM:STEPS`, from $STITCHFLEET_CORPUS_DIR), rounds. Each round runs it
plain, under the boot shim with an empty kernel cache and fleet memory (the job's first run: cold), and plain again,
each in its own interpreter with clock marks (`MARKS`: the session's constructor, the hook's begin, the session
made, the end of the hook) and a mark per step (its `CORPUS_LOSS` line). Output: per round, the plugin run's
seconds beyond the mean of the two plain runs, phase by phase (before the session, the hook's begin, the rest of
the session's creation, the first step, the steps by the mode of the plugin's window that holds them, after the
last step), beside what the report booked for each (setup; each mode's windows' saving; the plugin's overhead), and
what the report left unbooked. `ab_jobs.py` judges the claim against the wall; this says where they part.

    STITCHFLEET_CORPUS_DIR=DIR PYTHONPATH=. python scripts/corpus_split.py google_bert_run_classifier.py:2000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ab_jobs  # noqa: E402  (beside this script)

MARK = "SPLIT_MARK "
# Put before corpus_runs.WRAPPER in the child: prints a clock mark (wall clock, shared with the parent) when the
# MonitoredSession's constructor starts and ends and around the StitchHook's begin and end (wrapped per instance, so
# nothing is imported that the run would not import). Printed as they happen: a run cut short keeps its marks.
MARKS = (
    "import time\n"
    "from tensorflow.python.training import monitored_session as _ms\n"
    "def _mark(name):\n"
    f"    print({MARK!r} + name + ' ' + repr(time.time()), flush=True)\n"
    "_init = _ms._MonitoredSession.__init__\n"
    "def _timed_init(self, creator, hooks, *args, **kwargs):\n"
    "    _mark('session')\n"
    "    for hook in hooks or []:\n"
    "        if type(hook).__name__ == 'StitchHook':\n"
    "            for name in ('begin', 'end'):\n"
    "                def timed(*a, _call=getattr(hook, name), _name=name, **k):\n"
    "                    _mark(_name + '_in')\n"
    "                    try:\n"
    "                        return _call(*a, **k)\n"
    "                    finally:\n"
    "                        _mark(_name + '_out')\n"
    "                setattr(hook, name, timed)\n"
    "    _init(self, creator, hooks, *args, **kwargs)\n"
    "    _mark('created')\n"
    "_ms._MonitoredSession.__init__ = _timed_init\n"
)


@dataclass(frozen=True)
class Phase:
    """One phase of a run: the plugin run's seconds beyond plain TF's (negative: saved), and what the report booked
    as that phase's cost (None: the report books it in another phase's figure)."""

    name: str
    extra: float
    steps: int = 0
    booked: float | None = None


def _run(program: str, mode: str, steps: int, cache: str, fleet: str) -> dict[str, Any]:
    """One run of the program in its own interpreter: its wall, its marks and its steps' arrivals (seconds from the
    start), and for the plugin run its windows and what the report claims, from its telemetry."""
    from tests.corpus import corpus_runs

    uid = f"split-{mode}-{time.time_ns()}"
    env = ab_jobs.corpus_env(program, mode, steps, (cache, fleet, uid), prefix="split")
    arrivals: list[float] = []
    marks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        env["CORPUS_DIR"] = str(Path(scratch) / "checkpoints")
        argv = [sys.executable, "-c", MARKS + corpus_runs.WRAPPER, str(corpus_runs.program_path(program))]
        started = time.time()
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
            assert child.stdout is not None
            for line in child.stdout:
                if corpus_runs.LOSS.match(line.strip()):
                    arrivals.append(time.time() - started)
                elif line.startswith(MARK):
                    name, _, at = line[len(MARK) :].partition(" ")
                    marks[name] = float(at) - started
            code = child.wait()
            wall = time.time() - started
            errors.seek(0)
            log = errors.read()
    if code != 0 or len(arrivals) < 2:
        raise SystemExit(f"corpus_split: the {mode} run failed: {(log.strip().splitlines() or ['?'])[-1][:200]}")
    run: dict[str, Any] = {"mode": mode, "wall": wall, "marks": marks, "arrivals": arrivals}
    if mode != "plain":
        run.update(_telemetry(Path(fleet), uid))
    return run


def _telemetry(fleet: Path, uid: str) -> dict[str, Any]:
    """The plugin run's windows (first and last step, mode, saved seconds) and the report's claim (`ab_jobs._claim`)."""
    import sqlalchemy as sa

    from stitchfleet.telemetry import spool_ingest

    url = f"sqlite:///{fleet / 'telemetry.db'}"
    spool_ingest.claim(fleet / "spool", url)  # a run that skipped its setup spooled its rows
    engine = sa.create_engine(url)
    query = (
        "select first_step, last_step, mode, saved_seconds from step_windows"
        " where job_id in (select id from jobs where job_uid = :uid) order by id"
    )
    try:
        with engine.connect() as connection:
            windows = [list(row) for row in connection.execute(sa.text(query), {"uid": uid})]
    finally:
        engine.dispose()
    return {"windows": windows, "claim": ab_jobs._claim(url, uid)}


def _gaps(run: dict[str, Any], count: int) -> list[float]:
    """Each step's seconds after the first: the gap between its loss line and the one before."""
    arrivals = run["arrivals"]
    return [arrivals[i] - arrivals[i - 1] for i in range(1, count)]


def split(plugin: dict[str, Any], plains: list[dict[str, Any]]) -> list[Phase]:
    """The plugin run's wall beyond the mean of `plains`, phase by phase; the phases sum to the wall's difference.
    Its steps are split by the mode of the window that holds each (`unwindowed`: a step no window holds, such as a
    decision step). Beside a phase, what the report booked of it: beside begin the whole setup (which also holds the
    warmup's executor builds and the kernels' first runs, spent in the steps), beside a mode minus its windows'
    saving, beside the last phase the plugin's overhead (its own work on the steps, spent in them)."""
    if not plains:
        raise ValueError("split: no plain run to weigh the plugin run against")
    count = min(len(run["arrivals"]) for run in [plugin, *plains])
    mean = statistics.fmean

    def plain(figure: Callable[[dict[str, Any]], float]) -> float:
        return mean(figure(run) for run in plains)

    marks = plugin["marks"]
    session = plain(lambda r: r["marks"].get("session", r["arrivals"][0]))
    created = plain(lambda r: r["marks"].get("created", r["arrivals"][0]))
    ours_session = marks.get("session", plugin["arrivals"][0])
    ours_created = marks.get("created", plugin["arrivals"][0])
    begin = marks.get("begin_out", ours_session) - marks.get("begin_in", ours_session)
    claim = plugin.get("claim", {})
    phases = [
        Phase("before the session (imports, the graph)", ours_session - session),
        Phase("the hook's begin (setup)", begin, booked=claim.get("setup")),
        Phase("the rest of the session's creation", ours_created - ours_session - begin - (created - session)),
        Phase(
            "to the first step's end",
            plugin["arrivals"][0] - ours_created - plain(lambda r: r["arrivals"][0]) + created,
        ),
    ]
    modes: dict[int, str] = {}
    saved: dict[str, float] = {}
    for first, last, mode, seconds in plugin.get("windows", []):
        modes.update(dict.fromkeys(range(int(first), int(last) + 1), mode))
        saved[mode] = saved.get(mode, 0.0) + float(seconds or 0.0)
    ours = _gaps(plugin, count)
    theirs = [mean(gaps) for gaps in zip(*(_gaps(run, count) for run in plains), strict=True)]
    by_mode: dict[str, list[float]] = {}
    for step, (mine, other) in enumerate(zip(ours, theirs, strict=True), start=1):
        by_mode.setdefault(modes.get(step, "unwindowed"), []).append(mine - other)
    for mode, extras in sorted(by_mode.items(), key=lambda item: -len(item[1])):
        booked = -saved[mode] if mode in saved and saved[mode] != 0.0 else None
        phases.append(Phase(f"{mode} steps", sum(extras), len(extras), booked))
    end = plugin["wall"] - plugin["arrivals"][count - 1] - plain(lambda r: r["wall"] - r["arrivals"][count - 1])
    phases.append(Phase("after the last step (the hook's end, the close)", end, booked=claim.get("overhead")))
    return phases


def unbooked(plugin: dict[str, Any], phases: list[Phase]) -> float:
    """What the wall paid beyond what the report books: the phases' sum less the setup, the overhead and minus the
    windows' measured gross (claimed or within noise: what they measured)."""
    claim = plugin.get("claim", {})
    booked = (
        float(claim.get("setup", 0.0)) + float(claim.get("overhead", 0.0)) - float(claim.get("measured_gross", 0.0))
    )
    return sum(phase.extra for phase in phases) - booked


def render(round_: int, plugin: dict[str, Any], plains: list[dict[str, Any]]) -> list[str]:
    """A round's lines: the walls, each phase with its booked figure, and the unbooked rest."""
    phases = split(plugin, plains)
    walls = ", ".join(f"{run['wall']:.1f}" for run in plains)
    lines = [
        f"round {round_ + 1}: plugin {plugin['wall']:.1f} s against plain {walls} s:"
        f" {plugin['wall'] - statistics.fmean(run['wall'] for run in plains):+.2f} s (+ costs, - saves)"
    ]
    for phase in phases:
        steps = f" ({phase.steps} steps, {phase.extra / phase.steps * 1e3:+.2f} ms a step)" if phase.steps else ""
        booked = f"   booked {phase.booked:+.2f}" if phase.booked is not None else ""
        lines.append(f"  {phase.name:<50} {phase.extra:+8.2f} s{steps}{booked}")
    claim = plugin.get("claim", {})
    if claim:
        lines.append(
            f"  the report: setup {claim['setup']:.2f} s, overhead {claim['overhead']:.2f} s, windows' gross"
            f" {claim['measured_gross']:+.2f} s (claimed {claim['claimed_gross']:+.2f});"
            f" unbooked {unbooked(plugin, phases):+.2f} s"
        )
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corpus_split.py", description=__doc__.splitlines()[0])
    parser.add_argument("program", metavar="PROGRAM:STEPS", help="a corpus program and its step cap")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--record", type=Path, default=None, help="a JSON-lines file each run is appended to")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    program, _, count = args.program.partition(":")
    if not count.isdigit():
        raise SystemExit(f"corpus_split: {args.program!r}: give the step cap after ':' (PROGRAM:STEPS)")
    record = args.record.open("a") if args.record else None
    for round_ in range(args.rounds):
        runs: list[dict[str, Any]] = []
        for mode in ("plain", "cold", "plain"):
            with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as fleet:
                ab_jobs._shipped_op(cache)
                run = _run(program, mode, int(count), cache, fleet)
            print(f"  round {round_ + 1}/{args.rounds}: {mode} {run['wall']:.1f} s", flush=True)
            runs.append(run)
            if record is not None:
                record.write(json.dumps({"round": round_, **run}) + "\n")
                record.flush()
        print("\n".join(render(round_, runs[1], [runs[0], runs[2]])), flush=True)
    if record is not None:
        record.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
