"""A/B of whole TF1 jobs (figures, not tests): plain TF, XLA auto-clustering, the plugin cold and warm, alternated.

Input: the command line (jobs of the corpus, steps per job, rounds). Output: one Markdown table on stdout (and
appended to --out when given): per job and mode, wall seconds (process start of the job to its end: graph,
session, setup, steps, the session's close) and against plain TF's of the same round, whole and up to the end of the
job's last step (a program's teardown after it can wait for tens of seconds in any mode: tf.data's autotune thread,
benchmarks/README.md "Session 28"), the steady step (median of the last half), first and last loss, what the plugin
decided, the report's claimed saving (net: the job's windows' gross minus its setup and its plugin overhead, from its
telemetry, per device back to the rank's seconds, with the windows' noise; a run without stitched windows claims
minus its setup and overhead) against the measured difference from plain TF in the same round
(steps alone, and wall), with the noise of the measured difference, judged on the steps (a corpus program, which
says nothing of the part of its setup in its steps: on its wall, its whole setup booked), and
for plugin runs the stitched step against plain TF's interleaved in the same process (the job's stitched windows of
its last half against their paired baseline blocks, the user's graph: `_in_job`), which no spread between processes
moves.
That noise is measured: each round runs plain TF twice (`again`, the control; --no-control leaves it out), and the
noise of a difference between two processes is the root mean square over the rounds of plain TF minus plain TF again
(without the control: the spread of plain TF's figure over the rounds, x sqrt 2); the control's own row shows it.
Each round ends, for this script's own jobs (not the corpus programs), with a one-process pair (`inproc`,
benchmarks/ab_interleaved.py): the job in one process, plain and under the warm plugin (and plain again, the control),
alternated chunk by chunk; its own table holds the plugin's steady step against plain TF's chunk by chunk, and the
report's claim against the steps' difference in that process, with the noise of plain TF against itself there.
Each run prints a line as it ends and, with --record FILE, appends its figures to FILE as one JSON line; the table
so far is printed after every round; --resume FILE reads such a file back and runs only the rounds it lacks.

Each run is its own process (XLA's flags are read at import; a cold plugin has an empty kernel cache but for the
native TF op, which a pod finds prebuilt in the shim image); the rounds alternate the modes' order, the warm run
reuses its round's cold cache and sits between the round's two plain processes (plain, plain again), and each run
records the share of the CPU the hypervisor stole while it ran. Every plugin run of a job records into one telemetry
database kept over the rounds: the fleet's memory, so a later run knows what earlier runs' probes found
(with STITCHFLEET_SLOWER_JOBS=2, from the second round on). Jobs run in a MonitoredSession with a StopAtStepHook,
as users write them, so the plugin knows their length; a warm run is also told the job's plain step time (the
steady step of the round's plain process before it: what an operator's memory of earlier runs says), so it decides
whether its setup can pay back at all (plugin/setup/payback.py); a cold run, the job's first, is not told.

Programs of the corpus of real TF1 programs (tests/corpus/README.md; their copies outside the checkout, in
$STITCHFLEET_CORPUS_DIR) join with `--corpus`: each run is the program in its own interpreter, plain
(`STITCHFLEET_ENABLED=0`), under XLA's flags, or under the boot shim with the plugin's default settings (as the
admission webhook injects it); its step times are the gaps between its per-step `CORPUS_LOSS` lines as they
arrive, its decisions and claims are read from the telemetry database its runs share over the rounds. The seconds
TensorFlow itself spent in its longest close of a session (`TF_CloseSession`, timed in the child: `CLOSE_TIMER`) are
left out of its wall in every figure and shown beside it: with an autotuned tf.data pipeline the close can wait up
to a minute on tf.data's autotune thread (a race in TF 2.15 between its cancellation and that thread's timed wait,
in plain TF alike: scripts/tf_data_close.py, benchmarks/README.md "Session 38").

    PYTHONPATH=. python scripts/ab_jobs.py --jobs demo mlp transformer --rounds 2
    PYTHONPATH=. python scripts/ab_jobs.py --jobs demo:12000 --rounds 1   # a job's own length after ':'
    STITCHFLEET_CORPUS_DIR=DIR PYTHONPATH=. python scripts/ab_jobs.py --jobs --corpus models_cifar10_train.py:300
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import ab_interleaved, idle_policy
from stitchfleet import settings
from stitchfleet.telemetry import paired

if TYPE_CHECKING:  # the hook imports TensorFlow: imported where a run needs it
    from stitchfleet.plugin.session.hook import StitchHook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("plain", "xla", "cold", "warm")
AGAIN = "again"  # plain TF a second time in the round: the control that measures two plain processes' difference
STEPS = {"demo": 3000, "mlp": 1500, "transformer": 2000}  # each job's length (what its StopAtStepHook says)
XLA_FLAGS = "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit"


def _demo() -> tuple[Any, Any, Any, dict[Any, Any]]:
    from stitchfleet.demo import command

    graph, loss, train_op, feeds = command._build(command.DIMS)
    return graph, loss, train_op, feeds()


def _mlp() -> tuple[Any, Any, Any, dict[Any, Any]]:
    """An MLP with LayerNorm and GELU (batch 64, width 256, 3 blocks): ~2 ms steps on 2 cores."""
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        # Keras' unseeded initializers draw from Python's random state, not the graph seed: seeded too, so every
        # process starts from the same weights and the losses of plain and plugin runs compare
        tf.keras.utils.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [64, 256], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [64, 256], name="y")
        h = x
        for _ in range(3):
            h = tf.keras.layers.LayerNormalization()(tf.nn.gelu(tf.keras.layers.Dense(256)(h)) + h)
        loss = tf.reduce_mean(tf.square(h - y), name="loss")
        train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss)
    rng = np.random.default_rng(0)
    return graph, loss, train_op, {x: rng.standard_normal([64, 256]), y: rng.standard_normal([64, 256])}


def _transformer() -> tuple[Any, Any, Any, dict[Any, Any]]:
    """A TF1 Transformer encoder as users write it: Keras MultiHeadAttention, LayerNorm, Dense, GELU, dropout;
    2 blocks, batch 16, 32 tokens, width 128, 4 heads."""
    import numpy as np
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.keras.utils.set_random_seed(0)  # as in `_mlp`: Keras' initializers too
        x = tf.compat.v1.placeholder(tf.float32, [16, 32, 128], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [16, 32, 128], name="y")
        h = x
        for _ in range(2):
            attended = tf.keras.layers.MultiHeadAttention(4, 32, dropout=0.1)(h, h, training=True)
            h = tf.keras.layers.LayerNormalization()(h + tf.keras.layers.Dropout(0.1)(attended, training=True))
            inner = tf.keras.layers.Dense(512, activation=tf.nn.gelu)(h)
            h = tf.keras.layers.LayerNormalization()(h + tf.keras.layers.Dense(128)(inner))
        loss = tf.reduce_mean(tf.square(h - y), name="loss")
        train_op = tf.compat.v1.train.AdamOptimizer(1e-4).minimize(loss)
    rng = np.random.default_rng(0)
    return graph, loss, train_op, {x: rng.standard_normal([16, 32, 128]), y: rng.standard_normal([16, 32, 128])}


JOBS = {"demo": _demo, "mlp": _mlp, "transformer": _transformer}


def _child(job: str, mode: str, steps: int, state: str, fleet: str) -> dict[str, Any]:
    """One job in this process; its figures as a dict."""
    started = time.perf_counter()
    import tensorflow as tf

    uid = f"{mode}-{time.time_ns()}"
    hook, url = _plugin_hook(job, state, fleet, uid) if mode in ("cold", "warm") else (None, "")
    graph, fetches, feeds, hooks = _job_parts(job, steps, hook)
    with graph.as_default():
        times, losses = [], []
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
            while not session.should_stop():
                began = time.perf_counter()
                value, _, _ = session.run(fetches, feeds)
                times.append(time.perf_counter() - began)
                losses.append(float(value))
            to_last = time.perf_counter() - started  # before the session closes (`_to_last`)
    wall = time.perf_counter() - started
    found: dict[str, Any] = {
        "wall": wall,
        "to_last": to_last,
        "steps_seconds": sum(times),
        "steady": statistics.median(times[len(times) // 2 :]),
        "losses": [losses[0], losses[-1]],
        "steps": len(times),
    }
    if hook is not None:
        from stitchfleet.telemetry import spool_ingest

        spool_ingest.claim(Path(state) / "spool", url)  # a run that skipped its setup spooled its rows
        found.update(_plugin_figures(hook, url, uid))
    return found


def _plugin_hook(job: str, state: str, fleet: str, uid: str) -> tuple[StitchHook, str]:
    """The plugin's hook for one run of `job` (its state, the fleet's telemetry database) and that database's URL."""
    from stitchfleet.plugin.session.hook import StitchHook

    url = f"sqlite:///{Path(fleet) / 'telemetry.db'}"
    env = {**os.environ, "STITCHFLEET_STATE_DIR": state, "STITCHFLEET_JOB_NAME": f"ab-{job}"}
    return StitchHook(settings.load({**env, "STITCHFLEET_JOB_UID": uid}), db_url=url), url


def _job_parts(job: str, steps: int, hook: StitchHook | None) -> tuple[Any, list[Any], dict[Any, Any], list[Any]]:
    """`job`'s graph as users write it (a global step and a StopAtStepHook: the plugin knows its length): the graph,
    the step's fetches, its feeds, and the session's hooks (`hook` first when given)."""
    import tensorflow as tf

    graph, loss, train_op, feeds = JOBS[job]()
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        step_up = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=steps)
    return graph, [loss, train_op, step_up], feeds, [h for h in (hook, stop) if h is not None]


def _child_inproc(job: str, steps: int, state: str, fleet: str, control: bool) -> dict[str, Any]:
    """The job in this process, plain and under the plugin (warm: the round's cache and fleet memory) and, with the
    `control`, plain again, alternated chunk by chunk (`ab_interleaved`); their figures as a dict."""
    import contextlib

    import tensorflow as tf

    uid = f"inproc-{time.time_ns()}"
    hook, url = _plugin_hook(job, state, fleet, uid)
    sides = []
    with contextlib.ExitStack() as stack:
        for side_hook in (None, hook, None) if control else (None, hook):
            graph, fetches, feeds, hooks = _job_parts(job, steps, side_hook)
            with graph.as_default():
                session = stack.enter_context(tf.compat.v1.train.MonitoredSession(hooks=hooks))
            sides.append(ab_interleaved.Side(session, graph, fetches, feeds))
        ab_interleaved.alternate(sides[0], sides[1], steps, sides[2] if control else None)
    found = ab_interleaved.figures(sides[0], sides[1], sides[2] if control else None)
    from stitchfleet.telemetry import spool_ingest

    spool_ingest.claim(Path(state) / "spool", url)
    found.update(_plugin_figures(hook, url, uid))
    return found


def _brief(text: str, limit: int = 110) -> str:
    """A decision's text for the table's cell: whole, or cut at the last word that fits, marked with '...'."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _plugin_figures(hook: StitchHook, url: str, uid: str) -> dict[str, Any]:
    """What the plugin decided and what its report claims: its windows' saved seconds and its setup seconds (per
    device, the rank's seconds), the windows' noise, and the setup it booked from steps (warmup builds, first
    runs: in the steps' time, where `begin`'s compile is not)."""
    controller = hook.controller
    if controller is None:
        skipped = hook.length.skipped
        decided = f"setup skipped: {_brief(skipped)}" if skipped else "off" if hook.installed else "nothing stitched"
    elif controller.job_reverted:
        decided = f"reverted: {_brief(controller.job_reverted)}"
    elif controller.stitching_off:
        decided = f"off: {_brief(controller.stitching_off)}"
    else:
        kept = sum(bool(c.kept) and c.enabled for c in controller.clusters)
        decided = f"{kept}/{len(controller.clusters)} kept, group {'proven' if controller.group_proven else 'not'}"
    if controller is not None and controller.group_probe.startswith("group probe skipped"):
        decided += " (group known to the fleet)"
    claimed = _claim(url, uid)
    from_steps = (controller.warmup.seconds or 0.0) + controller.first_seconds if controller is not None else 0.0
    return {"decided": decided, **claimed, "setup_from_steps": from_steps}


def _claim(url: str, uid: str) -> dict[str, Any]:
    """What the report claims for one run (job uid): its paired windows' saving with the report's 95% interval
    (`telemetry.paired`, the same sums the store keeps per task-week), the claimed part (0 when the interval holds
    zero), and the setup and plugin overhead seconds the job booked (`rows.JobOverhead`)."""
    import sqlalchemy as sa

    from stitchfleet.telemetry import paired

    mine = "select id from jobs where job_uid = :uid"
    windows = (
        "select mode, iterations, step_seconds_sum, baseline_step_seconds, saved_seconds from step_windows"
        f" where job_id in ({mine}) order by id"
    )
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            rows = [tuple(row) for row in connection.execute(sa.text(windows), {"uid": uid})]
            query = f"select max(compile_seconds), max(overhead_seconds) from jobs where id in ({mine})"
            setup, overhead = connection.execute(sa.text(query), {"uid": uid}).one()
    finally:
        engine.dispose()
    sums = paired.PairedSums.windows(rows)
    found = paired.claim(sums, sum(float(row[4] or 0.0) for row in rows))
    return {
        "measured_gross": found.measured,
        "claimed_gross": found.claimed,
        "interval": [found.low, found.high],
        "setup": float(setup or 0.0),
        "overhead": float(overhead or 0.0),
        "in_job": _in_job(rows),
    }


def _in_job(rows: list[tuple[Any, ...]]) -> list[float]:
    """The stitched step against plain TF's interleaved in the same process: over the last half of the job's stitched
    windows that have a paired baseline (its blocks on either side, the user's own graph: `telemetry.paired`), their
    summed step seconds over the same steps at the paired baseline's mean step (pooled: what the job paid), the
    median of the windows' own ratios (the steady step: a load spike moves one window) and their middle half (low,
    high), and the windows' count; [] without such windows. Check steps and the hook's own work on stitched steps
    are in it, as the job paid them."""
    stitched = [row for row in rows if row[0] == "stitched" and row[3] and row[1]]
    late = stitched[len(stitched) // 2 :]
    if not late:
        return []
    pooled = sum(float(row[2]) for row in late) / sum(float(row[1]) * float(row[3]) for row in late)
    ratios = sorted(float(row[2]) / (float(row[1]) * float(row[3])) for row in late)
    low, high = ratios[len(ratios) // 4], ratios[max(len(ratios) // 4, (3 * len(ratios) - 1) // 4)]
    return [pooled, statistics.median(ratios), low, high, len(late)]


def _run(
    job: str,
    mode: str,
    steps: int,
    cache: str,
    fleet: str,
    *,
    step_ms: float = 0.0,
    limit: float = 1800.0,
    control: bool = True,
) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "STITCHFLEET_CACHE_DIR": cache}
    env["STITCHFLEET_STEP_MS"] = f"{step_ms:.6f}"  # the plain step time the fleet knows (0: unknown)
    if mode == "xla":
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    with tempfile.TemporaryDirectory() as state:
        argv = [sys.executable, __file__, "--child", job, mode, "--steps", str(steps), "--state", state]
        argv += ["--fleet", fleet, *([] if control else ["--no-control"])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"error": f"stopped after {limit:.0f} s (the run's time limit)"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"}
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


# Put before corpus_runs.WRAPPER in the child: times TensorFlow's own closes of sessions (the C call
# `BaseSession.close` makes, looked up on its module at each call; the plugin's work at a job's end runs before it,
# in Python) and prints the longest at exit, for `_less_close`. The longest only: the plugin's own short-lived
# sessions (a cold setup's translation checks) close too, and their closes are the plugin's cost.
CLOSE_TIMER = (
    "import atexit, time\n"
    "from tensorflow.python.client import pywrap_tf_session as _tf_session\n"
    "_longest, _close = [0.0], _tf_session.TF_CloseSession\n"
    "def _timed_close(session):\n"
    "    started = time.perf_counter()\n"
    "    try:\n"
    "        return _close(session)\n"
    "    finally:\n"
    "        _longest[0] = max(_longest[0], time.perf_counter() - started)\n"
    "_tf_session.TF_CloseSession = _timed_close\n"
    "atexit.register(lambda: print(f'AB_TF_CLOSE {_longest[0]:.6f}', flush=True))\n"
)
CLOSE_LINE = "AB_TF_CLOSE "


def corpus_env(
    program: str, mode: str, steps: int, where: tuple[str, str, str], *, step_ms: float = 0.0, prefix: str = "ab"
) -> dict[str, str]:
    """The environment of a corpus program's run in its own interpreter (less its `CORPUS_DIR`, the run's scratch):
    this one's without the plugin's or XLA's settings, the boot shim first on PYTHONPATH, the plugin on for `cold` and
    `warm`, XLA's flags for `xla`; `where` is the kernel cache, the fleet's state directory (its telemetry over the
    rounds: the fleet's memory) and the run's job uid; `step_ms` the plain step the fleet knows (0: unknown)."""
    cache, fleet, uid = where
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_") and k != "TF_XLA_FLAGS"}
    env.update(
        PYTHONPATH=f"{ROOT / 'stitchfleet' / 'boot'}{os.pathsep}{ROOT}",
        STITCHFLEET_ENABLED="1" if mode in ("cold", "warm") else "0",
        STITCHFLEET_STATE_DIR=fleet,
        STITCHFLEET_CACHE_DIR=cache,
        STITCHFLEET_JOB_UID=uid,
        STITCHFLEET_JOB_NAME=f"{prefix}-{program}",
        STITCHFLEET_STEP_MS=f"{step_ms:.6f}",
        CORPUS_STEPS=str(steps),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    if mode == "xla":
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    return env


def _corpus_run(
    program: str, mode: str, steps: int, cache: str, fleet: str, *, step_ms: float = 0.0, limit: float = 1800.0
) -> dict[str, Any]:
    """One corpus program in its own interpreter (`tests/corpus/corpus_runs`' wrapper), timed line by line."""
    from tests.corpus import corpus_runs

    uid = f"{mode}-{time.time_ns()}"
    env = corpus_env(program, mode, steps, (cache, fleet, uid), step_ms=step_ms)
    arrivals: list[float] = []
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        env["CORPUS_DIR"] = str(Path(scratch) / "checkpoints")
        argv = [sys.executable, "-c", CLOSE_TIMER + corpus_runs.WRAPPER, str(corpus_runs.program_path(program))]
        closing: float | None = None
        started = time.perf_counter()
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
            assert child.stdout is not None
            watchdog = threading.Timer(limit, child.kill)  # the run's time limit: the loop below then ends
            watchdog.start()
            for line in child.stdout:  # a loss line per step, read as it comes: the gaps are the step times
                found = corpus_runs.LOSS.match(line.strip())
                if found:
                    arrivals.append(time.perf_counter())
                    losses.append(float(found.group(2)))
                elif line.startswith(CLOSE_LINE):
                    closing = float(line[len(CLOSE_LINE) :])
            code = child.wait()
            watchdog.cancel()
            wall = time.perf_counter() - started
            errors.seek(0)
            log = errors.read()
    if wall >= limit and code != 0:
        return {"error": f"stopped after {limit:.0f} s (the run's time limit), {len(arrivals)} of {steps} steps done"}
    if code != 0 or len(arrivals) < 4:
        return {"error": (log.strip().splitlines() or ["failed"])[-1][:200]}
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    figures: dict[str, Any] = {
        "wall": wall,
        "to_last": arrivals[-1] - started,  # the last step's loss line (`_to_last`)
        "steps_seconds": arrivals[-1] - arrivals[0],  # every step after the first (its executor build)
        "steady": statistics.median(gaps[len(gaps) // 2 :]),
        "losses": [losses[0], losses[-1]],
        "steps": len(losses),
        **({"tf_close": closing} if closing is not None else {}),
    }
    if mode in ("cold", "warm"):
        stitched = corpus_runs.STITCHED.search(log)
        figures.update(_corpus_claims(Path(fleet) / "telemetry.db", uid, stitched.group(0) if stitched else ""))
    return figures


def _corpus_claims(path: Path, uid: str, stitched: str) -> dict[str, Any]:
    """A shimmed corpus run's decisions and claims, read from the telemetry database: its reverts, its job verdict,
    else its last setup event; what the report claims for it (`_claim`)."""
    import sqlalchemy as sa

    from stitchfleet.telemetry import spool_ingest

    spool_ingest.claim(path.parent / "spool", f"sqlite:///{path}")  # a run that skipped its setup spooled its rows
    mine = "select id from jobs where job_uid = :uid"
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:

            def rows(query: str) -> list[Any]:
                return list(connection.execute(sa.text(query), {"uid": uid}).all())

            reverts = rows(f"select detail from events where kind = 'revert' and job_id in ({mine}) order by id")
            verdicts = rows(f"select verdict, reason from job_verdicts where job_id in ({mine}) order by id")
            setups = rows(f"select detail from events where kind = 'setup' and job_id in ({mine}) order by id")
    finally:
        engine.dispose()
    if reverts:
        decided = f"reverted: {_brief((reverts[0][0] or '').splitlines()[0])}"
    elif verdicts:
        decided = f"{verdicts[-1][0]}: {_brief(verdicts[-1][1] or '')}"
    elif setups:
        decided = _brief((setups[-1][0] or "").splitlines()[0])
    else:
        decided = "no setup recorded"
    if stitched:
        decided = f"{stitched.removeprefix('stitchfleet: ')}; {decided}"
    return {"decided": decided, **_claim(f"sqlite:///{path}", uid), "setup_from_steps": 0.0, "clock": "wall"}


def _host_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """The machine's CPU ticks so far: (stolen by the hypervisor, all), from /proc/stat's `cpu` line; None where it
    is not Linux's or lacks the steal column (kernels before 2.6.11)."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    ticks = [int(field) for field in fields[1:]]
    # guest time (fields 9-10) is counted in user time already
    return ticks[7], sum(ticks[:8])


def _stolen(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time the hypervisor gave other guests between two `_host_ticks` readings: what
    no process here can see in `ps`, and what slowed whole runs of a sitting by 20-35% (session 36: BERT's cold run
    at 2.17x plain's wall while up to 30% of the CPU was stolen; its plain run again at 1.15x with 5-14%)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _watched(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run`'s figures, with the share of the CPU the host stole while it ran (`steal`) where /proc/stat tells."""
    ticks = _host_ticks()
    found = run()
    steal = _stolen(ticks, _host_ticks())
    return found if steal is None else {**found, "steal": steal}


def _known_step_ms(plain: list[dict[str, Any]], again: list[dict[str, Any]], round_: int) -> float:
    """What the fleet's memory tells a warm run of the job's plain step time: the steady step of round `round_`'s
    plain process that ran before it (plain TF, or plain TF again: `_order` puts one before the warm run), else the
    latest plain run's; 0 (unknown) when none finished."""
    for runs in (plain, again):  # only the one that ran before the warm run has this round's figure yet
        if len(runs) > round_ and "steady" in runs[round_]:
            return float(runs[round_]["steady"]) * 1e3
    done = [run["steady"] for run in plain if "steady" in run]
    return float(done[-1]) * 1e3 if done else 0.0


def _limit(plain: list[dict[str, Any]], factor: float, mode: str = "plain") -> float:
    """A run's time limit: `factor` x the job's slowest plain run so far (XLA recompiling every step of an Estimator
    ran 1006 s against plain TF's 92 s), twice that for the one-process pair, which runs the job twice (the demo's
    stopped at 4x on a slow day: 189 s); 1800 s before any plain run finished, or with factor 0."""
    walls = [run["wall"] for run in plain if "wall" in run]
    return factor * max(walls) * (2 if mode == "inproc" else 1) if walls and factor > 0 else 1800.0


def _order(round_: int, inproc: bool = False, control: bool = False) -> tuple[str, ...]:
    """The modes' order in a round: plain and XLA swap places every round; cold comes before its warm run; the
    one-process pair (`inproc`, warm) last. With the control (plain again), the warm run sits between the round's two
    plain processes, plain first in one round and plain again first in the next: the host of this VM slows every
    process down by up to 35% for minutes at a time (session 36: cold, XLA and warm at 31.4-44.0 ms a step between
    plain runs at 23.2 and 23.4 ms, nothing else on the machine), so the warm wall is judged against the mean of the
    two plain runs beside it (`_beside`), which a slow window hits as often as the run between them."""
    if control:
        return (
            ("cold", "xla", "plain", "warm", AGAIN) if round_ % 2 == 0 else ("xla", "cold", AGAIN, "warm", "plain")
        ) + (("inproc",) if inproc else ())
    order: tuple[str, ...] = ("plain", "cold", "xla", "warm") if round_ % 2 == 0 else ("xla", "cold", "plain", "warm")
    return (*order, "inproc") if inproc else order


def _tables(results: dict[str, dict[str, list[dict[str, Any]]]], inproc: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The table of separate processes, then the one-process pairs' (`ab_interleaved.table`) where they ran."""
    lines = table(_complete(results))
    runs = {job: found for job, found in inproc.items() if found}
    if runs:
        lines += ["", *ab_interleaved.table(runs, _claimed)]
    return lines


def _noise(by_mode: dict[str, list[dict[str, Any]]], key: str) -> float:
    """The noise of one run's `key` figure minus plain TF's of the same round. With the control: the root mean
    square over the rounds of plain TF's minus plain TF's again (what two plain processes of one round differ by;
    defined from one round on). Without it: the spread of plain TF's figure over the rounds, x sqrt 2 (a difference
    of two runs), nan with one round."""
    pairs = [
        (p[key], a[key])
        for p, a in zip(by_mode["plain"], by_mode.get(AGAIN, []), strict=False)
        if key in p and key in a
    ]
    if pairs:
        return math.sqrt(statistics.fmean((p - a) ** 2 for p, a in pairs))
    values = [r[key] for r in by_mode["plain"] if key in r]
    return statistics.stdev(values) * 2**0.5 if len(values) > 1 else float("nan")


def _noise_width(by_mode: dict[str, list[dict[str, Any]]], key: str) -> float:
    """How many of `_noise` a clock may lie from a claim and still agree with it: the 97.5% quantile of Student's t
    for the degrees of freedom `_noise` is measured with (the rounds with plain TF again; without it, the rounds less
    one), nan with none. Two times the noise took an estimate from two rounds for a known spread: a run as written
    (BERT's, setup skipped) stood 1.3-1.4 s from the mean of plain processes 0.2-0.3 s apart (session 54), where
    t(2) is 4.30."""
    pairs = sum(1 for p, a in zip(by_mode["plain"], by_mode.get(AGAIN, []), strict=False) if key in p and key in a)
    df = pairs if pairs else sum(1 for r in by_mode["plain"] if key in r) - 1
    return paired.t_quantile(df) if df >= 1 else float("nan")


def _claimed(run: dict[str, Any]) -> str:
    """A run's claim as the report books it: the net (claimed gross minus its setup and plugin overhead, as the
    report's net) and the measured saving's 95% interval; a gross of 0 "within noise" when that interval holds zero,
    and none without stitched windows: then the net is minus the setup and overhead (never a saving)."""
    low, high = run["interval"]
    overhead = run.get("overhead", 0.0)  # records written before the report booked it have none
    costs = f"setup {run['setup']:.2f}, overhead {overhead:.2f}"
    net = run["claimed_gross"] - run["setup"] - overhead
    if run["measured_gross"] == 0.0 and not math.isfinite(low):
        return f"{net:+.2f} (no stitched windows; {costs})"
    interval = f"[{low:+.2f}, {high:+.2f}]" if math.isfinite(low) else "[no interval: < 3 paired windows]"
    if run["claimed_gross"] == 0.0:
        return f"{net:+.2f} (gross 0 within noise, measured {run['measured_gross']:+.2f} {interval}; {costs})"
    return f"{net:+.2f} (gross {run['claimed_gross']:+.2f} {interval}; {costs})"


def _agrees(
    plain: dict[str, Any], run: dict[str, Any], noise: tuple[float, float], width: tuple[float, float] = (2.0, 2.0)
) -> str:
    """Whether the report agrees with the clock: the steps' measured difference from plain TF (`plain`: the round's
    run, or the mean of its two plain runs: `_plain_beside`) lies in the report's interval of the saving, less the
    setup it booked from steps and the plugin overhead it booked (both spent in the steps), widened by `width` times
    the measured difference's own noise (`noise`: steps', wall's; `_noise_width`).

    A corpus program (`clock` "wall") says nothing of which part of its setup fell in its steps: its whole wall
    against the claim less its whole setup, by the wall's noise. Before, its steps' difference was judged with none
    of its setup booked (the corpus BERT's cold run: "no" at -20.3 s for a claim that booked 14.9 s of setup before
    and in its steps). Stricter too: what the plugin spends that the report books nowhere (its imports, a larger
    session's creation) counts against the claim. "n/a" with one round without the control (no noise to judge by)."""
    steps_noise, wall_noise = noise
    if run.get("clock") == "wall":
        if math.isnan(wall_noise):
            return "n/a"
        whole = {**run, "setup_from_steps": run["setup"]}
        return ab_interleaved.agrees(whole, plain["wall"] - run["wall"], wall_noise, width[1]) + " (wall)"
    if math.isnan(steps_noise):
        return "n/a"
    return ab_interleaved.agrees(run, plain["steps_seconds"] - run["steps_seconds"], steps_noise, width[0])


def _plain_beside(
    plain: dict[str, Any], again: dict[str, Any] | None, noise: tuple[float, float]
) -> tuple[dict[str, Any], tuple[float, float]]:
    """What a run of the round is judged against (`_agrees`): the mean of the round's plain and plain again runs
    (their wall and steps' seconds) where both finished, else plain TF's; and the noise of the run's difference from
    it. Against the mean of the two the difference's variance is 3/4 of that against one of them (one run's variance
    and half of another's, where `_noise` measures two), so the noise is sqrt(3/4) of the given one. Why the mean:
    the host of this VM slows every process down for minutes at a time (session 36: BERT's warm run 13.4 s faster
    than one slow plain run, booked "no" with nothing claimed), and the warm run sits between the two (`_order`)."""
    keys = ("wall", "steps_seconds")
    if again is None or "error" in again or not all(key in again and key in plain for key in keys):
        return plain, noise
    mean = {**plain, **{key: (plain[key] + again[key]) / 2 for key in keys}}
    return mean, (noise[0] * math.sqrt(0.75), noise[1] * math.sqrt(0.75))


def _walls(kept: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """A run's wall against its round's plain run, per round: the whole process, and up to its last step's end
    (`to_last`; "-" in records that lack it); with more than one round, the medians over the rounds after them."""

    def ratios(key: str) -> list[float | None]:
        return [r[key] / p[key] if key in p and key in r else None for p, r in kept]

    def cell(value: float | None) -> str:
        return f"{value:.3f}x" if value is not None else "-"

    walls, lasts = ratios("wall"), ratios("to_last")
    text = " / ".join(f"{cell(w)}; {cell(t)}" for w, t in zip(walls, lasts, strict=True))
    if len(kept) > 1:
        medians = [
            statistics.median(v for v in values if v is not None) if None not in values else None
            for values in (walls, lasts)
        ]
        text += f" (median {cell(medians[0])}; {cell(medians[1])})"
    return text


def _beside(runs: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]) -> str:
    """A run's wall against the mean of its round's two plain processes (plain, plain again), per round, with the
    median over the rounds; "-" for a round where either plain run failed or lacks a wall. The warm run sits between
    them (`_order`), so a slow window of the host that hits it hits one of them as often: the figure issue 29's warm
    wall is judged by. Empty without the control."""
    ratios = [
        2 * r["wall"] / (p["wall"] + a["wall"]) if all("wall" in x for x in (p, a, r)) else None for p, a, r in runs
    ]
    if not ratios:
        return ""
    text = " / ".join(f"{v:.3f}x" if v is not None else "-" for v in ratios)
    found = [v for v in ratios if v is not None]
    return text + (f" (median {statistics.median(found):.3f}x)" if len(ratios) > 1 and found else "")


def _steals(runs: Iterable[dict[str, Any]]) -> str:
    """The share of the CPU the host stole during each round's run (`_stolen`), "-" where it was not read."""
    return " / ".join(f"{run['steal'] * 100:.1f}" if "steal" in run else "-" for run in runs)


def _paired(in_job: list[float]) -> str:
    """A run's in-job ratio (`_in_job`) for the table's cell; "-" where it had no paired stitched window."""
    if not in_job:
        return "-"
    pooled, median, low, high, windows = in_job
    return f"{median:.3f}x ({low:.3f}-{high:.3f}; pooled {pooled:.3f}x; {windows:.0f})"


CLOSE_SHOWN = 1.0  # seconds of TF's own session close worth showing beside a wall


def _less_close(run: dict[str, Any]) -> dict[str, Any]:
    """A corpus run with TensorFlow's own longest session close (`tf_close`) left out of its wall, the whole wall kept
    as `whole`: what every figure of the table judges by. Other runs, and records without the figure, as they are."""
    if "tf_close" not in run or "wall" not in run:
        return run
    return {**run, "whole": run["wall"], "wall": run["wall"] - run["tf_close"]}


def _wall_cell(run: dict[str, Any]) -> str:
    """A run's wall for the table: the error that stopped it, or its wall (less TF's close, `_less_close`), with the
    close's seconds where it took over CLOSE_SHOWN."""
    if "error" in run:
        return f"({run['error']})"
    closing = run.get("tf_close", 0.0)
    return f"{run['wall']:.1f}" + (f" (+{closing:.1f} TF close)" if closing > CLOSE_SHOWN else "")


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    """The A/B's Markdown table (`results`: job -> mode -> one run per round), corpus walls less TF's longest close."""
    results = {job: {mode: [_less_close(r) for r in runs] for mode, runs in by.items()} for job, by in results.items()}
    lines = [
        "| job | mode | wall s, less TF's own longest session close (per round) |"
        " vs plain: wall; to the last step (per round) |"
        " wall vs the mean of the round's plain and plain again (per round) |"
        " CPU stolen by the host, % (per round) | steady ms | vs plain steady"
        " | loss first -> last | decided (last round) |"
        " claimed net s (gross, 95% interval) per round | measured vs plain s: steps / wall (per round) |"
        " noise s: steps / wall | clock in the claim's interval (steps; a corpus program's wall; against the"
        " mean of the round's plain runs; Student's t for the noise's rounds x noise) |"
        " in the job: stitched vs paired baseline, last half: windows' median (middle half; pooled; windows) |",
        "|---|---|---|---|---|---|---:|---:|---|---|---|---|---|---|---|",
    ]
    for job, by_mode in results.items():
        plain = [r for r in by_mode["plain"] if "error" not in r]
        wall_noise, steps_noise = _noise(by_mode, "wall"), _noise(by_mode, "steps_seconds")
        width = (_noise_width(by_mode, "steps_seconds"), _noise_width(by_mode, "wall"))
        plain_steady = statistics.median(r["steady"] for r in plain) if plain else float("nan")
        again = by_mode.get(AGAIN, [])
        for mode in by_mode:
            # per round, the run and its round's plain run; a round where either failed or was stopped is said, and
            # its figures left out of this row's
            rounds = list(zip(by_mode["plain"], by_mode[mode], strict=False))
            walls = " / ".join(_wall_cell(r) for _, r in rounds)
            kept = [(p, r) for p, r in rounds if "error" not in p and "error" not in r]
            runs = [r for _, r in kept]
            if not runs:
                lines.append(f"| {job} | {mode} | {walls} |||||||||||||")
                continue
            steady = statistics.median(r["steady"] for r in runs)
            loss = f"{runs[-1]['losses'][0]:.4f} -> {runs[-1]['losses'][1]:.4f}"
            decided = runs[-1].get("decided", "")
            claimed = measured = agrees = noise = in_job = beside = ""
            if mode not in ("plain", AGAIN):
                beside = _beside([(p, a, r) for p, a, r in zip(by_mode["plain"], again, by_mode[mode], strict=False)])
            if mode != "plain":
                measured = "; ".join(
                    f"{p['steps_seconds'] - r['steps_seconds']:+.1f} / {p['wall'] - r['wall']:+.1f}" for p, r in kept
                )
                noise = f"{steps_noise:.1f} / {wall_noise:.1f}"
            if "claimed_gross" in runs[-1]:
                claimed = "; ".join(_claimed(r) for r in runs)
                agreed = []
                for (p, r), a in itertools.zip_longest(rounds, again[: len(rounds)]):  # None: no plain again
                    if "error" not in p and "error" not in r:
                        reference, noise_beside = _plain_beside(p, a, (steps_noise, wall_noise))
                        agreed.append(_agrees(reference, r, noise_beside, width))
                agrees = " / ".join(agreed)
                in_job = " / ".join(_paired(r.get("in_job", [])) for r in runs)
            lines.append(
                f"| {job} | {mode} | {walls} | {_walls(kept)} | {beside} | {_steals(r for _, r in rounds)}"
                f" | {steady * 1e3:.2f}"
                f" | {steady / plain_steady:.3f}x | {loss} | {decided}"
                f" | {claimed} | {measured} | {noise} | {agrees} | {in_job} |"
            )
    return lines


def _progress(where: str, found: dict[str, Any], elapsed: float) -> str:
    """One line per finished run: where the A/B is, what the run took."""
    where = f"  [{elapsed / 60:5.1f} min] {where}"
    if "error" in found:
        return f"{where}: error: {found['error']}"
    decided = f", {found['decided']}" if found.get("decided") else ""
    if "ratio" in found:  # a one-process pair (`ab_interleaved`)
        ratio = f"plugin vs plain in one process {found['ratio'][0]:.3f}x"
        saved = f"saved {found['difference']:+.2f} s (noise {found['noise']:.2f})"
        return f"{where}: {ratio}, {saved}, steady {found['steady'] * 1e3:.2f} ms{decided}"
    steal = f", {found['steal']:.1%} of the CPU stolen" if "steal" in found else ""
    closing = f" (of it TF's session close {found['tf_close']:.1f} s)" if "tf_close" in found else ""
    return f"{where}: wall {found['wall']:.1f} s{closing}{steal}, steady {found['steady'] * 1e3:.2f} ms{decided}"


def _resumed(
    path: Path, results: dict[str, dict[str, list[dict[str, Any]]]], inproc: dict[str, list[dict[str, Any]]]
) -> int:
    """Runs read back from a --record file into `results`, in their rounds' order, complete rounds only; how many.
    The fleet's memory (the telemetry of earlier rounds) is not read back: a resumed round's warm run starts without
    it, as a first round's does."""
    count = 0
    if not path.exists():
        return 0
    others = []  # runs of jobs not asked for this time: kept in the record as they are
    for line in path.read_text().splitlines():
        run = json.loads(line)
        job, mode = run.pop("job"), run.pop("mode")
        run.pop("round", None)
        if mode == "inproc" and job in inproc:
            inproc[job].append(run)
        elif job in results and mode in results[job]:
            results[job][mode].append(run)
        else:
            others.append(line + "\n")
    for job, by_mode in results.items():  # a round cut short runs again in full (its one-process pair too)
        rounds = min(map(len, by_mode.values()))
        for runs in [*by_mode.values(), *([inproc[job]] if job in inproc else [])]:
            del runs[rounds:]
            count += len(runs)
    # the record keeps what was read back, so the runs appended next follow the complete rounds they extend
    kept = [
        {"job": job, "mode": mode, "round": r, **run}
        for job, by_mode in results.items()
        for mode, runs in [*by_mode.items(), *([("inproc", inproc[job])] if job in inproc else [])]
        for r, run in enumerate(runs)
    ]
    path.write_text("".join(others) + "".join(json.dumps(run) + "\n" for run in sorted(kept, key=lambda r: r["round"])))
    return count


def _complete(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The jobs' complete rounds only (every mode ran), so the table compares runs of the same rounds."""
    complete = {}
    for job, by_mode in results.items():
        rounds = min(len(runs) for runs in by_mode.values())
        if rounds:
            complete[job] = {mode: runs[:rounds] for mode, runs in by_mode.items()}
    return complete


def _shipped_op(cache: str) -> None:
    """Puts the native TF op into a cold run's empty kernel cache, as a pod finds it prebuilt in the shim image
    (images/shim.Containerfile): a job never builds it, so a cold run here compiles its kernels only. Built once into
    this machine's own cache (`stitchfleet demo` does the same), copied from there."""
    from stitchfleet.compiler import targets
    from stitchfleet.plugin.native import dispatch_op

    if not targets.profile("cpu").native_op:
        return
    built = dispatch_op.library_path(settings.current().cache_dir)
    target = dispatch_op.cached_library(Path(cache))
    if built != target:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


def _job(spec: str, steps: int) -> tuple[str, int]:
    """`JOB[:STEPS]` of --jobs: one of JOBS and its length (default --steps, else the job's own: STEPS)."""
    name, _, count = spec.partition(":")
    if name not in JOBS:
        raise SystemExit(f"ab_jobs: --jobs {spec!r}: no job {name!r} (the jobs: {', '.join(JOBS)})")
    if not count.isdigit() and count:
        raise SystemExit(f"ab_jobs: --jobs {spec!r}: the steps after ':' must be a whole number")
    return name, int(count) if count else steps or STEPS[name]


def _program(spec: str, steps: int) -> tuple[str, int]:
    """`PROGRAM[:STEPS]` of --corpus: the program's file in the corpus directory and its step cap."""
    name, _, count = spec.partition(":")
    if not count.isdigit() and count:
        raise SystemExit(f"ab_jobs: --corpus {spec!r}: the steps after ':' must be a whole number")
    return name, int(count) if count else steps or 200


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ab_jobs.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", nargs="*", default=list(JOBS), metavar="JOB[:STEPS]", help=f"jobs of this script: {', '.join(JOBS)}"
    )
    parser.add_argument(
        "--corpus", nargs="*", default=[], metavar="PROGRAM[:STEPS]", help="corpus programs ($STITCHFLEET_CORPUS_DIR)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="steps per job (default: each job's own)")
    parser.add_argument("--out", type=Path, default=None, help="a Markdown file the table is appended to")
    parser.add_argument(
        "--limit", type=float, default=4.0, help="stop a run beyond this many times the job's plain wall (0: none)"
    )
    parser.add_argument(
        "--no-inproc",
        dest="inproc",
        action="store_false",
        help="skip the one-process pair (plain and warm plugin alternated by chunks) of this script's jobs",
    )
    parser.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="skip the control: plain TF a second time each round (the noise of two processes' difference)",
    )
    parser.add_argument("--record", type=Path, default=None, help="a JSON-lines file each run is appended to")
    parser.add_argument("--resume", type=Path, default=None, help="a --record file to read back and go on with")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", default="", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        job, mode = args.child
        child = _child_inproc(job, args.steps, args.state, args.fleet, args.control) if mode == "inproc" else None
        print(json.dumps(child or _child(job, mode, args.steps, args.state, args.fleet)))
        return 0
    own = dict(_job(spec, args.steps) for spec in args.jobs)
    programs = dict(_program(spec, args.steps) for spec in args.corpus)
    jobs = [*own, *programs]
    modes = (*MODES, AGAIN) if args.control else MODES
    results: dict[str, dict[str, list[dict[str, Any]]]] = {job: {m: [] for m in modes} for job in jobs}
    inproc: dict[str, list[dict[str, Any]]] = {job: [] for job in own if args.inproc}  # `ab_interleaved`
    # Each run's figures as one JSON line as soon as it ends, so a run cut short (a time limit) still leaves what it
    # measured; --resume reads them back and runs only what is missing.
    if args.resume:
        print(f"  {_resumed(args.resume, results, inproc)} runs read back from {args.resume}", flush=True)
    record = (args.resume or args.record).open("a") if (args.resume or args.record) else None
    started = time.perf_counter()
    idle = idle_policy.read().describe()  # every figure below ran under it: say so with the table
    print(f"  {idle}", flush=True)
    with tempfile.TemporaryDirectory() as fleets:  # per job, its telemetry over the rounds: the fleet's memory
        for r in range(args.rounds):
            for job in jobs:
                if all(len(results[job][m]) > r for m in modes) and (job not in inproc or len(inproc[job]) > r):
                    continue  # this round of this job was read back from the record
                fleet = Path(fleets) / job
                fleet.mkdir(exist_ok=True)
                with tempfile.TemporaryDirectory() as cache:  # cold: an empty kernel cache; warm: the same, filled
                    _shipped_op(cache)
                    for mode in _order(r, job in inproc, args.control):
                        if mode != "inproc" and len(results[job][mode]) > r:
                            continue  # read back from the record
                        known = (
                            _known_step_ms(results[job]["plain"], results[job].get(AGAIN, []), r)
                            if mode in ("warm", "inproc")
                            else 0.0
                        )
                        limit = _limit(results[job]["plain"], args.limit, mode)
                        dirs = (cache, str(fleet))
                        run = (
                            functools.partial(_corpus_run, job, mode, programs[job], *dirs, step_ms=known, limit=limit)
                            if job in programs
                            else functools.partial(
                                _run, job, mode, own[job], *dirs, step_ms=known, limit=limit, control=args.control
                            )
                        )
                        found = _watched(run)
                        (inproc[job] if mode == "inproc" else results[job][mode]).append(found)
                        where = f"round {r + 1}/{args.rounds}: {job} {mode}"
                        print(_progress(where, found, time.perf_counter() - started), flush=True)
                        if record is not None:
                            record.write(json.dumps({"job": job, "mode": mode, "round": r, **found}) + "\n")
                            record.flush()
            print("\n".join(_tables(results, inproc)), flush=True)  # the tables so far, after every round
    if record is not None:
        record.close()
    lines = [f"The machine's {idle}.", "", *_tables(results, inproc)]
    print("\n".join(lines))
    if args.out:
        with args.out.open("a") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
