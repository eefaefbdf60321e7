"""A GAN-style job: two optimizers stepped alternately in one session, the generator's step feeding only
the noise. Remote stitching joins the discriminator's real-data and generated-data branches into one
cluster, so the stitched copy of the generator's step would read the real-data placeholder it never feeds.

Regression: that step failed on the copy, ran again as written and reverted stitching for the whole job
(and a run that fails part-way may already have run shared stateful ops: a batch pulled, a counter
bumped). Now the twin declines such a run before it runs: the discriminator's steps are stitched, the
generator's run as written, uncounted, and nothing reverts."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph.twin import _unfed_placeholders  # noqa: E402
from tests.plugin.hook_harness import hooked  # noqa: E402

pytestmark = pytest.mark.tf
V1 = tf.compat.v1
STEPS = 14


def _gan() -> tuple[Any, dict[str, Any]]:
    graph = tf.Graph()
    with graph.as_default():
        V1.set_random_seed(0)
        z = V1.placeholder(tf.float32, [16, 8], name="z")
        x = V1.placeholder(tf.float32, [16, 16], name="x")

        def disc(h: Any) -> Any:
            with V1.variable_scope("disc", reuse=V1.AUTO_REUSE):
                h = tf.nn.leaky_relu(V1.layers.dense(h, 32, name="d1"))
                mean, var = tf.nn.moments(h, [-1], keepdims=True)
                return V1.layers.dense((h - mean) * tf.math.rsqrt(var + 1e-5), 1, name="d2")

        with V1.variable_scope("gen"):
            fake = V1.layers.dense(tf.nn.gelu(V1.layers.dense(z, 32, name="g1")), 16, name="g2")
        real_logits, fake_logits = disc(x), disc(fake)
        bce = tf.nn.sigmoid_cross_entropy_with_logits
        d_loss = tf.reduce_mean(
            bce(labels=tf.ones_like(real_logits), logits=real_logits)
            + bce(labels=tf.zeros_like(fake_logits), logits=fake_logits)
        )
        g_loss = tf.reduce_mean(bce(labels=tf.ones_like(fake_logits), logits=fake_logits))
        step = V1.train.get_or_create_global_step()
        scope = V1.GraphKeys.TRAINABLE_VARIABLES
        d_op = V1.train.AdamOptimizer(1e-3).minimize(d_loss, var_list=V1.get_collection(scope, "disc"))
        g_op = V1.train.AdamOptimizer(1e-3).minimize(g_loss, var_list=V1.get_collection(scope, "gen"), global_step=step)
    return graph, {"x": x, "z": z, "d": [d_loss, d_op], "g": [g_loss, g_op]}


def test_the_generators_step_stays_as_written_and_nothing_reverts(tmp_path: Path) -> None:
    graph, model = _gan()
    rng = np.random.default_rng(0)
    real, noise = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    hook, url = hooked(tmp_path, "gan")
    with graph.as_default(), V1.train.MonitoredSession(hooks=[hook]) as session:
        for _ in range(STEPS):
            session.run(model["d"], {model["x"]: real, model["z"]: noise})
            session.run(model["g"], {model["z"]: noise})
    assert hook.installed and hook.controller is not None
    assert hook.controller.job_reverted is None, hook.controller.job_reverted
    assert hook.diverter is not None and hook.diverter.failure is None
    assert any(cluster.kernel.calls > 0 for cluster, _ in hook.installed)  # the discriminator's steps stitched
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        (counted,) = connection.execute("SELECT SUM(iterations) FROM step_windows").fetchone()
    assert counted == STEPS  # the generator's steps ran as written: not counted


def test_the_walk_finds_the_placeholders_a_run_would_execute_unfed() -> None:
    graph, model = _gan()
    with graph.as_default():
        g_ops = [t if isinstance(t, tf.Operation) else t.op for t in model["g"]]
        d_ops = [t if isinstance(t, tf.Operation) else t.op for t in model["d"]]
    assert _unfed_placeholders(g_ops, {"z"}) == set()
    assert _unfed_placeholders(d_ops, {"z"}) == {"x"}
    assert _unfed_placeholders(d_ops, {"x", "z"}) == set()


def test_ranks_whose_compiles_differ_decline_the_same_runs() -> None:
    """Whether the copy can take a run depends on the graph alone: a rank that installed no kernel (its
    compiles failed) must decline the generator's step as a rank with the joined cluster's stitched op
    does, or the two would count different runs as training steps and pair their collectives wrongly."""
    from stitchfleet.plugin.graph.twin import build
    from tests.plugin.site_harness import map_all

    graph, model = _gan()
    with graph.as_default():
        sites = map_all(graph).sites
        twin = build(graph, sites)  # the copy before any kernel is installed: what a rank without kernels runs
        g_ops = [t if isinstance(t, tf.Operation) else t.op for t in model["g"]]
        d_ops = [t if isinstance(t, tf.Operation) else t.op for t in model["d"]]
    assert any({"x", "z"} <= _reads_of(site) for site in sites)  # remote stitching joined both branches
    assert not twin.runnable(g_ops, [model["z"]])
    assert twin.runnable(d_ops, [model["x"], model["z"]])


def _reads_of(site: Any) -> set[str]:
    """The placeholders a cluster's inputs depend on."""
    return _unfed_placeholders([t.op for t in site.inputs], set())
