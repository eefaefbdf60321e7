"""`stitchfleet demo`: train a small BERT-like encoder on CPU with the plugin on, then report.

Input: steps, a directory, the backend and the model size (command-line arguments).
Output: on stdout, the clusters stitched or left off, a progress line every `every` steps
(loss, the phase: warmup, baseline, probe all, probe k, stitched or reverted, the mean step
time against the baseline median), the group probe's verdict and each cluster's probe
decision (kept, or left to TF, with the measured ms per step), the baseline and stitched
medians beside the median step of the same model in a second session without the plugin (timed
after the run, a cross-check: the baseline steps already run the user's graph as built, plain
TF inside the job, interleaved with the stitched ones), then the weekly savings report
(Markdown) read back from the SQLite file the run recorded in a fresh directory (named in the
output). Every figure is measured in this run:
a cluster slower than TF alone is left to TF, and when stitched steps are slower than the
baseline, the guard reverts and the report says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.controller import Cluster, Controller
from stitchfleet.plugin.hook import StitchHook
from stitchfleet.plugin.probe_verdicts import NOISE_FACTOR
from stitchfleet.plugin.schedule import BASELINE, PROBE, REFERENCE, median_noise

DIMS = {"batch": 8, "seq": 32, "hidden": 128, "heads": 4}


def _build(dims: dict[str, int]) -> tuple[Any, Any, Any, Callable[[], dict[Any, Any]]]:
    from stitchfleet.plugin import training_graphs as models

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        models.bert_encoder(dims)
    shape = [dims["batch"], dims["seq"], dims["hidden"]]
    rng = np.random.default_rng(0)
    data = {
        graph.get_tensor_by_name("input:0"): rng.standard_normal(shape).astype(np.float32),
        graph.get_tensor_by_name("target:0"): rng.standard_normal(shape).astype(np.float32),
        graph.get_tensor_by_name("attention_mask:0"): np.ones(shape[:2], np.float32),
    }
    return graph, graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op"), lambda: data


def demo_settings(directory: Path, backend: str) -> settings_module.Settings:
    env = {
        "STITCHFLEET_STATE_DIR": str(directory),
        "STITCHFLEET_JOB_NAME": "demo-bert-encoder",
        "STITCHFLEET_MODEL": "bert-encoder-small",
        "STITCHFLEET_TEAM": "demo",
        "STITCHFLEET_BACKEND": backend,
        "STITCHFLEET_WARMUP_STEPS": "10",
        "STITCHFLEET_BASELINE_STEPS": "20",
        "STITCHFLEET_REBASELINE_EVERY": "500",
        "STITCHFLEET_WINDOW_STEPS": "20",
        "STITCHFLEET_CHECK_EVERY": "100",
        "STITCHFLEET_CHECK_FIRST": "3",
        # probing from step 30: the group 4 x 2 rounds, then 10 clusters x 2 rounds, each a pair of 6 + 6 steps:
        # stitched from step 366.
        # The default 6000 steps give the stitched phase room to pay back the setup (compile, the check
        # executor: ~0.7 s) and the probing, as a real job's thousands of steps do; 3000 did not (measured
        # 2026-11-21: gross +0.44 s against 0.71 s of setup)
        "STITCHFLEET_PROBE_STEPS": "6",
        "STITCHFLEET_PROBE_ROUNDS": "2",
        "STITCHFLEET_GPUS_PER_RANK": "1",
    }
    base = settings_module.current()
    env["STITCHFLEET_CACHE_DIR"] = str(base.cache_dir)
    env["STITCHFLEET_JOB_UID"] = dt.datetime.now(dt.UTC).strftime("demo-%Y%m%dT%H%M%S")
    return settings_module.load(env)


def _describe(hook: StitchHook) -> None:
    print(f"stitched clusters: {len(hook.installed)}; left off: {len(hook.off)}")
    for index, reason in sorted(hook.off.items()):
        print(f"  cluster {index}: off ({reason})")


def _progress(hook: StitchHook, step: int, loss: float, times: list[float]) -> None:
    controller = hook.controller
    if controller is None:
        print(f"step {step:4d}  loss {loss:.5f}  plugin off  step {statistics.mean(times) * 1e3:.2f} ms")
        return
    base = controller.windows.baseline_median
    base_text = f"{base * 1e3:.2f} ms" if base is not None else "-"
    on = int(controller.switches(step).sum())
    print(
        f"step {step:4d}  loss {loss:.5f}  {_phase(controller, step):<10}  step {statistics.mean(times) * 1e3:6.2f} ms"
        f"  baseline median {base_text}  clusters on {on}/{len(controller.clusters)}"
    )


def _phase(controller: Controller, step: int) -> str:
    """What the step ran: warmup, baseline, `probe all` (every cluster on), `probe K` / `without K` (the
    halves of cluster K's pair: the enabled clusters with and without K), stitched or reverted."""
    mode = controller.mode(step)
    if mode not in (PROBE, REFERENCE):
        return mode
    probed = controller.timing.probed(step)
    if probed is None:
        return "probe all"
    return f"{'probe' if mode == PROBE else 'without'} {controller.clusters[probed].index}"


def _decision(c: Cluster) -> str:
    if c.reverted_at is not None:
        return f"reverted at step {c.reverted_at} ({c.reason})"
    if c.kept is None:
        return "not probed yet (the run ended first)"
    if not c.probe and c.kept:
        return "on (probing off)"
    return f"kept ({c.reason})" if c.kept else f"left to TF ({c.reason})"


def _decisions(controller: Controller) -> None:
    if controller.group_proven is not None:
        verdict = "proven" if controller.group_proven else "not faster"
        print(f"\ngroup probe (every cluster on vs plain TF): {verdict}: {controller.group_probe}")
    print("\nper-cluster decisions (probe: the enabled clusters with it vs without it, medians per step):")
    for c in controller.clusters:
        print(f"  cluster {c.index}: {_decision(c)}")
    if controller.stitching_off:
        print(f"stitching off for this job: {controller.stitching_off}")


PLAIN_STEPS = 400  # plain TF steps timed after the plugin run, in the warmed-up process (first 10 untimed)


def plain_steps(steps: int = PLAIN_STEPS) -> list[float]:
    """Step seconds of the same model in a session without the plugin (the first 10 untimed). The job's
    baseline steps run the same graph (stitching lives on the twin), plus the hook's per-step bookkeeping;
    this second measurement, taken after the run, cross-checks the baseline the report's savings use."""
    graph, loss, train_op, feeds = _build(DIMS)
    times = []
    with graph.as_default(), tf.compat.v1.train.MonitoredSession() as session:
        for step in range(steps):
            started = time.perf_counter()
            session.run([loss, train_op], feeds())
            if step >= 10:
                times.append(time.perf_counter() - started)
    return times


def _compare(plain_times: list[float], baseline_times: list[float], controller: Controller | None) -> None:
    """The job's baseline steps (its own graph: plain TF inside the job) and stitched median, beside plain TF
    timed in a second session after the run, and whether the two plain-TF figures agree within their noise."""
    plain = statistics.median(plain_times)
    line = f"median step times: plain TF in a second session after the run {plain * 1e3:.2f} ms"
    base = statistics.median(baseline_times) if baseline_times else None
    if base is not None:
        noise = median_noise(baseline_times, plain_times)
        agrees = abs(base - plain) <= NOISE_FACTOR * noise
        line += f"; baseline steps (plain TF inside the job, the report's reference) {base * 1e3:.2f} ms"
        line += f" ({(base - plain) / plain * 100:+.1f}% vs the second session: "
        line += "within" if agrees else "beyond"
        line += f" {NOISE_FACTOR:g} x its noise of {noise * 1e3:.2f} ms)"
    stitched = controller.windows.stitched_median if controller is not None else None
    kept = controller is not None and controller.stitching_off is None and any(c.enabled for c in controller.clusters)
    if stitched is not None and kept and base is not None:
        line += f"; stitched {stitched * 1e3:.2f} ms ({(stitched - base) / base * 100:+.1f}% vs the baseline steps)"
    print(line)


def train(steps: int, directory: Path, backend: str, every: int) -> str:
    """Runs the demo training; returns the database URL it recorded to."""
    current = demo_settings(directory, backend)
    url = f"sqlite:///{directory / 'telemetry.db'}"
    graph, loss, train_op, feeds = _build(DIMS)
    hook = StitchHook(current, db_url=url)
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        _describe(hook)
        times: list[float] = []
        baseline: list[float] = []  # every baseline step's time, as the demo measures it
        for step in range(steps):
            mode = hook.controller.mode(step) if hook.controller is not None else None
            started = time.perf_counter()
            value, _ = session.run([loss, train_op], feeds())
            times.append(time.perf_counter() - started)
            if mode == BASELINE:
                baseline.append(times[-1])
            if (step + 1) % every == 0:
                _progress(hook, step, float(value), times)
                times = []
    if hook.controller is not None:
        _decisions(hook.controller)
    if hook.controller is not None and hook.controller.job_reverted:
        print(f"guard: stitching reverted for this job: {hook.controller.job_reverted}")
    _compare(plain_steps(), baseline, hook.controller)
    return url


def report(url: str) -> str:
    """The weekly report of the run's database, then the run's balance in seconds."""
    from stitchfleet.telemetry.report_text import render_markdown
    from stitchfleet.telemetry.savings import weekly_summary
    from stitchfleet.telemetry.weeks import week_of

    summary = weekly_summary(url, week_of(dt.datetime.now(dt.UTC)))
    return "\n".join([render_markdown(summary), *(balance(job) for job in summary.jobs)])


def balance(job: Any) -> str:
    """One task's savings in device-seconds (GPU-s, or CPU core-s on CPU), the figures behind its hours."""
    gross, setup, net = (3600.0 * h for h in (job.gross_hours, job.compile_hours, job.net_hours))
    unit = "GPU-s" if job.device_kind == "gpu" else "CPU core-s"
    verdict = "the plugin paid for itself" if net > 0 else "the plugin did not pay back its setup in this run"
    return (
        f"\nbalance of {job.job_name} over {job.iterations:,} steps on {job.devices_per_rank} {job.device_kind}"
        f" device(s) per rank: gross {gross:+.2f} {unit} saved (measured step times against the baseline), setup"
        f" {setup:.2f} {unit} (compile, the check executor): net {net:+.2f} {unit}; {verdict}"
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    directory = Path(args.dir) / f"run-{stamp}"
    directory.mkdir(parents=True, exist_ok=True)
    print(f"stitchfleet demo: {args.steps} steps of a BERT-like encoder {DIMS} on CPU, backend {args.backend}")
    url = train(args.steps, directory, args.backend, args.every)
    print(f"\ntelemetry recorded in {directory / 'telemetry.db'}\n")
    print(report(url))
    return 0
