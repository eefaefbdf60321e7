"""End-to-end step time of a model under the plugin (figures, not tests): plain TF vs the plugin's paths.

Input: the command line (model dims, steps per window, rounds, bridges to compare). Output: a
table on stdout and, with --out, `step-<date>.json`/`.md` there. One process builds the model (the demo's
BERT-like encoder unless --model says) twice: a plain graph (no hook: what the job runs without stitchfleet) and a
hooked graph whose switch vector is fed directly, so the same session runs, window by window and
interleaved: the user's graph as the hooked job runs it with every cluster off (the plugin's
baseline: the graph as built, stitching lives on the twin), the twin with every cluster off
(each cluster's TF ops as a graph function inside the dispatch op: what stitched steps pay for a
cluster that is off), every cluster on, and each cluster alone on. Medians over the timed steps of all
rounds, wall and process CPU time; the first steps of each window are untimed (pools settle). The bridge (native op
or tf.numpy_function) is a process-wide choice, so each bridge runs in its own process (this script re-runs itself).

    PYTHONPATH=. python scripts/bench_step.py --dims 8 32 128 4 --rounds 6 --out benchmarks/results
    PYTHONPATH=. python scripts/bench_step.py --model KerasTransformer --bridges native --no-alone

`--model` takes the demo model (default, sized by --dims), a job of scripts/ab_jobs.py (`mlp`, `transformer`) or a
Keras model of benchmarks/keras_apps.py (its own sizes; every float placeholder fed standard normal values, the
labels uniform classes, fixed for the run);
`--no-alone` leaves out the per-cluster configurations (a model with many clusters takes long otherwise).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the hook imports TensorFlow: imported where a run needs it
    from stitchfleet.plugin.graph.twin import Diverter
    from stitchfleet.plugin.session.hook import StitchHook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETTLE = 2  # untimed steps at the start of each window


def _build(dims: dict[str, int], model: str) -> tuple[Any, Any, Any, Any]:
    """(graph, loss, train op, feeds) of the demo model at `dims` or of the Keras model `model`."""
    import tensorflow as tf

    from stitchfleet.demo import command

    if model == "demo":
        return command._build(dims)
    import ab_jobs  # this script's folder: the A/B's jobs (an MLP, a Transformer encoder) as users write them

    if model in ab_jobs.JOBS:
        graph, loss, train_op, fixed = ab_jobs.JOBS[model]()
        return graph, loss, train_op, lambda: fixed
    import corpus_graphs  # this script's folder: corpus programs' own model code, fed placeholders

    if model in corpus_graphs.BUILDERS:
        return corpus_graphs.BUILDERS[model]()
    from benchmarks import keras_apps

    graph, loss, train_op = keras_apps.training_graph(model, as_job=True)
    rng = np.random.default_rng(0)
    data: dict[Any, Any] = {}
    for op in graph.get_operations():
        if op.type != "Placeholder":
            continue
        tensor = op.outputs[0]
        shape = tensor.shape.as_list()
        if tensor.dtype.is_floating:
            data[tensor] = rng.standard_normal(shape).astype(tensor.dtype.as_numpy_dtype)
        elif tensor.dtype in (tf.int32, tf.int64):
            data[tensor] = rng.integers(0, keras_apps.CLASSES, shape).astype(tensor.dtype.as_numpy_dtype)
        else:
            raise ValueError(f"{model}: no value to feed placeholder {op.name} of {tensor.dtype.name}")
    return graph, loss, train_op, lambda: data


def _hooked_session(
    dims: dict[str, int], bridge: str, tmp: str, model: str = "demo"
) -> tuple[Any, StitchHook, Any, Any]:
    import tensorflow as tf

    from stitchfleet import settings
    from stitchfleet.plugin.session.hook import StitchHook

    env = {
        "STITCHFLEET_STATE_DIR": tmp,
        "STITCHFLEET_JOB_UID": f"bench-step-{bridge}",
        "STITCHFLEET_BACKEND": "cpu",
        "STITCHFLEET_BRIDGE": bridge,
        "STITCHFLEET_CHECK_FIRST": "0",
        "STITCHFLEET_CHECK_EVERY": "1000000",
        "STITCHFLEET_CACHE_DIR": str(settings.current().cache_dir),
    }
    graph, loss, train_op, feeds = _build(dims, model)
    hook = StitchHook(settings.load(env), db_url=f"sqlite:///{Path(tmp) / 't.db'}")
    with graph.as_default():
        session = tf.compat.v1.train.MonitoredSession(hooks=[hook])
    return session, hook, (loss, train_op), feeds


def _plain_session(dims: dict[str, int], model: str = "demo") -> tuple[Any, Any, Any]:
    import tensorflow as tf

    graph, loss, train_op, feeds = _build(dims, model)
    with graph.as_default():
        session = tf.compat.v1.train.MonitoredSession()
    return session, (loss, train_op), feeds


def _window(run: Any, steps: int, cpu: list[float]) -> list[float]:
    """Wall seconds of the timed steps; their process CPU seconds (every thread's) go to `cpu`: a second view
    that other processes' load moves less than the wall (a spinning pool thread still counts)."""
    times = []
    for i in range(steps):
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        if i >= SETTLE:
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return times


def _diverter(hook: StitchHook) -> Diverter:
    """The hook's twin diverter (arming it is what the hook does on a step with a cluster on); the hook has none
    when it stitched nothing, and then there is no stitched step to time."""
    if hook.diverter is None:
        why = hook.length.skipped or "no cluster installed"
        raise RuntimeError(f"the hook stitched nothing ({why}): no stitched step to time")
    return hook.diverter


def _on_twin(diverter: Diverter, raw: Any, fetches: Any, feed: Any) -> Any:
    diverter.armed = True  # what the hook does on a step with a cluster on
    return raw.run(fetches, feed)


def measure(
    dims: dict[str, int], bridge: str, steps: int, rounds: int, *, model: str = "demo", alone: bool = True
) -> dict[str, Any]:
    """Median step seconds per configuration, for one bridge (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        session, hook, fetches, feeds = _hooked_session(dims, bridge, tmp, model)
        plain, plain_fetches, plain_feeds = _plain_session(dims, model)
        raw = session._tf_sess()  # the switches are fed directly: no schedule, no guard
        diverter = _diverter(hook)
        count = len(hook.installed)
        configs: dict[str, Any] = {
            "hooked job, all off (user's graph)": None,
            "twin, all off": np.zeros(count, bool),
            "all on": np.ones(count, bool),
        }
        for position, (cluster, _) in enumerate(hook.installed if alone else []):
            alone_on = np.zeros(count, bool)
            alone_on[position] = True
            configs[f"cluster {cluster.index} alone"] = alone_on
        times: dict[str, list[float]] = {"plain TF": [], **{name: [] for name in configs}}
        cpu: dict[str, list[float]] = {name: [] for name in times}
        for r in range(rounds):
            print(f"  {bridge}: round {r + 1}/{rounds}", flush=True)
            times["plain TF"] += _window(lambda: plain.run(plain_fetches, plain_feeds()), steps, cpu["plain TF"])
            for name, switches in configs.items():
                if switches is None:
                    times[name] += _window(lambda: raw.run(fetches, feeds()), steps, cpu[name])
                    continue
                feed = {**feeds(), hook.switches: switches}
                times[name] += _window(lambda feed=feed: _on_twin(diverter, raw, fetches, feed), steps, cpu[name])
        session.close()
        plain.close()
    print(f"  {bridge}: {count} clusters installed", flush=True)
    walls = {name: statistics.median(ts) for name, ts in times.items()}
    return {**walls, **{f"cpu: {name}": statistics.median(ts) for name, ts in cpu.items()}}


def _table(dims: dict[str, int], by_bridge: dict[str, dict[str, float]], model: str = "demo") -> list[str]:
    bridges = list(by_bridge)
    first = by_bridge[bridges[0]]
    what = f"Demo model {dims}" if model == "demo" else f"Model {model}"
    lines = [
        f"{what}; median step ms; `vs plain TF` = change against TF without the plugin.",
        "",
        "| configuration | " + " | ".join(f"{b} ms | vs plain TF | CPU ms | vs plain TF" for b in bridges) + " |",
        "|---|" + "---:|---:|---:|---:|" * len(bridges),
    ]
    for name in [n for n in first if not n.startswith("cpu: ")]:
        cells = []
        for b in bridges:
            for key, base_key in ((name, "plain TF"), (f"cpu: {name}", "cpu: plain TF")):
                value, base = by_bridge[b][key], by_bridge[b][base_key]
                cells.append(f"{value * 1e3:.3f} | {(value - base) / base * 100:+.1f}%")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _one(args: argparse.Namespace) -> int:
    dims = dict(zip(("batch", "seq", "hidden", "heads"), args.dims, strict=True))
    print(json.dumps(measure(dims, args.child, args.steps, args.rounds, model=args.model, alone=args.alone)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_step.py", description=__doc__.splitlines()[0])
    dims_names = ("BATCH", "SEQ", "HIDDEN", "HEADS")
    parser.add_argument("--dims", type=int, nargs=4, default=[8, 32, 128, 4], metavar=dims_names)
    parser.add_argument("--steps", type=int, default=12, help="steps per window (the first 2 untimed)")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds over all configurations")
    parser.add_argument("--bridges", nargs="+", default=["native", "python"], choices=["native", "python"])
    parser.add_argument("--out", type=Path, default=None, help="folder for step-<date>.json/.md")
    parser.add_argument("--model", default="demo", help="demo (--dims), an ab_jobs job, a Keras model")
    parser.add_argument("--no-alone", dest="alone", action="store_false", help="no per-cluster configurations")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps <= SETTLE or args.rounds < 1:
        parser.error(f"--steps must be > {SETTLE} and --rounds >= 1")
    if args.child:
        return _one(args)
    dims = dict(zip(("batch", "seq", "hidden", "heads"), args.dims, strict=True))
    by_bridge: dict[str, dict[str, float]] = {}
    for bridge in args.bridges:
        argv_child = [sys.executable, __file__, "--child", bridge, "--steps", str(args.steps)]
        argv_child += ["--rounds", str(args.rounds), "--dims", *map(str, args.dims), "--model", args.model]
        argv_child += [] if args.alone else ["--no-alone"]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        done = subprocess.run(argv_child, capture_output=True, text=True, env=env, check=False)
        sys.stdout.write("".join(ln + "\n" for ln in done.stdout.splitlines() if ln.startswith("  ")))
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-3000:])
            return done.returncode
        by_bridge[bridge] = json.loads(done.stdout.strip().splitlines()[-1])
    lines = _table(dims, by_bridge, args.model)
    print("\n".join(lines))
    if args.out:
        stamp = dt.date.today().isoformat()
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"date": stamp, "model": args.model, "dims": dims}
        record |= {"steps": args.steps, "rounds": args.rounds, "medians_s": by_bridge}
        (args.out / f"step-{stamp}.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / f"step-{stamp}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
