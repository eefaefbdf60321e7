"""A/B of whole TF1 jobs (figures, not tests): plain TF, XLA auto-clustering, the plugin cold and warm, alternated.

Input: the command line (jobs of the corpus, steps per job, rounds). Output: one Markdown table on stdout (and
appended to --out when given): per job and mode, wall seconds (process start of the job to its end: graph,
session, setup, steps), the steady step (median of the last half), first and last loss, what the plugin decided,
the report's claimed saving (gross and net, from the job's telemetry) against the measured difference from plain
TF in the same round (wall), with the noise (spread of plain TF's walls over the rounds).

Each run is its own process (XLA's flags are read at import; a cold plugin has an empty kernel cache); the rounds
alternate the modes' order, the warm run reuses its round's cold cache. Jobs run in a MonitoredSession with a
StopAtStepHook, as users write them, so the plugin knows their length.

    PYTHONPATH=. python scripts/ab_jobs.py --jobs demo mlp transformer --rounds 2
"""

from __future__ import annotations

import argparse
import json
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


def _child(job: str, mode: str, steps: int, state: str) -> dict[str, Any]:
    """One job in this process; its figures as a dict."""
    started = time.perf_counter()
    import tensorflow as tf

    from stitchfleet import settings
    from stitchfleet.plugin.session.hook import StitchHook

    graph, loss, train_op, feeds = JOBS[job]()
    hook = None
    url = f"sqlite:///{Path(state) / 'telemetry.db'}"
    if mode in ("cold", "warm"):
        env = {**os.environ, "STITCHFLEET_STATE_DIR": state, "STITCHFLEET_JOB_NAME": f"ab-{job}"}
        hook = StitchHook(settings.load(env), db_url=url)
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
        "steady": statistics.median(times[len(times) // 2 :]),
        "losses": [losses[0], losses[-1]],
        "steps": len(times),
    }
    if hook is not None:
        found.update(_plugin_figures(hook, url))
    return found


def _plugin_figures(hook: Any, url: str) -> dict[str, Any]:
    """What the plugin decided and what its telemetry claims (saved seconds of its windows, setup seconds)."""
    import sqlalchemy as sa

    controller = hook.controller
    if controller is None:
        decided = "setup skipped (job too short)" if not hook.installed else "off"
    elif controller.job_reverted:
        decided = f"reverted: {controller.job_reverted[:60]}"
    elif controller.stitching_off:
        decided = f"off: {controller.stitching_off[:60]}"
    else:
        kept = sum(bool(c.kept) and c.enabled for c in controller.clusters)
        decided = f"{kept}/{len(controller.clusters)} kept, group {'proven' if controller.group_proven else 'not'}"
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            saved = connection.execute(sa.text("select coalesce(sum(saved_seconds), 0) from step_windows")).scalar()
            setup = connection.execute(sa.text("select coalesce(max(compile_seconds), 0) from jobs")).scalar()
    finally:
        engine.dispose()
    return {"decided": decided, "claimed_gross": float(saved or 0.0), "setup": float(setup or 0.0)}


def _run(job: str, mode: str, steps: int, cache: str) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "STITCHFLEET_CACHE_DIR": cache}
    if mode == "xla":
        env["TF_XLA_FLAGS"] = XLA_FLAGS
    with tempfile.TemporaryDirectory() as state:
        argv = [sys.executable, __file__, "--child", job, mode, "--steps", str(steps), "--state", state]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"}
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _order(round_: int) -> tuple[str, ...]:
    """The modes' order in a round: plain and XLA swap places every round; cold comes before its warm run."""
    return ("plain", "cold", "xla", "warm") if round_ % 2 == 0 else ("xla", "cold", "plain", "warm")


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    lines = [
        "| job | mode | wall s (per round) | steady ms | vs plain steady | loss first -> last | decided |"
        " claimed gross / net s (per round) | measured wall vs plain s (per round) | noise s |",
        "|---|---|---|---:|---:|---|---|---|---|---:|",
    ]
    for job, by_mode in results.items():
        plain = [r for r in by_mode["plain"] if "error" not in r]
        plain_walls = [r["wall"] for r in plain]
        noise = statistics.stdev(plain_walls) * 2**0.5 if len(plain_walls) > 1 else float("nan")
        plain_steady = statistics.median(r["steady"] for r in plain) if plain else float("nan")
        for mode in MODES:
            runs = by_mode[mode]
            if any("error" in r for r in runs):
                lines.append(f"| {job} | {mode} | error: {next(r['error'] for r in runs if 'error' in r)} |||||||")
                continue
            walls = " / ".join(f"{r['wall']:.1f}" for r in runs)
            steady = statistics.median(r["steady"] for r in runs)
            loss = f"{runs[-1]['losses'][0]:.4f} -> {runs[-1]['losses'][1]:.4f}"
            decided = runs[-1].get("decided", "")
            claimed = measured = ""
            if "claimed_gross" in runs[-1]:
                gross = [r["claimed_gross"] for r in runs]
                net = [r["claimed_gross"] - r["setup"] for r in runs]
                claimed = "; ".join(f"{g:+.2f} / {n:+.2f}" for g, n in zip(gross, net, strict=True))
            if mode != "plain":
                measured = " / ".join(f"{p['wall'] - r['wall']:+.1f}" for p, r in zip(plain, runs, strict=False))
            lines.append(
                f"| {job} | {mode} | {walls} | {steady * 1e3:.2f} | {steady / plain_steady:.3f}x | {loss} | {decided}"
                f" | {claimed} | {measured} | {noise:.1f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ab_jobs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0, help="steps per job (default: each job's own)")
    parser.add_argument("--out", type=Path, default=None, help="a Markdown file the table is appended to")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        job, mode = args.child
        print(json.dumps(_child(job, mode, args.steps, args.state)))
        return 0
    results: dict[str, dict[str, list[dict[str, Any]]]] = {job: {m: [] for m in MODES} for job in args.jobs}
    for r in range(args.rounds):
        for job in args.jobs:
            with tempfile.TemporaryDirectory() as cache:  # cold: an empty kernel cache; warm: the same, filled
                for mode in _order(r):
                    print(f"  round {r + 1}/{args.rounds}: {job} {mode}", flush=True)
                    results[job][mode].append(_run(job, mode, args.steps or STEPS[job], cache))
    lines = table(results)
    print("\n".join(lines))
    if args.out:
        with args.out.open("a") as out:
            out.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
