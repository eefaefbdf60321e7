"""A/B of whole TF1 jobs (figures, not tests): plain TF, XLA auto-clustering, the plugin cold and warm, alternated.

Input: the command line (jobs of the corpus, steps per job, rounds). Output: one Markdown table on stdout (and
appended to --out when given): per job and mode, wall seconds (process start of the job to its end: graph,
session, setup, steps), the steady step (median of the last half), first and last loss, what the plugin decided,
the report's claimed saving (net: the job's windows' gross minus its setup, from its telemetry, per device back
to the rank's seconds, with the windows' noise) against the measured difference from plain TF in the same round
(steps alone, and wall), with the noise of the measured difference (spread of plain TF's over the rounds).

Each run is its own process (XLA's flags are read at import; a cold plugin has an empty kernel cache); the rounds
alternate the modes' order, the warm run reuses its round's cold cache. Every plugin run of a job records into one
telemetry database kept over the rounds: the fleet's memory, so a later run knows what earlier runs' probes found
(with STITCHFLEET_SLOWER_JOBS=2, from the second round on). Jobs run in a MonitoredSession with a StopAtStepHook,
as users write them, so the plugin knows their length; a warm run is also told the job's plain step time (the
round's plain run's steady step: what an operator's memory of earlier runs says), so it decides whether its setup
can pay back at all (plugin/setup/payback.py); a cold run, the job's first, is not told.

Programs of the corpus of real TF1 programs (tests/corpus/README.md; their copies outside the checkout, in
$STITCHFLEET_CORPUS_DIR) join with `--corpus`: each run is the program in its own interpreter, plain
(`STITCHFLEET_ENABLED=0`), under XLA's flags, or under the boot shim with the plugin's default settings (as the
admission webhook injects it); its step times are the gaps between its per-step `CORPUS_LOSS` lines as they
arrive, its decisions and claims are read from the telemetry database its runs share over the rounds.

    PYTHONPATH=. python scripts/ab_jobs.py --jobs demo mlp transformer --rounds 2
    STITCHFLEET_CORPUS_DIR=DIR PYTHONPATH=. python scripts/ab_jobs.py --jobs --corpus models_cifar10_train.py:300
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODES = ("plain", "xla", "cold", "warm")
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
        tf.compat.v1.set_random_seed(0)
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
        tf.compat.v1.set_random_seed(0)
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

    from stitchfleet import settings
    from stitchfleet.plugin.session.hook import StitchHook

    graph, loss, train_op, feeds = JOBS[job]()
    hook = None
    url = f"sqlite:///{Path(fleet) / 'telemetry.db'}"
    uid = f"{mode}-{time.time_ns()}"
    if mode in ("cold", "warm"):
        env = {**os.environ, "STITCHFLEET_STATE_DIR": state, "STITCHFLEET_JOB_NAME": f"ab-{job}"}
        hook = StitchHook(settings.load({**env, "STITCHFLEET_JOB_UID": uid}), db_url=url)
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        step_up = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
        stop = tf.compat.v1.train.StopAtStepHook(num_steps=steps)
        times, losses = [], []
        with tf.compat.v1.train.MonitoredSession(hooks=[h for h in (hook, stop) if h is not None]) as session:
            while not session.should_stop():
                began = time.perf_counter()
                value, _, _ = session.run([loss, train_op, step_up], feeds)
                times.append(time.perf_counter() - began)
                losses.append(float(value))
    wall = time.perf_counter() - started
    found: dict[str, Any] = {
        "wall": wall,
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


def _plugin_figures(hook: Any, url: str, uid: str) -> dict[str, Any]:
    """What the plugin decided and what its report claims: its windows' saved seconds and its setup seconds (per
    device, the rank's seconds), the windows' noise, and the setup it booked from steps (warmup builds, first
    runs: in the steps' time, where `begin`'s compile is not)."""
    import sqlalchemy as sa

    controller = hook.controller
    if controller is None:
        skipped = hook.length.skipped
        decided = f"setup skipped: {skipped[:60]}" if skipped else "off" if hook.installed else "nothing stitched"
    elif controller.job_reverted:
        decided = f"reverted: {controller.job_reverted[:60]}"
    elif controller.stitching_off:
        decided = f"off: {controller.stitching_off[:60]}"
    else:
        kept = sum(bool(c.kept) and c.enabled for c in controller.clusters)
        decided = f"{kept}/{len(controller.clusters)} kept, group {'proven' if controller.group_proven else 'not'}"
    if controller is not None and controller.group_probe.startswith("group probe skipped"):
        decided += " (group known to the fleet)"
    mine = "select id from jobs where job_uid = :uid"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            query = f"select coalesce(sum(saved_seconds), 0) from step_windows where job_id in ({mine})"
            saved = connection.execute(sa.text(query), {"uid": uid}).scalar()
            query = f"select coalesce(max(compile_seconds), 0) from jobs where id in ({mine})"
            setup = connection.execute(sa.text(query), {"uid": uid}).scalar()
    finally:
        engine.dispose()
    from_steps = (controller.warmup.seconds or 0.0) + controller.first_seconds if controller is not None else 0.0
    noise = controller.saved_variance**0.5 if controller is not None else 0.0
    return {
        "decided": decided,
        "claimed_gross": float(saved or 0.0),
        "setup": float(setup or 0.0),
        "setup_from_steps": from_steps,
        "claim_noise": noise,
    }


def _run(job: str, mode: str, steps: int, cache: str, fleet: str, *, step_ms: float = 0.0) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "STITCHFLEET_CACHE_DIR": cache}
    env["STITCHFLEET_STEP_MS"] = f"{step_ms:.6f}"  # the plain step time the fleet knows (0: unknown)
    if mode == "xla":
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    with tempfile.TemporaryDirectory() as state:
        argv = [sys.executable, __file__, "--child", job, mode, "--steps", str(steps), "--state", state]
        argv += ["--fleet", fleet]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"}
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _corpus_run(program: str, mode: str, steps: int, cache: str, fleet: str, *, step_ms: float = 0.0) -> dict[str, Any]:
    """One corpus program in its own interpreter (`tests/corpus/corpus_runs`' wrapper), timed line by line."""
    from tests.corpus import corpus_runs

    uid = f"{mode}-{time.time_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCHFLEET_") and k != "TF_XLA_FLAGS"}
    env.update(
        PYTHONPATH=f"{ROOT / 'stitchfleet' / 'boot'}{os.pathsep}{ROOT}",
        STITCHFLEET_ENABLED="1" if mode in ("cold", "warm") else "0",
        STITCHFLEET_STATE_DIR=fleet,  # the job's telemetry over the rounds: the fleet's memory
        STITCHFLEET_CACHE_DIR=cache,
        STITCHFLEET_JOB_UID=uid,
        STITCHFLEET_JOB_NAME=f"ab-{program}",
        STITCHFLEET_STEP_MS=f"{step_ms:.6f}",
        CORPUS_STEPS=str(steps),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    if mode == "xla":
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    arrivals: list[float] = []
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as scratch:
        env["CORPUS_DIR"] = str(Path(scratch) / "checkpoints")
        argv = [sys.executable, "-c", corpus_runs.WRAPPER, str(corpus_runs.program_path(program))]
        started = time.perf_counter()
        with tempfile.TemporaryFile("w+") as errors:
            child = subprocess.Popen(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
            assert child.stdout is not None
            for line in child.stdout:  # a loss line per step, read as it comes: the gaps are the step times
                found = corpus_runs.LOSS.match(line.strip())
                if found:
                    arrivals.append(time.perf_counter())
                    losses.append(float(found.group(2)))
            code = child.wait(timeout=1800)
            wall = time.perf_counter() - started
            errors.seek(0)
            log = errors.read()
    if code != 0 or len(arrivals) < 4:
        return {"error": (log.strip().splitlines() or ["failed"])[-1][:200]}
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    figures: dict[str, Any] = {
        "wall": wall,
        "steps_seconds": arrivals[-1] - arrivals[0],  # every step after the first (its executor build)
        "steady": statistics.median(gaps[len(gaps) // 2 :]),
        "losses": [losses[0], losses[-1]],
        "steps": len(losses),
    }
    if mode in ("cold", "warm"):
        stitched = corpus_runs.STITCHED.search(log)
        figures.update(_corpus_claims(Path(fleet) / "telemetry.db", uid, stitched.group(0) if stitched else ""))
    return figures


def _corpus_claims(path: Path, uid: str, stitched: str) -> dict[str, Any]:
    """A shimmed corpus run's decisions and claims, read from the telemetry database: its reverts, its job verdict,
    else its last setup event; its windows' saved seconds and its setup seconds. The claim's own noise is not in the
    database: 0 (the agreement column then judges by the measured difference's noise alone)."""
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
            saved = rows(f"select coalesce(sum(saved_seconds), 0) from step_windows where job_id in ({mine})")
            setup = rows(f"select coalesce(max(compile_seconds), 0) from jobs where id in ({mine})")
    finally:
        engine.dispose()
    if reverts:
        decided = f"reverted: {(reverts[0][0] or '').splitlines()[0][:60]}"
    elif verdicts:
        decided = f"{verdicts[-1][0]}: {(verdicts[-1][1] or '')[:60]}"
    elif setups:
        decided = (setups[-1][0] or "").splitlines()[0][:60]
    else:
        decided = "no setup recorded"
    if stitched:
        decided = f"{stitched.removeprefix('stitchfleet: ')}; {decided}"
    return {
        "decided": decided,
        "claimed_gross": float(saved[0][0] if saved else 0.0),
        "setup": float(setup[0][0] if setup else 0.0),
        "setup_from_steps": 0.0,
        "claim_noise": 0.0,
    }


def _known_step_ms(plain: list[dict[str, Any]]) -> float:
    """What the fleet's memory tells a warm run of the job's plain step time: the latest plain run's steady step
    (it runs before the warm run in every round: `_order`); 0 (unknown) when none finished."""
    done = [run["steady"] for run in plain if "steady" in run]
    return done[-1] * 1e3 if done else 0.0


def _order(round_: int) -> tuple[str, ...]:
    """The modes' order in a round: plain and XLA swap places every round; cold comes before its warm run."""
    return ("plain", "cold", "xla", "warm") if round_ % 2 == 0 else ("xla", "cold", "plain", "warm")


def _noise(values: list[float]) -> float:
    """The noise of one run's difference from plain TF: the spread of plain TF's own figure over the rounds,
    x sqrt 2 (a difference of two runs); nan with one round."""
    return statistics.stdev(values) * 2**0.5 if len(values) > 1 else float("nan")


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    lines = [
        "| job | mode | wall s (per round) | steady ms | vs plain steady | loss first -> last | decided (last round) |"
        " claimed net s +- noise (per round) | measured vs plain s: steps / wall (per round) |"
        " noise s: steps / wall | claim within 2x noise (steps) |",
        "|---|---|---|---:|---:|---|---|---|---|---|---|",
    ]
    for job, by_mode in results.items():
        plain = [r for r in by_mode["plain"] if "error" not in r]
        wall_noise = _noise([r["wall"] for r in plain])
        steps_noise = _noise([r["steps_seconds"] for r in plain])
        plain_steady = statistics.median(r["steady"] for r in plain) if plain else float("nan")
        for mode in MODES:
            runs = by_mode[mode]
            if any("error" in r for r in runs):
                lines.append(f"| {job} | {mode} | error: {next(r['error'] for r in runs if 'error' in r)} |||||||||")
                continue
            walls = " / ".join(f"{r['wall']:.1f}" for r in runs)
            steady = statistics.median(r["steady"] for r in runs)
            loss = f"{runs[-1]['losses'][0]:.4f} -> {runs[-1]['losses'][1]:.4f}"
            decided = runs[-1].get("decided", "")
            claimed = measured = agrees = noise = ""
            if mode != "plain":
                pairs = list(zip(plain, runs, strict=False))
                measured = "; ".join(
                    f"{p['steps_seconds'] - r['steps_seconds']:+.1f} / {p['wall'] - r['wall']:+.1f}" for p, r in pairs
                )
                noise = f"{steps_noise:.1f} / {wall_noise:.1f}"
            if "claimed_gross" in runs[-1]:
                # the claim on the steps: gross minus the setup booked from steps; the net: gross minus all setup
                claimed = "; ".join(f"{r['claimed_gross'] - r['setup']:+.2f} +- {r['claim_noise']:.2f}" for r in runs)
                agreements = []
                for p, r in zip(plain, runs, strict=False):
                    on_steps = r["claimed_gross"] - r["setup_from_steps"]
                    spread = (steps_noise**2 + r["claim_noise"] ** 2) ** 0.5
                    difference = p["steps_seconds"] - r["steps_seconds"]
                    if math.isnan(spread):  # one round: no noise to judge by
                        agreements.append("n/a")
                    else:
                        agreements.append("yes" if abs(on_steps - difference) <= 2 * spread else "no")
                agrees = " / ".join(agreements)
            lines.append(
                f"| {job} | {mode} | {walls} | {steady * 1e3:.2f} | {steady / plain_steady:.3f}x | {loss} | {decided}"
                f" | {claimed} | {measured} | {noise} | {agrees} |"
            )
    return lines


def _program(spec: str, steps: int) -> tuple[str, int]:
    """`PROGRAM[:STEPS]` of --corpus: the program's file in the corpus directory and its step cap."""
    name, _, count = spec.partition(":")
    if not count.isdigit() and count:
        raise SystemExit(f"ab_jobs: --corpus {spec!r}: the steps after ':' must be a whole number")
    return name, int(count) if count else steps or 200


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ab_jobs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="*", default=list(JOBS), choices=list(JOBS))
    parser.add_argument(
        "--corpus", nargs="*", default=[], metavar="PROGRAM[:STEPS]", help="corpus programs ($STITCHFLEET_CORPUS_DIR)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="steps per job (default: each job's own)")
    parser.add_argument("--out", type=Path, default=None, help="a Markdown file the table is appended to")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    parser.add_argument("--fleet", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        job, mode = args.child
        print(json.dumps(_child(job, mode, args.steps, args.state, args.fleet)))
        return 0
    programs = dict(_program(spec, args.steps) for spec in args.corpus)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        job: {m: [] for m in MODES} for job in [*args.jobs, *programs]
    }
    with tempfile.TemporaryDirectory() as fleets:  # per job, its telemetry over the rounds: the fleet's memory
        for r in range(args.rounds):
            for job in [*args.jobs, *programs]:
                fleet = Path(fleets) / job
                fleet.mkdir(exist_ok=True)
                with tempfile.TemporaryDirectory() as cache:  # cold: an empty kernel cache; warm: the same, filled
                    for mode in _order(r):
                        print(f"  round {r + 1}/{args.rounds}: {job} {mode}", flush=True)
                        known = _known_step_ms(results[job]["plain"]) if mode == "warm" else 0.0
                        if job in programs:
                            found = _corpus_run(job, mode, programs[job], cache, str(fleet), step_ms=known)
                        else:
                            found = _run(job, mode, args.steps or STEPS[job], cache, str(fleet), step_ms=known)
                        results[job][mode].append(found)
    lines = table(results)
    print("\n".join(lines))
    if args.out:
        with args.out.open("a") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
