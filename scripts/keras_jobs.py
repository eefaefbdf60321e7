"""Keras training jobs under the hook, as users run them (figures and a check, not a test).

Input: the command line (models from `benchmarks.keras_apps.KERAS_MODELS`, steps). Output: one row per
model on stdout (and `keras-jobs-<date>.md` under --out): steps, plain-TF wall time, hooked wall time,
the hook's setup (`begin`, compile and mapping; the executor builds of the first steps are not in
it), clusters installed and left to TF with the most common reasons, the largest relative
difference of the losses from plain TF, and whether anything reverted. Each model trains twice in
one process from the same seed: a plain MonitoredSession, then one with the StitchHook (every cluster
on from the first probe-free step, the guard checking as in production). A job that crashes, a loss
that differs beyond float32 rounding, or a revert shows in the row; the script exits 1 on a crash or
a loss difference above --rtol.

    PYTHONPATH=. python scripts/keras_jobs.py --models KerasTransformer ResNet50 --steps 12
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the hook imports TensorFlow: imported where a run needs it
    from stitchfleet.plugin.session.hook import StitchHook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class Row:
    model: str
    steps: int
    plain_s: float = 0.0
    hooked_s: float = 0.0
    setup_s: float = 0.0
    installed: int = 0
    off: int = 0
    reasons: str = ""
    max_rel: float = 0.0
    reverted: str = ""
    error: str = ""


def _build(name: str) -> tuple[Any, Any, Any, dict[Any, Any]]:
    """The model's training step as a job builds it, with one fixed batch of random feeds."""
    from benchmarks.keras_apps import BATCH, CLASSES, training_graph

    graph, loss, train = training_graph(name, as_job=True)
    rng = np.random.default_rng(0)
    labels = graph.get_tensor_by_name("labels:0")
    feeds: dict[Any, Any] = {labels: rng.integers(0, CLASSES, BATCH).astype(np.int32)}
    for op in graph.get_operations():
        if op.type == "Placeholder" and op.name != "labels":
            tensor = op.outputs[0]
            feeds[tensor] = rng.standard_normal(tensor.shape.as_list()).astype(np.float32)
    return graph, loss, train, feeds


def _train(name: str, steps: int, hook: StitchHook | None) -> tuple[list[float], float]:
    import tensorflow as tf

    graph, loss, train, feeds = _build(name)
    with graph.as_default():
        started = time.perf_counter()
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook is not None else []) as session:
            losses = [float(session.run([loss, train], feeds)[0]) for _ in range(steps)]
    return losses, time.perf_counter() - started


def _hook(tmp: Path, name: str) -> StitchHook:
    from stitchfleet import settings
    from stitchfleet.plugin.session.hook import StitchHook

    env = {
        "STITCHFLEET_STATE_DIR": str(tmp / "state"),
        "STITCHFLEET_CACHE_DIR": str(tmp / "cache"),
        "STITCHFLEET_JOB_UID": f"keras-{name}",
        "STITCHFLEET_WARMUP_STEPS": "2",
        "STITCHFLEET_BASELINE_STEPS": "2",
        "STITCHFLEET_CHECK_EVERY": "3",
        "STITCHFLEET_CHECK_FIRST": "2",
        "STITCHFLEET_PROBE_STEPS": "0",  # every cluster on after the baseline: what the guard must accept
    }
    return StitchHook(settings.load(env), backend="cpu", db_url=f"sqlite:///{tmp / 'telemetry.db'}")


def run_model(name: str, steps: int) -> Row:
    """One model, plain then hooked; the hook starts from an empty kernel cache (a job's first pod)."""
    row = Row(name, steps)
    try:
        plain, row.plain_s = _train(name, steps, None)
        hook = _hook(Path(tempfile.mkdtemp(prefix="keras-jobs-")), name)
        on, row.hooked_s = _train(name, steps, hook)
    except Exception as err:  # a crash is the finding: the row says so
        row.error = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        traceback.print_exc()
        return row
    row.setup_s = float(getattr(hook, "_setup_seconds", 0.0))
    row.installed, row.off = len(hook.installed), len(hook.off)
    counts = collections.Counter(reason.split(":")[0][:60] for reason in hook.off.values())
    row.reasons = "; ".join(f"{n} {why}" for why, n in counts.most_common(3))
    row.max_rel = max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(on, plain, strict=True)), default=0.0)
    controller = hook.controller
    if controller is not None:
        reverted = [f"cluster {c.index}: {c.reason}" for c in controller.clusters if c.reverted_at is not None]
        row.reverted = (controller.job_reverted or "; ".join(reverted))[:200]
    return row


def table(rows: list[Row]) -> str:
    head = "| model | steps | plain TF s | hooked s | setup s | installed | left to TF | max rel loss diff | reverted |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.model} | {r.steps} | CRASH: {r.error} | | | | | | |")
            continue
        left = f"{r.off} ({r.reasons})" if r.off else "0"
        lines.append(
            f"| {r.model} | {r.steps} | {r.plain_s:.1f} | {r.hooked_s:.1f} | {r.setup_s:.1f} | {r.installed} "
            f"| {left} | {r.max_rel:.2g} | {r.reverted or 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.keras_apps import KERAS_MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(KERAS_MODELS), choices=list(KERAS_MODELS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rtol", type=float, default=1e-3, help="largest relative loss difference accepted")
    parser.add_argument("--out", type=Path, help="directory for keras-jobs-<date>.md")
    args = parser.parse_args(argv)
    if args.steps < 6:
        parser.error("--steps must be at least 6 (warmup, baseline and a stitched check step)")
    rows = []
    for name in args.models:
        print(f"== {name}: {args.steps} steps plain, then hooked", file=sys.stderr, flush=True)
        rows.append(run_model(name, args.steps))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"keras-jobs-{dt.date.today().isoformat()}.md").write_text(text + "\n")
    bad = [r for r in rows if r.error or r.max_rel > args.rtol]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
