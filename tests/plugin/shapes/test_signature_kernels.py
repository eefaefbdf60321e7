"""Kernels per shape signature (`plugin/shapes/signature_kernels.py`) under the hook, on the `None`-batch MLP: the
bound on signatures with kernels, a background compile that fails or takes too long (the signature is left
to TF's ops, the job goes on), and the guard judging the kernel of the step's signature (a faulty kernel
of one signature is unbound alone; the cluster keeps its kernels for the others)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph import graph_identity  # noqa: E402
from stitchfleet.plugin.guard.numeric import Finding  # noqa: E402
from stitchfleet.plugin.native.faults import Fault  # noqa: E402
from stitchfleet.plugin.session.hook import StitchHook  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from stitchfleet.plugin.shapes.signature_kernels import BOUND, LEFT, OVER  # noqa: E402
from stitchfleet.plugin.shapes.signatures import Signature  # noqa: E402
from tests.plugin.hook_harness import events, hooked  # noqa: E402
from tests.plugin.session.test_hook_signatures import alternating, data_graph, fresh_book, train, train_data  # noqa: E402

pytestmark = pytest.mark.tf
SIXTEEN, TWENTY = "x=16x16,y=16", "x=20x16,y=20"
EIGHT = "IteratorGetNext:0=8x16,IteratorGetNext:1=8"  # the batch `data_graph`'s iterator reads
FOUR = "IteratorGetNext:0=4x16,IteratorGetNext:1=4"
EVERY_STEP = {  # every stitched step judges every cluster switched on
    "STITCHFLEET_CHECK_EVERY": "1",
    "STITCHFLEET_CHECK_CLUSTERS": "0",
    "STITCHFLEET_CHECK_BUDGET": "1",
}


def _hook(tmp: Path, name: str, fault: Fault | None = None, **extra: str) -> tuple[StitchHook, str]:
    hook, url = hooked(tmp / name, name, fault, STITCHFLEET_SIGNATURE_STEPS="2", **extra)
    fresh_book(hook)
    return hook, url


def test_past_the_bound_a_new_signature_runs_tfs_ops_and_is_counted(tmp_path: Path) -> None:
    """STITCHFLEET_SIGNATURES_MAX=1: batch 16, due first, gets kernels (begin's guess, never fed, takes no
    place); batch 20, due next, is not compiled: its steps run TF's ops, are counted and said once. An earlier
    session of the process bound both sizes to the same ops (kernels are keyed by their code): the job starts
    from its ops' own kernels all the same (before, it ran the earlier kernels, unseen by its guard and bound)."""
    earlier, _ = _hook(tmp_path, "earlier")
    train(None, earlier, alternating, steps=8)
    assert earlier.signatures is not None and earlier.signatures.bound() == [SIXTEEN, TWENTY]
    hook, url = _hook(tmp_path, "bound", STITCHFLEET_SIGNATURES_MAX="1")
    plain = train(None, None, alternating, steps=12)
    losses = train(None, hook, alternating, steps=12)
    assert hook.signatures is not None
    assert {k: v for k, v in hook.signatures.states().items() if k != "x=32x16,y=32"} == {SIXTEEN: BOUND, TWENTY: OVER}
    assert hook.signatures.bound() == [SIXTEEN] and hook.signatures.calls(TWENTY) == {}
    assert hook.signatures.over == 5  # the steps of batch 20 from the one it was due at (3, 5, 7, 9, 11)
    assert [e.reason for e in events(url, "shape_signature") if e.reason == "over the bound"] == ["over the bound"]
    assert all(c.kernel.missed() > 0 for c, _ in hook.installed)
    np.testing.assert_allclose(losses, plain, rtol=1e-4)


def test_a_compile_that_fails_leaves_that_signature_of_that_cluster_to_tf(tmp_path: Path) -> None:
    """A cluster whose compile for batch 20 fails (an injected compiler error, in the background thread) runs
    TF's ops for that batch, said as an event; its kernel for 16 and the other clusters' for both still run."""
    hook, url = _hook(tmp_path, "failing", Fault("compile", cluster=1, signature=TWENTY))
    plain = train(None, None, alternating, steps=12)
    losses = train(None, hook, alternating, steps=12)
    assert hook.signatures is not None
    assert set(hook.signatures.calls(TWENTY)) == {0, 2} and set(hook.signatures.calls(SIXTEEN)) == {0, 1, 2}
    assert all(n > 0 for key in (SIXTEEN, TWENTY) for n in hook.signatures.calls(key).values())
    failures = [e.detail for e in events(url, "compile_failure") if "rebuilt" in e.reason]
    assert len(failures) == 1 and "cluster 1" in failures[0] and "injected compile failure" in failures[0]
    assert all(c.enabled for c, _ in hook.installed)
    np.testing.assert_allclose(losses, plain, rtol=1e-4)


def test_a_compile_past_its_time_is_given_up_and_its_late_kernels_are_never_bound(tmp_path: Path) -> None:
    """STITCHFLEET_SIGNATURE_COMPILE_SECONDS=1 and a compile thread that cannot hand its result over (the test
    holds the lock it writes under): the steps go on (they never wait on that lock), the signature is left
    to TF's ops after the second, and the kernels that arrive later are dropped."""
    hook, url = _hook(tmp_path, "late", STITCHFLEET_SIGNATURE_COMPILE_SECONDS="1")
    held: list[bool] = []

    def stall(step: int, hook: StitchHook) -> None:
        assert hook.signatures is not None
        if step == 0:
            held.append(hook.signatures.lock.acquire())
        if step == 1:  # the compile of batch 16 started before this step
            assert hook.signatures.states()[SIXTEEN] == "compiling"
            time.sleep(1.5)
        if step == 3:
            hook.signatures.lock.release()
            running = hook.signatures.running
            assert running is None  # given up at step 2
        if step == 5:
            assert hook.signatures.wait(1)

    plain = train(None, None, lambda _: 16, steps=8)
    losses = train(None, hook, lambda _: 16, steps=8, after=stall)
    assert held == [True] and hook.signatures is not None
    assert hook.signatures.states()[SIXTEEN] == LEFT and hook.signatures.calls(SIXTEEN) == {}
    left = [e.detail for e in events(url, "shape_signature") if e.reason == "left to TF"]
    assert left == [f"{SIXTEEN}: its compile took longer than 1 s"]
    np.testing.assert_allclose(losses, plain, rtol=1e-4)


def test_the_guard_unbinds_a_faulty_kernel_of_one_signature_and_keeps_the_others(tmp_path: Path) -> None:
    """Cluster 2's kernel for batch 20 is wrong (a corrupted constant, compiled in the background; begin's and
    batch 16's are right). A check step of batch 20 judges that kernel, not begin's, finds the mismatch and
    unbinds it: batch 20's calls of cluster 2 run TF's ops from then on, while cluster 2 stays on and keeps
    running its kernel for 16 (no revert, on any rank). A second faulty kernel of the same cluster would
    revert it: `mismatch` then leaves it to the controller."""
    hook, url = _hook(tmp_path, "guarded", Fault("constant", cluster=2, signature=TWENTY), **EVERY_STEP)
    calls: list[int] = []

    def settle_then_count(step: int, hook: StitchHook) -> None:
        assert hook.signatures is not None
        if step == 6:
            assert hook.signatures.wait(300)
        if step >= 6:
            calls.append(hook.signatures.calls(SIXTEEN)[2])

    train(None, hook, alternating, steps=16, after=settle_then_count)
    signatures = hook.signatures
    assert signatures is not None and signatures.lost == {2}
    assert set(signatures.calls(TWENTY)) == {0, 1} and set(signatures.calls(SIXTEEN)) == {0, 1, 2}
    unbound = [e.detail for e in events(url, "shape_signature") if e.reason == "unbound by the guard"]
    assert len(unbound) == 1 and unbound[0].startswith(f"cluster 2, {TWENTY}:"), unbound
    assert all(c.enabled for c, _ in hook.installed) and not events(url, "revert")
    assert calls[-1] > calls[0]  # batch 16 still ran cluster 2's kernel after the unbinding
    assert not events(url, "guard_check")  # the controller never heard of it
    sixteen = Signature.of({"x": (16, 16), "y": (16,)})
    second = Finding(False, "out", 1.0, 10.0, "a second faulty kernel")
    assert not signatures.mismatch(2, sixteen, second, 16)  # the cluster's code is wrong: the controller reverts


def test_a_job_whose_stitching_is_over_compiles_no_more_signatures(tmp_path: Path) -> None:
    """Once the job reverted (here by the controller's own job revert, as a plugin error does) no cluster runs
    stitched again: batch 20, fed on every later step, is never compiled (it would only cost a core)."""
    hook, _ = _hook(tmp_path, "over")

    def revert_after_three(step: int, hook: StitchHook) -> None:
        assert hook.signatures is not None and hook.controller is not None
        if step == 3:
            assert hook.signatures.wait(300)
            hook.controller._revert_job(step, "plugin error", "reverted by the test")

    def sizes(step: int) -> int:
        return 16 if step < 4 else 20

    plain = train(None, None, sizes, steps=10)
    losses = train(None, hook, sizes, steps=10, after=revert_after_three)
    assert hook.signatures is not None and hook.controller is not None and hook.controller.done
    assert {k: v for k, v in hook.signatures.states().items() if k != "x=32x16,y=32"} == {SIXTEEN: BOUND}
    np.testing.assert_allclose(losses, plain, rtol=1e-4)


def test_a_new_signatures_kernel_is_judged_even_when_no_periodic_check_step_feeds_it(tmp_path: Path) -> None:
    """Periodic checks every 2 steps meet only batch 16 (even steps) and the stitched phase's first checks are
    off: batch 20's kernels would never be judged. A kernel bound while the job runs is judged on the first
    step that runs it (`SignatureKernels.fresh`): cluster 2's faulty kernel for 20 is caught and unbound.
    Before, it ran unjudged for the rest of the job."""
    checks = {"STITCHFLEET_CHECK_EVERY": "2", "STITCHFLEET_CHECK_FIRST": "0", "STITCHFLEET_CHECK_CLUSTERS": "0"}
    fault = Fault("constant", cluster=2, signature=TWENTY)
    hook, url = _hook(tmp_path, "fresh", fault, STITCHFLEET_CHECK_BUDGET="1", **checks)
    train(None, hook, alternating, steps=16)
    assert hook.signatures is not None and hook.signatures.lost == {2}
    unbound = [e.detail for e in events(url, "shape_signature") if e.reason == "unbound by the guard"]
    assert len(unbound) == 1 and unbound[0].startswith(f"cluster 2, {TWENTY}:"), unbound
    assert not hook.signatures.unjudged  # every kernel bound here was judged at least once
    assert all(c.enabled for c, _ in hook.installed)


def test_a_tf_data_signatures_kernel_is_judged_on_the_first_step_that_reads_it(tmp_path: Path) -> None:
    """The batch comes from a `tf.data` iterator (8, 8, 4, 8, 8, 4...), whose shapes a step shows only once it ran;
    no periodic check is made (every 1000 steps, first checks off). Cluster 2's kernel for batch 8 is faulty: a
    step after it was bound judges every cluster with a kernel not judged yet, against the kernel its signature
    ran, so the first batch-8 step catches and unbinds it. Before, such a kernel ran unjudged all job long."""
    checks = {"STITCHFLEET_CHECK_EVERY": "1000", "STITCHFLEET_CHECK_FIRST": "0", "STITCHFLEET_SIGNATURE_WINDOW": "6"}
    fault = Fault("constant", cluster=2, signature=EIGHT)
    hook, url = _hook(tmp_path, "data-fresh", fault, **checks)
    book = signatures.SignatureBook(hook.settings.cache_dir, graph_identity.graph_key(data_graph()))
    book.path.unlink(missing_ok=True)
    train_data(hook)
    assert hook.signatures is not None and hook.signatures.lost == {2}
    unbound = [(e.step, e.detail) for e in events(url, "shape_signature") if e.reason == "unbound by the guard"]
    assert len(unbound) == 1 and unbound[0][1].startswith(f"cluster 2, {EIGHT}:"), unbound
    assert unbound[0][0] % 3 != 2  # a batch-8 step judged it (every third step reads the partial batch of 4)
    assert not hook.signatures.unjudged and all(c.enabled for c, _ in hook.installed)


def shrinking_data() -> Any:
    """The MLP of `test_signatures.mlp` reading two batches of 8 rows from a `tf.data` iterator, then 4 rows for
    good."""
    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal((16, 16)).astype(np.float32), rng.integers(0, 4, 16)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        rows = tf.data.Dataset.from_tensor_slices((xs, ys))
        dataset = rows.batch(8).take(2).concatenate(rows.batch(4).repeat())
        x, y = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.matmul(x, tf.compat.v1.get_variable("w", [16, 32]))))
        logits = tf.matmul(h, tf.compat.v1.get_variable("v", [32, 4]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="train")
    return graph


def test_a_tf_data_signature_the_job_stops_reading_is_left_to_the_periodic_checks(tmp_path: Path) -> None:
    """Batch 8's kernels are bound once its two steps ran, and the job reads batches of 4 from then on: a tf.data
    step judges the clusters of kernels not judged yet for at most STITCHFLEET_SIGNATURE_WINDOW steps in a row
    that meet none of them, then leaves them to the periodic checks. Without the bound every later step would
    judge them (a check's fp64 reference on every step) all job long."""
    fault = Fault("constant", cluster=2, signature=FOUR)  # batch 4's kernel, bound after batch 8's were let go
    settings = {"STITCHFLEET_SIGNATURE_WINDOW": "4", "STITCHFLEET_CHECK_EVERY": "1000", "STITCHFLEET_CHECK_FIRST": "0"}
    hook, url = _hook(tmp_path, "data-stops", fault, **settings)
    graph = shrinking_data()
    signatures.SignatureBook(hook.settings.cache_dir, graph_identity.graph_key(graph)).path.unlink(missing_ok=True)
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train")
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for step in range(16):
                session.run([loss, train_op])
                if step in {1, 8} and hook.signatures is not None:
                    # batch 8's kernels: bound from step 2, never read again, let go after step 6; batch 4's: bound
                    # by step 9 at the latest, and judged on the step that binds them (a new kernel's own tries)
                    assert hook.signatures.wait(300)
    assert hook.signatures is not None and hook.controller is not None
    assert hook.signatures.states()[EIGHT] == BOUND and hook.signatures.states()[FOUR] == BOUND
    assert not hook.signatures.unjudged and all(c.enabled for c, _ in hook.installed)
    assert hook.signatures.lost == {2}  # batch 4's faulty kernel was judged, not let go with batch 8's
    unbound = [e.detail for e in events(url, "shape_signature") if e.reason == "unbound by the guard"]
    assert len(unbound) == 1 and unbound[0].startswith(f"cluster 2, {FOUR}:"), unbound
