"""A copy of a graph (import_graph_def) loses its TF1 control-flow contexts and cond_v2's unfetchable marks;
with `LiveMarks` from the live graph its conversion is the live graph's, node for node, and rebinding
rebuilds a None-batch job's clusters for the batch it feeds.

Regression: a tf.estimator job fed by tf.data has a TF1 cond around its global-step read. The live graph's
conversion kept it as a boundary; the copy rebinding converts for the fed batch did not, so every later IR
node moved by one and every cluster stayed on TF's ops at the job's real batch ("input node 13 is part of
a TF op split across the cluster boundary")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.frontend.converter import convert  # noqa: E402
from stitchfleet.plugin.graph import graph_identity  # noqa: E402
from stitchfleet.plugin.graph.mapping import StepOps  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from stitchfleet.plugin.shapes.rebinding import _Ops  # noqa: E402
from tests.plugin.hook_harness import events, hooked  # noqa: E402
from tests.plugin.session.test_hook_signatures import SETTLE_S  # noqa: E402

pytestmark = pytest.mark.tf
FULL = 8


@pytest.fixture
def v1_cond() -> Iterator[None]:
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()


def _job() -> Any:
    """A None-batch MLP with layer norm and GELU whose global step is read through a TF1 cond first."""
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.cond(step >= 0, lambda: tf.identity(step), lambda: step, name="step_read")
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.matmul(x, tf.compat.v1.get_variable("w", [16, 32]))))
        logits = tf.matmul(h, tf.compat.v1.get_variable("v", [32, 4]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step, name="train")
    return graph


def test_a_copy_converts_as_the_live_graph_with_its_marks(v1_cond: None, tmp_path: Path) -> None:
    graph = _job()
    steps = StepOps(graph)
    shapes = signatures.Specialisation(graph, steps, tmp_path)
    live = convert(steps, shapes=shapes.known)
    copy = signatures.shaped_copy(shapes.graph_def, shapes.signature)
    bare = convert(_Ops(copy, shapes.op_names))
    marked = convert(_Ops(copy, shapes.op_names), marks=shapes.marks)

    def nodes(conversion: Any) -> list[tuple[Any, str]]:
        return [(n.op, n.name) for n in conversion.graph.nodes]

    assert shapes.marks.control_flow  # the cond's ops
    assert nodes(bare) != nodes(live)  # what rebinding converted before
    assert nodes(marked) == nodes(live) and dict(marked.origins) == dict(live.origins)


def test_rebinding_rebuilds_every_cluster_for_the_fed_batch(v1_cond: None, tmp_path: Path) -> None:
    """The first process guesses the batch and rebuilds its clusters for the one fed (before: none could be)."""
    graph = _job()
    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal((FULL, 16)).astype(np.float32), rng.integers(0, 4, FULL)
    hook, url = hooked(tmp_path, "marks", STITCHFLEET_SIGNATURE_STEPS="1")
    book = signatures.SignatureBook(hook.settings.cache_dir, graph_identity.graph_key(_job()))
    book.path.unlink(missing_ok=True)  # the kernel cache is shared between test runs: the job must guess
    with graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
        for step in range(12):
            session.run(["loss:0", "train"], {"x:0": xs, "y:0": ys})
            if step == 6 and hook.signatures is not None:  # a cold kernel cache compiles C in the background
                assert hook.signatures.wait(SETTLE_S)
    assert hook.installed and hook.shapes is not None and hook.shapes.guessed
    assert not [e.detail for e in events(url, "compile_failure") if "not rebuilt" in e.reason]
    fed = signatures.Signature.of({"x": (FULL, 16), "y": (FULL,)})
    calls = hook.signatures.calls(fed.key) if hook.signatures is not None else {}
    assert len(calls) == len(hook.installed) and all(n > 0 for n in calls.values()), calls
