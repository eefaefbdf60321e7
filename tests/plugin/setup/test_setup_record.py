"""What a job's setup leaves in the kernel cache (`setup_record`), and the payback estimate that reads it (issue 29
item 4): a job whose kernels the cache holds pays the warm figure, one whose kernels it does not the cold one, and
the cache is read only where the decision depends on it; the job's `setup` event says which case applied."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.plugin.control.schedule import Timing
from stitchfleet.plugin.native import dispatch_op
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.plugin.setup import payback, setup_record
from stitchfleet.plugin.setup.setup_record import CacheState
from tests.plugin.hook_harness import events, make_settings
from tests.plugin.session.test_hook_job_length import _train

pytestmark = pytest.mark.tf
TIMING = Timing.from_settings(settings_module.load({"STITCHFLEET_PROBE_STEPS": "6"}), clusters=2)
SECONDS = payback.SETUP_SECONDS["cpu"]
STEPS = 100_000


def _settling(steps: int) -> int:
    """The settle block's steps beyond the first baseline block's usual length: no gain on them (`Timing.settle`)."""
    return replace(TIMING, job_steps=steps).first_block - TIMING.baseline_steps


def _step_between(low: float, high: float) -> float:
    """A step time whose best gain over STEPS lies halfway between two setup costs (the probes' share included)."""
    exploring = TIMING.exploring_steps
    target = (low + high) / 2
    return target / ((STEPS - exploring - _settling(STEPS)) * payback.BEST_GAIN - exploring * payback.PROBE_LOSS)


def _kernels(cache: Path, names: list[str]) -> list[Any]:
    """Stand-ins for built ClusterKernels: what the record reads of them is their shared object's path."""
    (cache / "cpu").mkdir(parents=True, exist_ok=True)
    for name in names:
        (cache / "cpu" / name).write_bytes(b"\x7fELF")
    return [SimpleNamespace(executable=SimpleNamespace(library_path=cache / "cpu" / name)) for name in names]


def test_a_record_says_how_many_of_the_jobs_kernels_the_cache_still_holds(tmp_path: Path) -> None:
    kernels = _kernels(tmp_path, ["a.so", "b.so", "c.so", "d.so"])
    assert setup_record.write(tmp_path, "k1", "cpu", kernels)
    warm = setup_record.recall(tmp_path, "k1", "cpu", op=True)
    assert (warm.kernels, warm.present, warm.case, warm.missing) == (4, 4, "warm", 0.0)
    assert warm.why == "the kernel cache holds 4 of the 4 kernels this job's last setup built"
    (tmp_path / "cpu" / "a.so").unlink()  # a cache cleaner took one
    partly = setup_record.recall(tmp_path, "k1", "cpu", op=True)
    assert (partly.present, partly.case, partly.missing) == (3, "partly warm", 0.25)
    for name in ("b.so", "c.so", "d.so"):
        (tmp_path / "cpu" / name).unlink()
    assert setup_record.recall(tmp_path, "k1", "cpu", op=True).case == "cold"


def test_no_record_an_unreadable_one_or_another_builders_is_cold(tmp_path: Path) -> None:
    missing = setup_record.recall(tmp_path, "none", "cpu", op=True)
    assert missing.case == "cold" and missing.missing == 1.0
    assert missing.why == "no earlier setup of this job's graph is recorded in the kernel cache"
    assert setup_record.write(tmp_path, "k2", "cpu", _kernels(tmp_path, ["a.so"]))
    path = tmp_path / setup_record.RECORD_DIR / "k2.json"
    doc = json.loads(path.read_text())
    for field, said in (("code", "other stitchfleet code"), ("machine", "another CPU"), ("cc", "another C compiler")):
        path.write_text(json.dumps({**doc, field: "something else"}))
        other = setup_record.recall(tmp_path, "k2", "cpu", op=True)
        assert other.case == "cold" and other.why == f"the cache's kernels of this job were built by {said}"
    path.write_text("{not json")
    assert setup_record.recall(tmp_path, "k2", "cpu", op=True).case == "cold"


def test_nothing_is_recorded_for_kernels_outside_the_cache_or_other_backends(tmp_path: Path) -> None:
    outside = [SimpleNamespace(executable=SimpleNamespace(library_path=Path("/elsewhere/x.so")))]
    assert not setup_record.write(tmp_path, "k3", "cpu", outside)
    assert not setup_record.write(tmp_path, "k3", "sim", _kernels(tmp_path, ["a.so"]))
    assert not setup_record.write(tmp_path, "k3", "cpu", [])
    assert not (tmp_path / setup_record.RECORD_DIR / "k3.json").exists()


def _state(present: int, kernels: int = 4, op: bool = True) -> CacheState:
    return CacheState(kernels, present, op, f"the kernel cache holds {present} of the {kernels} kernels")


def test_between_the_warm_and_cold_costs_the_cache_decides() -> None:
    step = _step_between(SECONDS.warm, SECONDS.warm + SECONDS.kernels)
    warm = payback.estimate(STEPS, step, "cpu", TIMING, lambda: _state(4))
    assert warm.affordable and warm.case == "warm"
    assert f"{SECONDS.warm:.1f} s fixed on cpu, warm: the kernel cache holds 4 of the 4 kernels" in warm.why
    cold = payback.estimate(STEPS, step, "cpu", TIMING, lambda: _state(0))
    assert not cold.affordable and cold.case == "cold"
    assert f"{SECONDS.cold - SECONDS.op:.1f} s fixed on cpu, cold: the kernel cache holds 0 of the 4" in cold.why
    no_op = payback.estimate(STEPS, step, "cpu", TIMING, lambda: _state(0, op=False))
    assert no_op.cost == pytest.approx(SECONDS.cold + TIMING.exploring_steps * step * payback.PROBE_LOSS)
    assert "and the native op is to be built" in no_op.why
    partly = payback.estimate(STEPS, step, "cpu", TIMING, lambda: _state(2))
    assert partly.case == "partly warm" and warm.cost < partly.cost < cold.cost
    assert partly.cost == pytest.approx(warm.cost + SECONDS.kernels / 2)


def test_unread_cache_counts_as_cold_and_is_read_wherever_the_gain_repays_the_exploring() -> None:
    """Session 49: the cache went unread where the best gain did not repay the fixed warm figure (1.5 s), so a job
    whose last run here measured a warm setup of 0.9 s (the MLP's 6000 steps of 1.28 ms: a gain of at most 1.5 s) was
    weighed as cold (7.7 s) and skipped. It is read unless the gain does not even repay the exploring."""
    read: list[int] = []

    def cache() -> CacheState:
        read.append(1)
        return _state(4)

    between = _step_between(SECONDS.warm, SECONDS.warm + SECONDS.kernels)
    assert not payback.estimate(STEPS, between, "cpu", TIMING).affordable  # nothing to read: the cold figure
    # a job whose steps after exploring gain less than the exploring loses (10 steps at 20% against 58 at 25%)
    none = payback.estimate(TIMING.exploring_steps + 10, between, "cpu", TIMING, cache)
    assert not none.affordable and "the gain does not repay the exploring, the cache unread" in none.why
    assert not read
    short = payback.estimate(STEPS, _step_between(0.0, SECONDS.warm), "cpu", TIMING, cache)
    assert not short.affordable and read == [1]  # read: a measured warm setup could cost less than the fixed one
    read.clear()
    assert payback.estimate(STEPS, between, "cpu", TIMING, cache).affordable and read == [1]
    # A job long enough for a cold setup reads it too: its last run's measured gain can still say no
    long = payback.estimate(STEPS, _step_between(SECONDS.cold, 2 * SECONDS.cold), "cpu", TIMING, cache)
    assert long.affordable and long.case == "warm" and read == [1, 1]


def test_backends_not_measured_take_the_cold_figure_whatever_the_cache_holds() -> None:
    other = payback.SETUP_SECONDS_OTHER
    assert other.fixed(_state(4)) == other.fixed(_state(0, op=False)) == SECONDS.cold
    assert payback.fixed_seconds("cpu") == SECONDS.cold


def test_a_second_run_finds_its_kernels_and_sets_up_at_the_warm_cost(tmp_path: Path) -> None:
    step_ms = _step_between(SECONDS.warm, SECONDS.warm + SECONDS.kernels) * 1e3
    first = make_settings(tmp_path, "record-first", STITCHFLEET_JOB_STEPS="0", STITCHFLEET_PROBE_STEPS="2")
    hook = StitchHook(first, backend="cpu", db_url=f"sqlite:///{tmp_path / 'first.db'}")
    _train(3, hook, tf.compat.v1.train.StopAtStepHook(num_steps=STEPS))  # no step time told: it sets up
    assert hook.installed
    url = f"sqlite:///{tmp_path / 'second.db'}"
    second = make_settings(
        tmp_path,
        "record-second",
        STITCHFLEET_JOB_STEPS="0",
        STITCHFLEET_PROBE_STEPS="2",
        STITCHFLEET_STEP_MS=f"{step_ms}",
    )
    hook = StitchHook(second, backend="cpu", db_url=url)
    _train(3, hook, tf.compat.v1.train.StopAtStepHook(num_steps=STEPS))  # the same script: the same graph key
    # Failed once in CI with nothing installed, nothing skipped and no warning logged (not reproduced in 10 runs
    # alone under load, nor in 2 runs of tests/plugin/setup and session on 2 workers): say what the run recorded.
    assert hook.installed and hook.length.skipped is None, _recorded(url, tmp_path, hook)
    detail = {event.reason: event.detail for event in events(url, "setup")}["setup affordable"]
    assert ", warm: the kernel cache holds " in detail and "setup can pay back" in detail


def _recorded(url: str, tmp_path: Path, hook: StitchHook) -> str:
    """What a hooked run recorded of its setup: the events that skip or fail it or leave clusters to TF, its builds."""
    kinds = ("setup", "fleet_memory", "compile_failure", "probe", "revert")
    spool = tmp_path / "state" / "spool"
    seen = [f"{kind}: {e.reason}: {e.detail}" for kind in kinds for e in events(url, kind, spool)]
    built = hook.setup.built if hook.setup is not None else "no setup"
    return f"skipped {hook.length.skipped!r}; built {built!r}; events {seen}"


def test_the_same_job_on_an_empty_cache_is_cold_and_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch_op, "_LOADED", [])  # a new process (a pod): no op loaded by an earlier test's job
    step_ms = _step_between(SECONDS.warm, SECONDS.warm + SECONDS.kernels) * 1e3
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    current = make_settings(
        tmp_path,
        "record-cold",
        STITCHFLEET_JOB_STEPS="0",
        STITCHFLEET_PROBE_STEPS="2",
        STITCHFLEET_STEP_MS=f"{step_ms}",
        STITCHFLEET_CACHE_DIR=str(tmp_path / "empty-cache"),
    )
    hook = StitchHook(current, backend="cpu", db_url=url)
    _train(3, hook, tf.compat.v1.train.StopAtStepHook(num_steps=STEPS))
    assert not hook.installed and hook.length.skipped is not None
    assert "cold: no earlier setup of this job's graph is recorded in the kernel cache" in hook.length.skipped
    assert "and the native op is to be built" in hook.length.skipped
    [setup] = events(url, "setup", tmp_path / "state" / "spool")
    assert setup.reason == "setup skipped: job too short" and setup.detail == hook.length.skipped
    assert not (tmp_path / "empty-cache" / "cpu").exists()  # skipped: nothing compiled


MEASURED = setup_record.Measured(gain=0.02, steps=1800, per_run=8.0)


def test_what_a_run_measured_is_kept_with_its_setups_record_and_read_back(tmp_path: Path) -> None:
    kernels = _kernels(tmp_path, ["a.so", "b.so"])
    assert setup_record.write(tmp_path, "m1", "cpu", kernels)
    assert setup_record.recall(tmp_path, "m1", "cpu", op=True).measured is None
    assert setup_record.remember(tmp_path, "m1", "cpu", MEASURED)
    state = setup_record.recall(tmp_path, "m1", "cpu", op=True)
    assert state.measured == MEASURED and state.case == "warm"
    assert setup_record.write(tmp_path, "m1", "cpu", kernels)  # the next setup by the same code keeps them
    assert setup_record.recall(tmp_path, "m1", "cpu", op=True).measured == MEASURED
    path = tmp_path / setup_record.RECORD_DIR / "m1.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "measured": {"gain": "x", "steps": 3, "per_run": 1.0}}))
    assert setup_record.recall(tmp_path, "m1", "cpu", op=True).measured is None  # unreadable figures: none
    path.write_text(json.dumps({**doc, "code": "other"}))
    assert not setup_record.remember(tmp_path, "m1", "cpu", MEASURED)  # other code's kernels: not theirs to weigh
    assert setup_record.write(tmp_path, "m1", "cpu", kernels)  # and this code's next setup drops them
    assert setup_record.recall(tmp_path, "m1", "cpu", op=True).measured is None
    assert not setup_record.remember(tmp_path, "none", "cpu", MEASURED)  # no setup recorded: nothing to add to


def test_a_measured_gain_below_the_best_or_a_larger_setup_says_no_where_the_best_would_set_up() -> None:
    step = _step_between(SECONDS.cold, 2 * SECONDS.cold)  # the best gain repays even a cold setup
    best = payback.estimate(STEPS, step, "cpu", TIMING, lambda: _state(4))
    assert best.affordable
    small = CacheState(4, 4, True, "the kernel cache holds 4 of the 4 kernels", MEASURED)
    found = payback.estimate(STEPS, step, "cpu", TIMING, lambda: small)
    exploring = TIMING.exploring_steps
    stitched = 1 - TIMING.block / TIMING.period  # a baseline block of the user's graph every period: 95%
    assert found.gain == pytest.approx((STEPS - exploring - _settling(STEPS)) * step * MEASURED.gain * stitched)
    assert found.cost == pytest.approx(MEASURED.per_run + exploring * step * payback.PROBE_LOSS)
    assert not found.affordable
    assert f"(1.9% of the steps after {exploring} exploring, 2.0% on the 95% of them that run stitched:" in found.why
    assert "its last run here ran 1800 stitched steps 2.0% faster than plain TF's step" in found.why
    lost = CacheState(4, 4, True, "", setup_record.Measured(gain=-0.05, steps=900, per_run=0.5))
    assert not payback.estimate(10 * STEPS, step, "cpu", TIMING, lambda: lost).affordable  # no length repays a loss


def test_a_measured_gain_above_the_best_counts_as_measured() -> None:
    """Session 51: the measured share was capped at BEST_GAIN (20%). The MLP's last run measured its stitched steps
    34.7% faster (noise 1.0%), and 3000-step runs of 1.13 ms weighed "a gain of at most 0.7 s (20.0% ...) against a
    setup cost of about 0.7 s" and ran as written, where set up they saved 0.6-1.6 s of their steps. The measured
    figure, less twice its noise, on the steps that run stitched, repays that setup."""
    mlp = setup_record.Measured(gain=0.347, steps=2810, per_run=0.68, noise=0.01)
    found = payback.estimate(3000, 0.00113, "cpu", TIMING, lambda: CacheState(5, 5, True, "", mlp))
    stitched = 1 - TIMING.block / TIMING.period
    exploring = TIMING.exploring_steps
    ran = 3000 - exploring - _settling(3000)  # a settle block of 150 steps (5% of the job)
    assert found.gain == pytest.approx(ran * 0.00113 * (0.347 - 2 * 0.01) * stitched)
    assert (3000 - exploring) * 0.00113 * payback.BEST_GAIN < found.cost  # capped at the best, it refused
    assert found.affordable, found.why
    assert "(31.1% of the steps after" in found.why and "32.7% on the 95% of them that run stitched" in found.why


def test_a_warm_run_costs_what_its_last_run_here_measured_below_the_fixed_figure_too() -> None:
    """Session 49: the fixed warm figure (1.5 s, the demo's on session 18's machine) floored what the job's last run
    measured; on a node twice as fast the MLP's 6000 steps of 1.28 ms weighed a gain of 1.5 s against it and skipped
    their setup, where set up warm it paid 0.64 s and saved +1.6 s net. A measured figure stands, smaller too."""
    step = 0.00128
    fast = setup_record.Measured(gain=0.35, steps=4000, per_run=0.64, noise=0.01)
    found = payback.estimate(6000, step, "cpu", TIMING, lambda: CacheState(5, 5, True, "", fast))
    exploring = TIMING.exploring_steps
    assert SECONDS.warm > fast.per_run
    assert found.cost == pytest.approx(fast.per_run + exploring * step * payback.PROBE_LOSS)
    assert found.affordable and "0.6 s fixed on cpu" in found.why
    unmeasured = setup_record.Measured(gain=0.35, steps=4000, per_run=0.0, noise=0.01)  # no figure: the fixed one
    fixed = payback.estimate(6000, step, "cpu", TIMING, lambda: CacheState(5, 5, True, "", unmeasured))
    assert fixed.cost == pytest.approx(SECONDS.warm + exploring * step * payback.PROBE_LOSS)


def test_a_steady_gain_within_its_noise_is_no_gain_a_warm_run_sets_up_for() -> None:
    """Session 21: the corpus BERT's cold run kept its clusters at a steady gain that one run measured; the warm run
    set up on it and lost (55.5 s against plain TF's 46.9 s). A steady gain now counts less twice its noise (the
    report's 95% rule): a gain the report would not claim repays no setup, a clear one still does."""
    step = _step_between(SECONDS.cold, 2 * SECONDS.cold)  # the best gain repays even a cold setup
    clear = setup_record.Measured(gain=0.09, steps=900, per_run=0.5, noise=0.005)
    vague = setup_record.Measured(gain=0.09, steps=900, per_run=0.5, noise=0.05)
    assert clear.expected() == pytest.approx(0.08) and vague.expected() == pytest.approx(-0.01)
    assert setup_record.Measured(gain=-0.03, steps=900, per_run=0.5, noise=0.05).expected() == -0.03  # a loss as it is
    assert payback.estimate(STEPS, step, "cpu", TIMING, lambda: CacheState(4, 4, True, "", clear)).affordable
    found = payback.estimate(STEPS, step, "cpu", TIMING, lambda: CacheState(4, 4, True, "", vague))
    assert not found.affordable
    said = "ran 900 stitched steps 9.0% faster than plain TF's step (noise 5.0%: 1.0% slower than plain TF's step"
    assert said in found.why


def test_a_run_that_stitched_leaves_its_measured_figures_and_the_next_run_weighs_them(tmp_path: Path) -> None:
    """The BERT run_classifier of the corpus (issue 29): a warm run set up on the demo's figures (10% of its steps
    against 1.5 s) and paid 8 s of setup for a 3.8% steady gain. What a run measured now reaches the next one."""
    cache = tmp_path / "cache"
    fixed = {
        "STITCHFLEET_CACHE_DIR": str(cache),
        "STITCHFLEET_BRIDGE": "python",
        "STITCHFLEET_JOB_STEPS": "0",
        "STITCHFLEET_REBASELINE_EVERY": "20",
        "STITCHFLEET_CHECK_EVERY": "1000000",
        "STITCHFLEET_SLOWDOWN_MARGIN": "100",  # a loaded machine's noise must not revert the run being measured
    }
    hook = StitchHook(make_settings(tmp_path, "measured-first", **fixed), backend="cpu")
    _train(200, hook, tf.compat.v1.train.StopAtStepHook(num_steps=200))
    assert hook.setup is not None and hook.setup.recorded and hook.controller is not None
    windows = hook.controller.windows
    found = setup_record.recall(cache, hook.setup.recorded, "cpu", op=True).measured
    assert found is not None and found.steps == windows.steady_steps >= setup_record.MIN_STEADY_STEPS
    assert found.gain == pytest.approx(windows.steady_gain) and found.per_run > 0
    assert found.noise == pytest.approx(windows.steady_noise) and found.noise > 0
    # The next run of the same graph, told a step time at which the best gain repays even a cold setup: a loss
    # measured by the run before says no, for any length.
    assert setup_record.remember(cache, hook.setup.recorded, "cpu", setup_record.Measured(-0.05, 100, found.per_run))
    step_ms = _step_between(SECONDS.cold, 2 * SECONDS.cold) * 1e3
    url = f"sqlite:///{tmp_path / 'second.db'}"
    second = StitchHook(
        make_settings(tmp_path, "measured-second", **fixed, STITCHFLEET_STEP_MS=f"{step_ms}"), backend="cpu", db_url=url
    )
    _train(3, second, tf.compat.v1.train.StopAtStepHook(num_steps=STEPS))
    assert not second.installed and second.length.skipped is not None
    assert "setup cannot pay back" in second.length.skipped
    assert "its last run here ran 100 stitched steps 5.0% slower than plain TF's step" in second.length.skipped


def test_a_measured_figure_says_faster_or_slower_in_words() -> None:
    """Session 33: the corpus BERT's next run read "measured every cluster on at -11.4% of plain TF's step", a
    signed share of the step saved that a reader takes for a speedup; the sentence now says which way it went."""
    lost = setup_record.Measured(gain=-0.114, steps=155, per_run=4.7, source=setup_record.GROUP, noise=0.044)
    assert "measured every cluster on 11.4% slower than plain TF's step in its group probe (155 steps" in lost.said()
    even = setup_record.Measured(gain=0.0004, steps=155, per_run=4.7, source=setup_record.GROUP, noise=0.044)
    assert "measured every cluster on as fast as plain TF's step in its group probe" in even.said()
    slowed = setup_record.Measured(gain=-0.05, steps=400, per_run=1.0, source=setup_record.SLOWDOWN, noise=0.01)
    assert "its stitched steps 5.0% slower than plain TF's step (noise 1.0%)" in slowed.said()
