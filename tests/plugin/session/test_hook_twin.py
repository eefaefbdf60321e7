"""A step with every cluster off runs the user's own graph: exactly what plain TF runs.

The hook installs stitching on a copy of what depends on the clusters (`plugin.twin`). These
tests trace which TF nodes each step of a real training run (small BERT encoder, cpu backend)
executed: baseline and warmup steps run the same nodes as a run without the plugin, stitched
steps run the copy and none of the original ops it copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from stitchfleet.demo import models
from stitchfleet.plugin.control.schedule import BASELINE, STITCHED, WARMUP
from stitchfleet.plugin.graph.twin_mark import PREFIX
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.telemetry import models as tables
from tests.plugin.hook_harness import _feeds, events, hooked, make_settings, train

pytestmark = pytest.mark.tf

STEPS = 14


def _traced(steps: int, hook: StitchHook | None) -> list[tuple[str, set[str]]]:
    """(mode before the step, names of the nodes it executed) per step."""
    graph = models.build("bert_encoder", "small", seed=1)
    traced = []
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
            for step in range(steps):
                controller = hook.controller if hook is not None else None
                mode = controller.mode(step) if controller is not None else "plain"
                if controller is not None and step in controller.warmup.builds:
                    mode = "build"
                metadata = tf.compat.v1.RunMetadata()
                session.run([loss, train_op], feeds, options=options, run_metadata=metadata)
                names = {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}
                traced.append((mode, names))
    return traced


def _kernel_nodes(names: set[str]) -> set[str]:
    # The executor traces its _SOURCE node and the fetch/feed nodes it adds per run: not the user's ops.
    return {n for n in names if not n.startswith("_")}


def test_steps_with_every_cluster_off_run_exactly_plain_tf(tmp_path: Path) -> None:
    plain = _traced(3, None)
    reference = _kernel_nodes(plain[-1][1])
    hook, _ = hooked(tmp_path, "twin-trace", STITCHFLEET_WARMUP_STEPS="4")
    traced = _traced(STEPS, hook)
    assert hook.installed
    modes = [mode for mode, _ in traced]
    assert modes.count(BASELINE) >= 3 and modes.count(STITCHED) >= 3 and modes.count("build") == 2
    for step, (mode, names) in enumerate(traced):
        ran = _kernel_nodes(names)
        if mode in (WARMUP, BASELINE) and step > 0:
            assert ran == reference, f"step {step} ({mode}) ran other nodes than plain TF"
        elif mode in (STITCHED, "build"):
            assert any(n.startswith(f"{PREFIX}/") for n in ran), f"step {step} ({mode}) did not run the twin"
            originals_copied = {n for n in ran if n in reference and f"{PREFIX}/{n}" in ran}
            assert not originals_copied, f"step {step} ran original ops the twin copies: {sorted(originals_copied)[:5]}"


def test_baseline_steps_run_tfs_own_path_as_plain_tf_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: a baseline step stands for plain TF's step, so it runs TF's own path (one `_FetchHandler` built per
    run, as plain TF builds); a stitched step past its checks runs prepared (none). Session 23 to 38 ran the baseline
    prepared too, which on the demo made it 0.36-0.53 ms a step faster than plain TF beside it (5.7-6.1 ms steps):
    the report booked 1.5-2.5 s less than the clock over 5300 stitched steps (scripts/savings_bias.py)."""
    from tensorflow.python.client import session as tf_session

    built: list[int] = []
    original = tf_session._FetchHandler.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(tf_session._FetchHandler, "__init__", counted)
    hook, _ = hooked(tmp_path, "twin-prepared", STITCHFLEET_REBASELINE_EVERY="6", STITCHFLEET_PAIRED_STEPS="2")
    graph = models.build("bert_encoder", "small", seed=1)
    per_mode: dict[str, list[int]] = {}
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for step in range(20):
                assert hook.controller is not None or step == 0
                mode = hook.controller.mode(step) if hook.controller is not None else "setup"
                before = len(built)
                session.run([loss, train_op], feeds)
                per_mode.setdefault(mode, []).append(len(built) - before)
    assert hook.installed and hook.diverter is not None and hook.diverter.failure is None
    assert len(per_mode.get(BASELINE, [])) >= 4 and len(per_mode.get(STITCHED, [])) >= 4, per_mode
    assert per_mode[BASELINE][1:] == [1] * (len(per_mode[BASELINE]) - 1), per_mode
    assert per_mode[STITCHED][-3:] == [0, 0, 0], per_mode  # the first ones check (other fetches, built once)


class _Returned(StitchHook):
    """Records what `before_run` added to each training step (None: nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.added: list[Any] = []

    def before_run(self, run_context: Any) -> Any:
        args = super().before_run(run_context)
        self.added.append(args)
        return args


def test_once_stitching_is_over_the_hook_adds_nothing_to_a_step(tmp_path: Path) -> None:
    """A really slower kernel reverts the job (slowdown guard); from the next step on the hook adds no fetch,
    feed or collective (plain TF), yet keeps counting the steps for the job's telemetry."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    current = make_settings(tmp_path, "quiet", STITCHFLEET_REBASELINE_EVERY="12")
    hook = _Returned(current, backend="cpu", fault=Fault("slow", cluster=5), db_url=url)
    steps = 60
    train(steps, hook)
    assert hook.controller is not None and hook.controller.done
    reverted = hook.controller.job_reverted
    assert reverted is not None and reverted.startswith("slowdown"), reverted
    [revert] = events(url, "revert")
    before = hook.added[: revert.step + 1]
    assert sum(args is not None for args in before) > revert.step // 2  # the twin's steps fetch and feed
    # a step of the user's graph (a baseline block, the warmup's first) of a single rank adds nothing either: it
    # costs what plain TF's step costs (session 47)
    phase = hook.controller.timing.phase
    assert all(phase(step) in (BASELINE, WARMUP) for step, args in enumerate(before) if args is None), before
    baseline = [args for step, args in enumerate(before) if phase(step) == BASELINE]
    assert baseline and all(args is None for args in baseline), baseline
    assert hook.added[revert.step + 1 :] == [None] * (steps - revert.step - 1)
    assert hook.step == steps
    engine = sa.create_engine(url)
    with engine.connect() as connection:
        counted = connection.execute(sa.select(sa.func.sum(tables.StepWindow.iterations))).scalar()
    engine.dispose()
    assert counted == steps


def _v1_control_flow_model() -> tuple[Any, list[Any], dict[Any, Any]]:
    """A TF1 model built with control flow v1 (as under `disable_v2_behavior`): the training step also
    fetches a metric computed by a cond on a training flag inside a while loop, from the loss, so both
    depend on the stitched clusters and are copied into the twin."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [16, 32], name="x")
        training = tf.compat.v1.placeholder_with_default(True, [], name="training")
        w = tf.compat.v1.get_variable("w", [32, 32], initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
        h = tf.matmul(x, w)
        centred = h - tf.reduce_mean(h, axis=-1, keepdims=True)
        normed = centred * tf.math.rsqrt(tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + 1e-5)
        act = tf.nn.gelu(normed * 1.5 + 0.1)
        loss = tf.reduce_mean(tf.square(tf.matmul(act, w)), name="loss")
        scaled = tf.compat.v1.cond(training, lambda: loss * 0.9, lambda: loss)
        _, metric = tf.compat.v1.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s + scaled), [0, 0.0])
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
        values = {x: np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)}
    return graph, [loss, train_op, metric], values


def _losses(steps: int, hook: StitchHook | None) -> list[tuple[float, float]]:
    graph, fetches, values = _v1_control_flow_model()
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
        results = [session.run(fetches, values) for _ in range(steps)]
    return [(float(loss), float(metric)) for loss, _, metric in results]


def test_a_graph_with_tf1_control_flow_trains_the_same_on_the_twin(tmp_path: Path) -> None:
    tf.compat.v1.disable_control_flow_v2()
    try:
        plain = _losses(12, None)
        hook, _ = hooked(tmp_path, "v1-flow")
        stitched = _losses(12, hook)
    finally:
        tf.compat.v1.enable_control_flow_v2()
    assert hook.installed and hook.controller is not None and hook.controller.job_reverted is None
    assert min(hook.backend_calls.values()) > 0  # the stitched steps ran on the twin
    assert hook.diverter is not None and any("while/LoopCond" in name for name in hook.diverter.twin.members)
    np.testing.assert_allclose(stitched, plain, rtol=2e-5)
    np.testing.assert_allclose([m for _, m in plain], [3 * 0.9 * loss for loss, _ in plain], rtol=1e-5)


class _BrokenTwin(StitchHook):
    """Breaks the twin after `begin`: the copy of a gradient's scalar constant (Square's 2) becomes a vector of
    7, which no tensor of the model broadcasts with, so every run on the twin fails in TF's Mul kernel while
    the user's graph is intact."""

    def begin(self) -> None:
        super().begin()
        copy = tf.compat.v1.get_default_graph().get_operation_by_name(f"{PREFIX}/gradients/Square_grad/Const")
        vector = tf.make_tensor_proto(np.full([7], 2.0, np.float32))
        copy._set_attr("value", attr_value_pb2.AttrValue(tensor=vector))


def test_a_step_that_fails_on_the_twin_runs_again_as_written_and_reverts_stitching(tmp_path: Path) -> None:
    plain = train(12, None)
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    hook = _BrokenTwin(make_settings(tmp_path, "broken-twin", STITCHFLEET_WARMUP_STEPS="4"), backend="cpu", db_url=url)
    run = train(12, hook)
    assert len(run.losses) == 12 and np.isfinite(run.losses).all()  # the job ran to its end
    assert hook.controller is not None
    failed = min(hook.controller.warmup.builds)  # the first step on the twin
    np.testing.assert_allclose(run.losses[: failed + 1], plain.losses[: failed + 1], rtol=2e-5)
    # The failed run had applied some updates before its error and the step ran again whole: training goes on
    # from slightly different variables (a failure of the twin costs one perturbed step, never the job).
    assert hook.controller is not None and hook.controller.done
    reverted = hook.controller.job_reverted
    assert reverted is not None and reverted.startswith("plugin error"), reverted
    [revert] = events(url, "revert")
    # The fault joins the next step's consensus (every rank keeps the same path until the decision, so
    # Horovod ranks name the same collectives): the build step after it ran on the twin too, failed and ran
    # again as written, and the revert holds from the step after that decision.
    assert revert.step == failed + 2
    assert min(hook.backend_calls.values()) == 0  # no stitched kernel ever ran


def _partition_ops(session: Any, fetches: Any, feeds: Any) -> set[str]:
    """The op types of the graph TF ran for one step, after grappler and the oneDNN rewrites."""
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    session.run(fetches, feeds, options=options, run_metadata=metadata)
    return {node.op for graph in metadata.partition_graphs for node in graph.node}


def test_the_twin_keeps_the_attention_batchmatmul_fused_as_the_users_graph(tmp_path: Path) -> None:
    """TF fuses the attention's BatchMatMul x scale + mask into `_MklFusedBatchMatMulV2` only while the product
    has no other live reader. The scale's gradient reads it too, dead (grappler prunes it); a cluster that held
    that gradient's Sum made the stitched step run it, and the twin lost the fusion."""
    hook, _ = hooked(tmp_path, "twin-fusions", STITCHFLEET_BRIDGE="native")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        fetches = [graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")]
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            raw = session._tf_sess()  # the switches fed directly, as scripts/bench_step.py does
            assert hook.installed and hook.diverter is not None and hook.switches is not None
            users = _partition_ops(raw, fetches, feeds)
            hook.diverter.armed = True
            on = np.ones(len(hook.installed), bool)
            twins = _partition_ops(raw, fetches, {**feeds, hook.switches: on})
    if "_MklFusedBatchMatMulV2" not in users:
        pytest.skip("this TF build does not fuse BatchMatMul x scale + mask (no oneDNN)")
    assert "StitchfleetDispatch" in twins  # the step ran on the twin
    assert "_MklFusedBatchMatMulV2" in twins
