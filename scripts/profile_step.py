"""Where a stitched step's time goes (figures, not tests): TF's step stats of plain and stitched steps side by side.

Input: the command line (demo model dims, traced steps per configuration, rounds). Output: on stdout, per
configuration (plain TF, the hooked job's own graph, the twin with every cluster off, every cluster on) the
median step, the nodes the executor ran per step (a count the machine's load does not move), the summed op
time per op type from `RunOptions(trace_level=FULL_TRACE)`'s `RunMetadata`, the op types whose time changed
most against plain TF (what the clusters replaced, what TF stopped fusing:
`_MklFused*`/`_FusedMatMul` kernels), the dispatch op's own time and the threads that ran ops.

    PYTHONPATH=. python scripts/profile_step.py --dims 8 32 128 4 --steps 20 --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
DISPATCH = "StitchfleetDispatch"  # the dispatch op's type (native/dispatch_op)


class Profile:
    """One configuration's traced steps: wall seconds, per op type and per node summed micros, threads seen."""

    def __init__(self) -> None:
        self.walls: list[float] = []
        self.micros: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()
        self.nodes: collections.Counter[str] = collections.Counter()
        self.threads: set[tuple[str, int]] = set()
        self.steps = 0

    def add(self, wall: float, metadata: Any) -> None:
        self.walls.append(wall)
        self.steps += 1
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                kind = node.timeline_label.split("(", 1)[0].split(" = ")[-1].strip() or node.node_name
                kind = kind.split(":")[0] if kind else node.node_name
                self.micros[kind] += node.op_end_rel_micros - node.op_start_rel_micros
                self.nodes[node.node_name] += node.op_end_rel_micros - node.op_start_rel_micros
                self.counts[kind] += 1
                self.threads.add((device.device, node.thread_id))

    def per_step(self) -> dict[str, float]:
        return {kind: micros / self.steps for kind, micros in self.micros.items()}


def _op_type(label: str, name: str) -> str:
    return label or name


def _trace(run: Any, steps: int, profile: Profile) -> None:
    import tensorflow as tf

    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    for _ in range(steps):
        metadata = tf.compat.v1.RunMetadata()
        started = time.perf_counter()
        run(options, metadata)
        profile.add(time.perf_counter() - started, metadata)


class Clusters:
    """Each installed cluster's dispatch node in the twin and the names of the user's TF ops it replaced (the plain
    graph is built by the same code: the same names)."""

    def __init__(self, dispatch: dict[int, str], replaced: dict[int, set[str]]) -> None:
        self.dispatch, self.replaced = dispatch, replaced


def _clusters(hook: Any, graph: Any) -> Clusters:
    dispatch = {int(op.get_attr("index")): op.name for op in graph.get_operations() if op.type == DISPATCH}
    # the site is the twin's (a copy of the user's graph under a scope): the user's op of the same name without it
    replaced = {
        k: {name.split("/", 1)[-1] for name in cluster.site.internal_names}
        for k, (_, cluster) in enumerate(hook.installed)
    }
    by_site = {cluster.site.index: k for k, (_, cluster) in enumerate(hook.installed)}
    return Clusters({by_site[i]: name for i, name in dispatch.items() if i in by_site}, replaced)


def profile(dims: dict[str, int], steps: int, rounds: int, model: str = "demo") -> tuple[dict[str, Profile], Clusters]:
    from bench_step import _diverter, _hooked_session, _plain_session  # the same sessions as the timing benchmark

    with tempfile.TemporaryDirectory() as tmp:
        session, hook, fetches, feeds = _hooked_session(dims, "native", tmp, model)
        plain, plain_fetches, plain_feeds = _plain_session(dims, model)
        raw, plain_raw = session._tf_sess(), plain._tf_sess()
        diverter = _diverter(hook)
        count = len(hook.installed)
        clusters = _clusters(hook, raw.graph)
        found = {name: Profile() for name in ("plain TF", "user's graph", "twin, all off", "all on")}

        def on_twin(switches: Any) -> Any:
            def run(options: Any, metadata: Any) -> None:
                diverter.armed = True
                raw.run(fetches, {**feeds(), hook.switches: switches}, options=options, run_metadata=metadata)

            return run

        runs = {
            "plain TF": lambda o, m: plain_raw.run(plain_fetches, plain_feeds(), options=o, run_metadata=m),
            "user's graph": lambda o, m: raw.run(fetches, feeds(), options=o, run_metadata=m),
            "twin, all off": on_twin(np.zeros(count, bool)),
            "all on": on_twin(np.ones(count, bool)),
        }
        for run in runs.values():  # untraced warmup of each configuration's executor
            for _ in range(3):
                run(None, None)
        for r in range(rounds):
            print(f"  round {r + 1}/{rounds}", flush=True)
            for name, run in runs.items():
                _trace(run, steps, found[name])
        session.close()
        plain.close()
    return found, clusters


def per_cluster(found: dict[str, Profile], clusters: Clusters) -> list[str]:
    """Per cluster: the traced time of the TF ops it replaced in the user's graph (the hooked job's baseline: the plain
    graph's Keras layers have other names), its dispatch op's all on. Tracing adds its own cost to every op it times
    (microseconds), so many small TF ops read slower here than untraced: the ratio flatters the clusters by that
    much. And an op's traced time is its wall: ops that overlap on the cores each read longer than they computed.
    The last columns: the dispatch op switched off, running the cluster's TF ops as its graph function."""
    plain, on, off = found["user's graph"], found["all on"], found["twin, all off"]
    lines = [
        "| cluster | TF ops replaced (ran traced) | user's graph us/step | dispatch all on us/step | on / TF"
        " | dispatch all off us/step | off / TF |"
    ]
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for k, names in clusters.replaced.items():
        ran = [n for n in names if n in plain.nodes]
        before = sum(plain.nodes[n] for n in ran) / max(plain.steps, 1)
        after = on.nodes.get(clusters.dispatch.get(k, ""), 0) / max(on.steps, 1)
        # switched off, the dispatch op runs the same TF ops as a graph function: what a left cluster costs
        fallback = off.nodes.get(clusters.dispatch.get(k, ""), 0) / max(off.steps, 1)
        rows.append((after - before, k, len(names), len(ran), before, after, fallback))
    for _, k, count, traced, before, after, fallback in sorted(rows, reverse=True):
        ratio, off_ratio = (f"{after / before:.2f}x", f"{fallback / before:.2f}x") if before else ("-", "-")
        off_cells = f"{fallback:.0f} | {off_ratio}"
        lines.append(f"| {k} | {count} ({traced}) | {before:.0f} | {after:.0f} | {ratio} | {off_cells} |")
    return lines


def report(found: dict[str, Profile], top: int) -> list[str]:
    plain = found["plain TF"].per_step()
    head = "| configuration | median traced step ms | op time ms/step | dispatch op ms/step | ops run/step | threads |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name, prof in found.items():
        per = prof.per_step()
        dispatch = sum(v for k, v in per.items() if DISPATCH in k)
        ran = sum(prof.counts.values()) / max(prof.steps, 1)  # the executor's nodes that ran (dead ones are not traced)
        lines.append(
            f"| {name} | {statistics.median(prof.walls) * 1e3:.3f} | {sum(per.values()) / 1e3:.3f}"
            f" | {dispatch / 1e3:.3f} | {ran:.0f} | {len(prof.threads)} |"
        )
    for name in ("twin, all off", "all on"):
        per = found[name].per_step()
        kinds = set(per) | set(plain)
        delta = sorted(kinds, key=lambda k: -abs(per.get(k, 0.0) - plain.get(k, 0.0)))[:top]
        lines += ["", f"{name} against plain TF: op types whose time changed most (us/step)", ""]
        lines += ["| op type | plain | " + name + " | change |", "|---|---:|---:|---:|"]
        for k in delta:
            a, b = plain.get(k, 0.0), per.get(k, 0.0)
            lines.append(f"| {k} | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="profile_step.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs=4, default=[8, 32, 128, 4], metavar=("B", "S", "H", "HEADS"))
    parser.add_argument("--steps", type=int, default=20, help="traced steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the configurations")
    parser.add_argument("--top", type=int, default=15, help="op types listed per comparison")
    parser.add_argument("--model", default="demo", help="demo (--dims), an ab_jobs job, a Keras model (bench_step)")
    args = parser.parse_args(argv)
    dims = dict(zip(("batch", "seq", "hidden", "heads"), args.dims, strict=True))
    found, clusters = profile(dims, args.steps, args.rounds, args.model)
    print("\n".join(report(found, args.top)))
    print("\nper cluster (traced), most lost first\n")
    print("\n".join(per_cluster(found, clusters)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
