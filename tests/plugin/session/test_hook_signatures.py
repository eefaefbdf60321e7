"""A TF1 script with `None` batch dimensions under the hook (issue 18, "Unknown dimensions"): its first
process builds its clusters for a guessed batch and, once its training steps fed a batch size on a few
steps, compiles them for it in the background and binds them (`signature_kernels`); the book records it,
so its next process builds them for that batch at once. Both install what the static twin of the script
installs. A job alternating two batch sizes gets kernels for both; an occasional partial batch is never
compiled and runs TF's own ops, so the losses are plain TF's whatever the feed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph import graph_identity  # noqa: E402
from stitchfleet.plugin.session.hook import StitchHook  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from stitchfleet.plugin.shapes.signature_kernels import BOUND  # noqa: E402
from tests.plugin.hook_harness import events, hooked  # noqa: E402
from tests.plugin.shapes.test_signatures import mlp  # noqa: E402

pytestmark = pytest.mark.tf
STEPS, FULL, PARTIAL = 18, 8, 3
SETTLE_S = 300  # the longest a test waits for background compiles (a cold kernel cache compiles C)


def partial_every_fifth(step: int) -> int:
    return PARTIAL if step % 5 == 4 else FULL


def settle_after_six(step: int, hook: StitchHook) -> None:
    """After step 6 the hook's background compiles are waited for: the later steps show what they bound."""
    if step == 6 and hook.signatures is not None:
        assert hook.signatures.wait(SETTLE_S)


def train(
    batch: int | None,
    hook: StitchHook | None,
    sizes: Callable[[int], int] = partial_every_fifth,
    steps: int = STEPS,
    after: Callable[[int, StitchHook], None] = settle_after_six,
) -> list[float]:
    """`steps` Adam steps, step k feeding `sizes(k)` rows when the batch dimension is unknown (else `batch`);
    `after(k, hook)` follows step k (with a hook)."""
    graph = mlp(batch)
    rng = np.random.default_rng(1)
    rows = 32
    xs, ys = rng.standard_normal((rows, 16)).astype(np.float32), rng.integers(0, 4, rows).astype(np.int64)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
        losses = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
            for step in range(steps):
                n = sizes(step) if batch is None else batch
                value, _ = session.run([loss, train_op], {"x:0": xs[:n], "y:0": ys[:n]})
                losses.append(float(value))
                if hook is not None:
                    after(step, hook)
    return losses


def fresh_book(hook: StitchHook) -> signatures.SignatureBook:
    """The script's book, emptied: the kernel cache is shared between test runs, the test starts from a guess."""
    book = signatures.SignatureBook(hook.settings.cache_dir, graph_identity.graph_key(mlp(None)))
    book.path.unlink(missing_ok=True)
    return book


urls: dict[str, str] = {}


def _hook(tmp: Path, name: str, **extra: str) -> StitchHook:
    hook, urls[name] = hooked(tmp / name, name, **extra)
    return hook


def test_a_none_batch_job_stitches_what_its_static_twin_does_from_its_first_process(tmp_path: Path) -> None:
    """The first process guesses the batch (signatures.GUESS), compiles its clusters for the batch its training
    steps feed once seen on 3 steps within 8, in the background, and binds them; the partial batch (every fifth
    step: never 3 within 8) is not compiled. The next process builds for the recorded batch at once. Both run
    what the script with a static batch runs, partial batches on TF's ops."""
    window = {"STITCHFLEET_SIGNATURE_STEPS": "3", "STITCHFLEET_SIGNATURE_WINDOW": "8"}
    first = _hook(tmp_path, "first", **window)
    book = fresh_book(first)
    plain = train(None, None)
    static = _hook(tmp_path, "static")
    train(FULL, static)

    first_losses = train(None, first)
    assert book.recall() == signatures.Signature.of({"x": (FULL, 16), "y": (FULL,)})
    second = _hook(tmp_path, "second", **window)
    second_losses = train(None, second)

    full, partial = (f"x={n}x16,y={n}" for n in (FULL, PARTIAL))
    guess = f"x={signatures.GUESS}x16,y={signatures.GUESS}"
    assert first.signatures is not None and second.signatures is not None
    assert first.signatures.states() == {guess: BOUND, full: BOUND, partial: "seen"}
    assert second.signatures.states() == {full: BOUND, partial: "seen"}  # begin's kernels: nothing to compile
    for hook, losses in ((first, first_losses), (second, second_losses)):
        # The same clusters (TF builds a few gradient ops differently for static shapes, e.g. a Mul's operand
        # order, so fingerprints may differ): per cluster its IR size, inputs and outputs.
        assert _sizes(hook) == _sizes(static) and not hook.off, hook.off
        assert all(c.kernel.calls > 0 and c.enabled for c, _ in hook.installed)  # stitched at the fed batch
        assert hook.signatures is not None and all(n > 0 for n in hook.signatures.calls(full).values())
        # Partial batches ran TF's ops (before: a gradient's Reshape to the signature's shape failed the step).
        assert all(c.kernel.missed() > 0 for c, _ in hook.installed)
        np.testing.assert_allclose(losses, plain, rtol=1e-4)
    said = {name: [e.reason for e in events(url, "shape_signature")] for name, url in urls.items()}
    assert said == {
        "first": ["guessed", "compiled", "other shapes"],
        "static": [],
        "second": ["specialised", "other shapes"],
    }
    assert not [e for e in events(urls["first"], "compile_failure") if "rebuilt" in e.reason]


def alternating(step: int) -> int:
    # 16 and 20: at 12 and 24 rows the translation check refuses the layer norm's cluster (1.7e-05 from TF's
    # ops where it allows 1.6e-05), which leaves that signature of that cluster to TF's ops, as it should
    return 16 if step % 2 == 0 else 20


def test_a_job_alternating_two_batch_sizes_stitches_both(tmp_path: Path) -> None:
    """Batches of 16 and 20 in turn, each seen on 2 steps: both are compiled in the background and bound beside
    each other on the same dispatch ops; every cluster runs natively for both, counted per signature, and the
    losses are plain TF's. Before, an op held one kernel: the second batch size ran TF's ops all job long."""
    hook = _hook(tmp_path, "alternating", STITCHFLEET_SIGNATURE_STEPS="2")
    fresh_book(hook)
    plain = train(None, None, alternating)
    losses = train(None, hook, alternating)
    assert hook.signatures is not None
    sixteen, twenty = "x=16x16,y=16", "x=20x16,y=20"
    assert hook.signatures.bound() == [sixteen, twenty]
    for key in (sixteen, twenty):
        calls = hook.signatures.calls(key)
        assert len(calls) == len(hook.installed) and all(n > 0 for n in calls.values()), (key, calls)
    assert hook.signatures.over == 0 and all(c.enabled for c, _ in hook.installed)
    np.testing.assert_allclose(losses, plain, rtol=1e-4)


def _sizes(hook: StitchHook) -> list[tuple[int, int, int]]:
    return sorted((len(d.site.graph.nodes), len(d.site.inputs), len(d.site.outputs)) for _, d in hook.installed)


def data_graph() -> Any:
    """The MLP reading batches of 8 from a `tf.data` iterator over 20 rows (8, 8, 4, 8, 8, 4...: the last batch
    of each pass is partial)."""
    rng = np.random.default_rng(1)
    return mlp(None, data=(rng.standard_normal((20, 16)).astype(np.float32), rng.integers(0, 4, 20), FULL))


def train_data(hook: StitchHook | None, steps: int = STEPS) -> list[float]:
    """`steps` Adam steps of `data_graph`, nothing fed; after step 6 the hook's compiles are waited for."""
    graph = data_graph()
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
        losses = []
        with tf.compat.v1.train.MonitoredSession(hooks=[hook] if hook else []) as session:
            for step in range(steps):
                value, _ = session.run([loss, train_op])
                losses.append(float(value))
                if hook is not None:
                    settle_after_six(step, hook)
    return losses


def test_a_tf_data_job_gets_kernels_for_the_batches_its_iterator_reads(tmp_path: Path) -> None:
    """The batch dimension comes from a `tf.data` iterator, not a placeholder: nothing is fed, so each training
    step fetches the shapes its iterator read (`signatures.Specialisation.fetches`). The first process
    guesses, compiles for the batch of 8 its steps read (3 of 6 steps) and binds it; the partial batch of 4
    (one step in 3) is never compiled. The book keeps the batch for the next process, which builds for it
    at once. Both install what the placeholder script with a static batch installs; the losses are plain
    TF's. Before, such a graph got the few small clusters a `None` batch leaves."""
    window = {"STITCHFLEET_SIGNATURE_STEPS": "3", "STITCHFLEET_SIGNATURE_WINDOW": "6"}
    first = _hook(tmp_path, "data-first", **window)
    plain = train_data(None)
    book = signatures.SignatureBook(first.settings.cache_dir, graph_identity.graph_key(data_graph()))
    book.path.unlink(missing_ok=True)
    static = _hook(tmp_path, "data-static")
    train(FULL, static)
    first_losses = train_data(first)
    full = signatures.Signature.of({"IteratorGetNext:0": (FULL, 16), "IteratorGetNext:1": (FULL,)})
    assert book.recall() == full
    second = _hook(tmp_path, "data-second", **window)
    second_losses = train_data(second)

    partial = "IteratorGetNext:0=4x16,IteratorGetNext:1=4"
    guess = f"IteratorGetNext:0={signatures.GUESS}x16,IteratorGetNext:1={signatures.GUESS}"
    assert first.signatures is not None and second.signatures is not None
    assert first.signatures.states() == {guess: BOUND, full.key: BOUND, partial: "seen"}
    assert second.signatures.states() == {full.key: BOUND, partial: "seen"}
    for hook, losses in ((first, first_losses), (second, second_losses)):
        assert _sizes(hook) == _sizes(static) and not hook.off, hook.off
        assert hook.signatures is not None and all(n > 0 for n in hook.signatures.calls(full.key).values())
        assert all(c.kernel.missed() > 0 and c.enabled for c, _ in hook.installed)  # the partial batches
        np.testing.assert_allclose(losses, plain, rtol=1e-4)
