"""`stitchfleet demo`: train a small BERT-like encoder on CPU with the plugin on, then report.

Input: steps, a directory, the backend and the model size (command-line arguments).
Output: on stdout, the clusters stitched or left off, a progress line every `every` steps
(loss, the phase: warmup, baseline, probe all, probe k, stitched or reverted, the mean step
time against the baseline median), the group probe's verdict and each cluster's probe
decision, the weekly savings report read back from the SQLite file the run recorded, then the balance
against plain TF measured in the same run: the same job without the plugin, in a second session of the same
process, its steps alternated with the plugin's chunk by chunk (a load spike hits both), wall against wall,
setup included, with the noise of that difference, and where it went (per phase of the plugin's steps: warmup,
baseline, probe, check, stitched, against plain TF's steps of the same numbers). Every figure is measured in this
run. The plain job runs its first chunk first and the plugin is told its median step (what the fleet's memory tells
a real job), and sets up only when the job's remaining steps can repay it: the default 12000 steps can (a cold
setup ~3 s against ~1 ms saved on each of ~11000 stitched steps); 6000 could not on a quiet machine, and the plugin
then stays out of the way and says the balance is ~0 by design (`--step-ms 0`: the plugin is not told, and sets up)."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.demo.plain_balance import against_plain, where_it_went
from stitchfleet.plugin.control.cluster import Cluster
from stitchfleet.plugin.control.controller import Controller
from stitchfleet.plugin.control.probe_decisions import NOISE_FACTOR
from stitchfleet.plugin.control.schedule import BASELINE, PROBE, REFERENCE, STITCHED
from stitchfleet.plugin.control.step_windows import SETTLE_STEPS, mean_noise
from stitchfleet.plugin.session.hook import StitchHook

DIMS = {"batch": 8, "seq": 32, "hidden": 128, "heads": 4}
WARM_STEPS = 10  # the plain job's first steps, its executor builds: left out of the step time the plugin is told


def _build(dims: dict[str, int]) -> tuple[Any, Any, Any, Callable[[], dict[Any, Any]]]:
    from stitchfleet.demo import models

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


def demo_settings(directory: Path, backend: str, job_steps: int = 0, step_ms: float = 0.0) -> settings_module.Settings:
    env = {
        "STITCHFLEET_JOB_STEPS": str(job_steps),  # what the plugin knows of the job's length (0: unknown)
        "STITCHFLEET_STEP_MS": f"{step_ms:.6f}",  # what it knows of the job's plain step time (0: unknown)
        "STITCHFLEET_STATE_DIR": str(directory),
        "STITCHFLEET_JOB_NAME": "demo-bert-encoder",
        "STITCHFLEET_MODEL": "bert-encoder-small",
        "STITCHFLEET_TEAM": "demo",
        "STITCHFLEET_BACKEND": backend,
        "STITCHFLEET_WARMUP_STEPS": "10",
        "STITCHFLEET_BASELINE_STEPS": "20",
        # the default cadence: a 5-step baseline block every 100 steps (5% of the stitched phase), one stitched
        # window between two blocks, so each is paired with baselines measured beside it (`telemetry.paired`)
        "STITCHFLEET_REBASELINE_EVERY": "100",
        "STITCHFLEET_PAIRED_STEPS": "5",
        "STITCHFLEET_WINDOW_STEPS": "100",
        "STITCHFLEET_CHECK_EVERY": "100",
        "STITCHFLEET_CHECK_FIRST": "3",
        # probing from step 30: the group 4 x 2 rounds, then 10 clusters x 2 rounds, each a pair of 6 + 6 steps:
        # stitched from step 366.
        # The default 12000 steps give the stitched phase room to pay back a cold setup (compile, the check
        # executor: 2.8-3.5 s) and the probing, as a real job's thousands of steps do; 6000 did not on a quiet
        # machine (the payback rule skipped the setup: 2.6 s of expected gain) and was within noise under load
        # (measured 2026-11-25: +3.09 s, noise 1.58 s)
        "STITCHFLEET_PROBE_STEPS": "6",
        "STITCHFLEET_PROBE_ROUNDS": "2",
        "STITCHFLEET_GPUS_PER_RANK": "1",
    }
    base = settings_module.current()
    env["STITCHFLEET_CACHE_DIR"] = str(base.cache_dir)
    env["STITCHFLEET_JOB_UID"] = dt.datetime.now(dt.UTC).strftime("demo-%Y%m%dT%H%M%S")
    return settings_module.load(env)


def _describe(hook: StitchHook) -> None:
    if hook.controller is None and not hook.installed:
        print("stitched clusters: 0 (setup skipped or nothing to stitch: the job runs as written)")
        return
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


def _compare(plain_times: list[float], baseline_times: list[float], controller: Controller | None) -> None:
    """The job's baseline steps (its own graph: plain TF inside the job), beside the plain
    job's steps run alternated with them, and whether the two plain-TF figures agree within their noise. Means,
    as the report's reference is (`step_windows`): a median leaves out the slow steps a loaded machine has."""
    plain = statistics.fmean(plain_times)
    line = f"mean step times: plain TF (the job without the plugin, alternated with it) {plain * 1e3:.2f} ms"
    base = statistics.fmean(baseline_times) if baseline_times else None
    if base is not None:
        noise = mean_noise(baseline_times, plain_times)
        agrees = abs(base - plain) <= NOISE_FACTOR * noise
        line += "; baseline steps (plain TF inside the job, the report's reference: a block's first"
        line += f" {SETTLE_STEPS} steps after stitched ones left out; with the hook's work on them)"
        line += f" {base * 1e3:.2f} ms"
        line += f" ({(base - plain) / plain * 100:+.1f}% vs plain TF: "
        line += "within" if agrees else "beyond"
        line += f" {NOISE_FACTOR:g} x its noise of {noise * 1e3:.2f} ms)"
    stitched = controller.windows.stitched_median if controller is not None else None
    kept = controller is not None and controller.stitching_off is None and any(c.enabled for c in controller.clusters)
    if stitched is not None and kept and base is not None:
        line += f"; stitched steps since the last block: median {stitched * 1e3:.2f} ms (the slowdown guard's)"
    print(line)


def _step_phase(hook: StitchHook | None, mode: str | None) -> str:
    """What a step of a job ran, for the balance's breakdown (`where_it_went`): `as written` (no plugin, setup
    skipped, or stitching over: no fetch or feed added), `check` (the guard's check tensors fetched), or the
    schedule's mode (probe and reference both `probe`)."""
    # Once stitching is over the hook plans no step (`hook.quiet`): the path's plan is then the last one it made
    path = hook.path if hook is not None and not hook.quiet else None
    if mode is None or path is None or path.plan is None or path.plan.quiet:
        return "as written"
    if path.plan.checks:
        return "check"
    return PROBE if mode == REFERENCE else mode


def in_reference(previous: Sequence[str | None], mode: str | None) -> bool:
    """Whether a step of the plugin's job (its mode, the modes of the steps before it, the last last) is one the
    report's reference holds: a baseline step, but not a block's first SETTLE_STEPS after steps on the twin, which
    paid the switch (`step_windows`)."""
    return mode == BASELINE and not set(previous[-SETTLE_STEPS:]) & {STITCHED, PROBE, REFERENCE}


class Job:
    """One of the two jobs of the run: its session (created when first run, timed), its steps' times."""

    def __init__(self, hook: StitchHook | None) -> None:
        self.graph, self.loss, self.train_op, self.feeds = _build(DIMS)
        self.hook: StitchHook | None = hook
        self.session: Any = None
        self.times: list[float] = []  # every step's seconds
        self.phases: list[str] = []  # what each step ran (`_step_phase`), beside its time
        self.chunks: list[float] = []  # each chunk's wall seconds (the first includes creating the session)
        self.created = 0.0  # creating the session: the plugin's setup (compile, the twin) happens here
        self.closed = 0.0  # closing it: the hook's end
        self.loss_value = 0.0
        self.previous: list[str | None] = []  # the last steps' modes (SETTLE_STEPS of them)

    def run(self, steps: range, every: int, baseline: list[float]) -> None:
        started = time.perf_counter()
        if self.session is None:
            with self.graph.as_default():
                self.session = tf.compat.v1.train.MonitoredSession(hooks=[self.hook] if self.hook else [])
            self.created = time.perf_counter() - started
        chunk: list[float] = []
        for step in steps:
            controller = self.hook.controller if self.hook is not None else None
            mode = controller.mode(step) if controller is not None else None
            began = time.perf_counter()
            self.loss_value, _ = self.session.run([self.loss, self.train_op], self.feeds())
            chunk.append(time.perf_counter() - began)
            self.phases.append(_step_phase(self.hook, mode))
            if in_reference(self.previous, mode):
                baseline.append(chunk[-1])
            self.previous = [*self.previous, mode][-SETTLE_STEPS:]
            if self.hook is not None and (step + 1) % every == 0:
                _progress(self.hook, step, float(self.loss_value), chunk[-every:])
        self.times += chunk
        self.chunks.append(time.perf_counter() - started)

    def close(self) -> None:
        started = time.perf_counter()
        if self.session is not None:
            self.session.close()  # the hook's end (telemetry closed) happens here: it counts in the balance
        self.closed = time.perf_counter() - started


def train(
    steps: int, directory: Path, backend: str, every: int, *, job_steps: int | None = None, step_ms: float | None = None
) -> tuple[str, str, bool]:
    """Runs the demo training with the plugin and the same job without it, alternated chunk by chunk; returns
    the database URL the plugin's job recorded to, the balance against plain TF and whether setup was skipped. The
    plain job runs its first chunk first: unless `step_ms` is given (0: the plugin is not told), the plugin is told
    that chunk's median step (past its first WARM_STEPS), what the fleet's memory of earlier runs tells a real job's
    plugin."""
    plain = Job(None)
    first_chunk = range(0, min(every, steps))
    plain.run(first_chunk, every, [])
    if step_ms is None:
        measured = plain.times[WARM_STEPS:] or plain.times
        step_ms = statistics.median(measured) * 1e3
        print(f"plain TF's first {len(first_chunk)} steps: median {step_ms:.2f} ms past its first {WARM_STEPS} steps")
    current = demo_settings(directory, backend, steps if job_steps is None else job_steps, step_ms)
    url = f"sqlite:///{directory / 'telemetry.db'}"
    hook = StitchHook(current, db_url=url)
    stitched = Job(hook)
    baseline: list[float] = []  # every baseline step's time, as the demo measures it
    for first in range(0, steps, every):
        chunk = range(first, min(first + every, steps))
        for job in (stitched,) if first == 0 else (stitched, plain) if (first // every) % 2 else (plain, stitched):
            job.run(chunk, every, baseline if job is stitched else [])
        if first == 0:
            _describe(hook)
    stitched.close()
    plain.close()
    if hook.controller is not None:
        _decisions(hook.controller)
    if hook.controller is not None and hook.controller.job_reverted:
        print(f"guard: stitching reverted for this job: {hook.controller.job_reverted}")
    _compare(plain.times, baseline, hook.controller)
    first_runs = hook.controller.first_seconds if hook.controller is not None else 0.0
    breakdown = where_it_went(stitched, plain, first_runs, every)
    balance_lines = breakdown + against_plain(stitched, plain, hook.length.skipped)
    return url, balance_lines, hook.length.skipped is not None


def report(url: str, skipped: bool = False, spool: Path | None = None) -> str:
    """The weekly report of the run's database, then the run's balance in seconds (none when setup was skipped:
    the job ran as written and booked nothing). `spool`: the run's spool directory, loaded first (a job that
    skipped its setup spools its rows: `Ledger.spool_meanwhile`), as `stitchfleet report` does."""
    from stitchfleet.telemetry.report_text import render_markdown
    from stitchfleet.telemetry.savings import weekly_summary
    from stitchfleet.telemetry.spool_ingest import claim
    from stitchfleet.telemetry.weeks import week_of

    if spool is not None:
        claim(spool, url)
    summary = weekly_summary(url, week_of(dt.datetime.now(dt.UTC)))
    return "\n".join([render_markdown(summary), *(balance(job) for job in summary.jobs if not skipped)])


def balance(job: Any) -> str:
    """One task's savings in device-seconds (GPU-s, or CPU core-s on CPU), the figures behind its hours."""
    gross, setup, net = (3600.0 * h for h in (job.gross_hours, job.compile_hours, job.net_hours))
    unit = "GPU-s" if job.device_kind == "gpu" else "CPU core-s"
    verdict = "the plugin paid for itself" if net > 0 else "the plugin did not pay back its setup in this run"
    measured = 3600.0 * job.measured_hours
    if job.low_hours is None or job.high_hours is None:
        claim = f"gross {gross:+.2f} {unit} claimed (measured {measured:+.2f}, too few paired windows for an interval)"
    else:
        low, high = 3600.0 * job.low_hours, 3600.0 * job.high_hours
        noise = "within noise, " if job.within_noise else ""
        claim = f"gross {gross:+.2f} {unit} claimed ({noise}measured {measured:+.2f}, 95% interval {low:+.2f} to"
        claim += f" {high:+.2f}: stitched windows against the baseline blocks beside them)"
    return (
        f"\nbalance of {job.job_name} over {job.iterations:,} steps on {job.devices_per_rank} {job.device_kind}"
        f" device(s) per rank: {claim}, setup {setup:.2f} {unit} (compile, the check executor): net {net:+.2f}"
        f" {unit}; {verdict}; measured per device: {measured / max(job.devices_per_rank, 1):+.2f} s of the rank's"
        " steps (the clock's figure: 'of which the report books' in the balance below)"
    )


def native_op(cache_dir: Path, backend: str) -> str:
    """The native TF op as a pod finds it: the shim image ships it prebuilt for the pod's TF, so no job ever builds
    it (images/shim.Containerfile). Here it is built once per machine and TF version into the kernel cache, before
    either job and outside both clocks; a backend without the op needs nothing. The line to print, "" if none."""
    from stitchfleet.compiler import targets
    from stitchfleet.plugin.native import dispatch_op

    if not targets.profile(backend).native_op or dispatch_op.present(cache_dir):
        return ""
    started = time.perf_counter()
    try:
        dispatch_op.library_path(cache_dir)
    except dispatch_op.BridgeUnavailableError as err:
        return f"the native TF op cannot be built here ({err}): the plugin's setup says what it does instead"
    return (
        f"built the native TF op for this machine's TF in {time.perf_counter() - started:.1f} s, once (a pod gets it"
        " prebuilt from the shim image, so neither job pays it)"
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    directory = Path(args.dir) / f"run-{stamp}"
    directory.mkdir(parents=True, exist_ok=True)
    print(f"stitchfleet demo: {args.steps} steps of a BERT-like encoder {DIMS} on CPU, backend {args.backend}")
    print("preparing the machine as the shim image does ...", flush=True)
    prepared = native_op(settings_module.current().cache_dir, args.backend)
    print(prepared or "the native TF op is already there (the kernel cache or the shim's prebuilt ops)")
    url, balance_line, skipped = train(
        args.steps, directory, args.backend, args.every, job_steps=args.job_steps, step_ms=args.step_ms
    )
    print(f"\ntelemetry recorded in {directory / 'telemetry.db'}\n")
    print(report(url, skipped, directory / "spool"))
    print(balance_line)
    return 0
