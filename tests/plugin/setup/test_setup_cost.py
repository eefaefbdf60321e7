"""What a pod's setup pays, and that a warm setup decides exactly what the cold one did.

A cold `begin` (empty kernel cache) and a warm one (the cache the cold one filled: the job's second
pod) must install the same clusters, with the same C and libraries, and leave the same ones to TF
for the same reasons; the warm one compiles nothing and generates no C. Clusters past the compile
budget stay with TF and are compiled in the background for the next pod. The hook reports its
compiles (log line and a `setup` event).
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from stitchfleet.compiler.targets.cpu import source as source_module
from stitchfleet.demo import models
from stitchfleet.plugin.session import gc_pause
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.plugin.setup import selection
from tests.plugin.hook_harness import events, make_settings

pytestmark = pytest.mark.tf


def _begin(tmp: Path, cache: Path, uid: str, **extra: str) -> tuple[StitchHook, str]:
    url = f"sqlite:///{tmp / f'{uid}.db'}"
    current = make_settings(tmp, uid, STITCHFLEET_CACHE_DIR=str(cache), STITCHFLEET_BRIDGE="python", **extra)
    hook = StitchHook(current, backend="cpu", db_url=url)
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        hook.begin()
    return hook, url


def _installed(hook: StitchHook) -> list[tuple[int, str, str, str]]:
    return [
        (c.index, c.fingerprint, c.kernel.executable.source.text, str(c.kernel.executable.library_path))
        for c, _ in hook.installed
    ]


def test_a_warm_begin_installs_exactly_what_the_cold_one_did(tmp_path: Path, monkeypatch: Any) -> None:
    cache = tmp_path / "cache"
    cold, cold_url = _begin(tmp_path, cache, "cold")
    assert cold.installed and cold.active
    generated: list[int] = []
    original = source_module.cluster_source

    def counting(*args: Any, **kwargs: Any) -> Any:
        generated.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("stitchfleet.compiler.targets.cpu.source_cache.cluster_source", counting)
    warm, warm_url = _begin(tmp_path, cache, "warm", STITCHFLEET_COMPILE_WORKERS="1")
    assert _installed(warm) == _installed(cold)
    assert warm.off == cold.off
    assert not generated  # the warm pod generated no C: every cluster's source came from the cache
    for hook, url, compiled in ((cold, cold_url, len(cold.installed)), (warm, warm_url, 0)):
        assert hook.ledger is not None
        hook.ledger.close()
        decided, setup = events(url, "setup")  # whether setup can pay back (payback.py), then what it built
        assert decided.reason == "setup affordable" and "setup runs" in decided.detail
        assert setup.reason.startswith("setup ")
        assert f"{len(cold.installed)} cluster(s) built" in setup.detail
        assert f"({compiled} compiled, {len(cold.installed) - compiled} from the kernel cache" in setup.detail


def _choose(tmp: Path, cache: Path, **extra: str) -> selection.Candidates:
    from stitchfleet.compiler.pipeline import Options, compile_graph
    from stitchfleet.plugin.frontend.converter import convert
    from stitchfleet.plugin.graph.mapping import StepOps

    current = make_settings(tmp, "budget", STITCHFLEET_CACHE_DIR=str(cache), STITCHFLEET_BRIDGE="python", **extra)
    graph = models.build("bert_encoder", "small", seed=1)
    conversion = convert(StepOps(graph), name="budget")
    art = compile_graph(conversion.graph, Options(baselines=("per_op",)))
    return selection.choose(graph, conversion, art, backend="cpu", known_bad=set(), current=current)


def test_clusters_past_the_compile_budget_stay_with_tf_and_are_compiled_for_the_next_pod(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    spent = _choose(tmp_path, cache, STITCHFLEET_COMPILE_BUDGET="0")
    assert not spent.sites and spent.mapped
    late = [reason for _, _, reason in spent.left if reason.startswith("compile budget spent")]
    assert len(late) == len(spent.mapped) == spent.compiles.over_budget
    assert "into the kernel cache for a later pod" in late[0]
    assert "left to TF past the 0 s compile budget" in spent.compiles.describe(0.0)
    assert spent.background is not None
    spent.background.join(timeout=300)
    assert not spent.background.is_alive()
    again = _choose(tmp_path, cache)
    assert len(again.sites) == len(spent.mapped)
    assert again.compiles.built == len(spent.mapped) and again.compiles.compiled == 0  # all from the cache
    assert again.background is None and again.compiles.over_budget == 0


def test_parallel_compiles_choose_the_same_clusters_in_the_same_order(tmp_path: Path) -> None:
    one = _choose(tmp_path, tmp_path / "one", STITCHFLEET_COMPILE_WORKERS="1")
    two = _choose(tmp_path, tmp_path / "two", STITCHFLEET_COMPILE_WORKERS="2")
    assert (one.compiles.workers, two.compiles.workers) == (1, 2)
    assert [c.index for c in one.clusters] == [c.index for c in two.clusters]
    assert [s.index for s in one.sites] == [s.index for s in two.sites]
    assert one.left == two.left
    texts = [[c.kernel.executable.source.text for c in found.clusters] for found in (one, two)]
    assert texts[0] == texts[1]
    assert one.compiles.compiled == two.compiles.compiled == len(one.clusters)


def test_the_collector_is_paused_during_setup_and_restored_as_it_was() -> None:
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a job that disabled it keeps it disabled
    finally:
        gc.enable()


def test_a_failed_setup_restores_the_collector(tmp_path: Path) -> None:
    hook = StitchHook(make_settings(tmp_path, "no-backend"), backend="cuda", db_url=f"sqlite:///{tmp_path / 't.db'}")
    with tf.Graph().as_default():
        hook.begin()  # the cuda backend cannot run here: begin fails inside, stitching stays off
    assert not hook.active and gc.isenabled()


def test_one_compile_at_a_time_while_the_native_op_is_built_beside_them(tmp_path: Path) -> None:
    """Measured on 2 cores: parallel compiles won 1.5 s with the op prebuilt and lost 0.9 s beside its build."""
    current = make_settings(tmp_path, "workers")
    assert selection.compile_workers(current, building_op=True) == 1
    assert selection.compile_workers(current) == max(1, min(selection.MAX_WORKERS, os.cpu_count() or 1))
    chosen = make_settings(tmp_path, "workers", STITCHFLEET_COMPILE_WORKERS="3")
    assert selection.compile_workers(chosen, building_op=True) == 3  # the setting wins


def test_no_background_build_when_the_shim_ships_the_op(tmp_path: Path, monkeypatch: Any) -> None:
    from stitchfleet.plugin.native import dispatch_op

    shipped = tmp_path / "ops"
    shipped.mkdir()
    (shipped / dispatch_op.prebuilt_name()).write_bytes(b"")
    monkeypatch.setattr(dispatch_op, "_LOADED", [])
    monkeypatch.setattr(dispatch_op, "_WARMING", {})
    monkeypatch.setattr(dispatch_op, "prebuilt_dirs", lambda: [shipped])
    assert dispatch_op.warm(tmp_path / "cache") is False
    assert not dispatch_op._WARMING  # nothing started: the compiles may take every core


@pytest.mark.parametrize("dump", [False, True])
def test_a_jobs_compile_asks_the_gpu_time_model_only_for_a_dump(tmp_path: Path, monkeypatch: Any, dump: bool) -> None:
    """The report's modeled GPU times are read by `stitchfleet compile`, never by a job: its setup skips them
    (issue 29's setup cost), unless it dumps its artifacts (the dump keeps the whole report)."""
    from stitchfleet.plugin.setup import job_graph

    asked: list[Any] = []

    def stop(graph: Any, options: Any) -> Any:
        asked.append(options)
        raise RuntimeError("stop after the compile's options")  # begin records the failure; nothing else to run

    monkeypatch.setattr(job_graph, "compile_graph", stop)
    extra = {"STITCHFLEET_DUMP_DIR": str(tmp_path / "dump")} if dump else {}
    hook, _ = _begin(tmp_path, tmp_path / "cache", "modeled", **extra)
    assert not hook.active and [options.modeled for options in asked] == [dump]
