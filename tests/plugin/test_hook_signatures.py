"""A TF1 script with `None` batch dimensions under the hook (issue: real training graphs, unknown
sizes): its first process builds its clusters for a guessed batch and rebinds them to the batch its
first training step feeds, which the book records; its next process builds them for that batch at
once. Both install what the static twin of the script installs; a partial batch (another signature)
runs TF's own ops at every such step, so the losses are plain TF's whatever the feed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin import signatures  # noqa: E402
from stitchfleet.plugin.hook import StitchHook  # noqa: E402
from tests.plugin.hook_harness import events, hooked  # noqa: E402
from tests.plugin.test_signatures import mlp  # noqa: E402

pytestmark = pytest.mark.tf
STEPS, FULL, PARTIAL = 18, 8, 3


def train(batch: int | None, hook: StitchHook | None) -> list[float]:
    """STEPS Adam steps; every fifth feeds a partial batch when the batch dimension is unknown."""
    graph = mlp(batch)
    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal((FULL, 16)).astype(np.float32), rng.integers(0, 4, FULL).astype(np.int64)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
        losses = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
            for step in range(STEPS):
                n = PARTIAL if batch is None and step % 5 == 4 else FULL
                value, _ = session.run([loss, train_op], {"x:0": xs[:n], "y:0": ys[:n]})
                losses.append(float(value))
    return losses


urls: dict[str, str] = {}


def _hook(tmp: Path, name: str) -> StitchHook:
    hook, urls[name] = hooked(tmp / name, name)
    return hook


def test_a_none_batch_job_stitches_what_its_static_twin_does_from_its_first_process(tmp_path: Path) -> None:
    """The first process guesses the batch (signatures.GUESS), sees the real one at its first training step
    and rebinds its clusters to kernels for it (rebinding); the next process builds them for the recorded
    batch at once. Both run what the script with a static batch runs, partial batches on TF's ops."""
    first = _hook(tmp_path, "first")
    book = signatures.SignatureBook(first.settings.cache_dir, signatures.graph_key(mlp(None)))
    book.path.unlink(missing_ok=True)  # the kernel cache is shared between test runs; the book must start empty
    plain = train(None, None)
    static = _hook(tmp_path, "static")
    train(FULL, static)

    first_losses = train(None, first)
    assert book.recall() == signatures.Signature.of({"x": (FULL, 16), "y": (FULL,)})
    second = _hook(tmp_path, "second")
    second_losses = train(None, second)

    for hook, losses in ((first, first_losses), (second, second_losses)):
        # The same clusters (TF builds a few gradient ops differently for static shapes, e.g. a Mul's operand
        # order, so fingerprints may differ): per cluster its IR size, inputs and outputs.
        assert _sizes(hook) == _sizes(static) and not hook.off, hook.off
        assert all(c.kernel.calls > 0 and c.enabled for c, _ in hook.installed)  # stitched at the fed batch
        # Partial batches ran TF's ops (before: a gradient's Reshape to the signature's shape failed the step).
        assert all(c.kernel.missed() > 0 for c, _ in hook.installed)
        np.testing.assert_allclose(losses, plain, rtol=1e-4)
    said = {name: [e.reason for e in events(url, "shape_signature")] for name, url in urls.items()}
    assert said == {"first": ["guessed", "other shapes"], "static": [], "second": ["specialised", "other shapes"]}
    assert not [e for e in events(urls["first"], "compile_failure") if "rebuilt" in e.reason]


def _sizes(hook: StitchHook) -> list[tuple[int, int, int]]:
    return sorted((len(d.site.graph.nodes), len(d.site.inputs), len(d.site.outputs)) for _, d in hook.installed)
