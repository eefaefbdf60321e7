"""Two-rank training with the hook, run by test_horovod under horovodrun.

Arguments: the temporary directory (shared SQLite database inside) and the scenario:
`fault` (rank 1's kernel of cluster 5 is corrupted, probing off; prints 'rank R reverted_at
S fingerprint F losses N'), `probe` (probing on, no fault; prints 'rank R decisions JSON',
each installed cluster's index, kept flag and reason, and 'rank R group JSON', the group probe's
verdict and figures), or one of the ranks-that-differ scenarios, each printing 'rank R state JSON'
(active, the stitched cluster indices, their reverted_at steps, training steps counted, runs made):
`sideruns` (rank 0 alone makes an eval-like run every 3 steps), `compile` (cluster 5 fails to
compile on rank 1 only), `setup` (rank 1's whole setup fails), `slower` (rank 1 alone reads a
fleet memory, memory.sqlite in the directory, that holds a slower verdict; rank 0 reads none), `skip` (rank 1's
node, a kernel cache of its own, holds a record of a last run that lost on this graph: rank 1 alone skips its setup;
its state adds why it skipped, the backend's runs, the last loss and the trained variables).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from stitchfleet import settings as settings_module
from stitchfleet.demo import models
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.session.hook import StitchHook
from stitchfleet.plugin.setup import setup_record
from tests.plugin.hook_harness import _feeds, make_settings, train
from tests.plugin.setup.test_setup_record import _kernels

DIFFER_STEPS = 24


def _iterations(url: str, rank: int) -> int:
    """The training steps this rank's telemetry booked (its step windows' iterations)."""
    import sqlalchemy as sa

    from stitchfleet.telemetry import models as tables

    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            query = sa.select(sa.func.sum(tables.StepWindow.iterations)).where(tables.StepWindow.rank == rank)
            return int(connection.execute(query).scalar() or 0)
    finally:
        engine.dispose()


def train_with_side_runs(steps: int, hook: StitchHook, side_every: int, trained: dict[str, Any]) -> int:
    """The harness's training loop; with `side_every`, rank 0 alone also runs the loss every few steps. `trained`
    gets the last step's loss and a digest of every trainable variable's bytes at the end."""
    graph = models.build("bert_encoder", "small", seed=1)
    runs = 0
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        variables = tf.compat.v1.trainable_variables()
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for step in range(steps):
                trained["loss"], _ = session.run([loss, train_op], feeds)
                runs += 1
                if side_every and hvd.rank() == 0 and step % side_every == 0:
                    session.run(loss, feeds)  # logging on rank 0 only: no variable update
                    runs += 1
            # on the raw session: no hook sees this run, so it shifts no rank's step count, pairing or agreement
            values = session._tf_sess().run(variables)
            trained["variables"] = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in values))
    return runs


def lost_here(current: settings_module.Settings, backend: str) -> str:
    """Leaves in `current`'s kernel cache what a run of this job's graph on this node would have left when it lost
    5% against plain TF (a setup record and its measured figures), as an earlier job of the same graph on that
    node does; returns the record's key. The key is the graph's as the hook's `begin` weighs its setup: the user's
    graph plus the Horovod collectives it builds first (`StitchHook._begin`), so they are built here alike."""
    from stitchfleet.plugin.control.controller import EXTRA
    from stitchfleet.plugin.horovod.decision_sums import Consensus
    from stitchfleet.plugin.horovod.setup_agreement import SLOTS, Agreement
    from stitchfleet.plugin.session.exported_graph import setup_additions

    graph = models.build("bert_encoder", "small", seed=1)  # a graph of its own: the job's is built by its loop
    with setup_additions(graph):
        Consensus(current).build(graph, SLOTS, EXTRA)
        Agreement(hvd, graph)
        key = setup_record.record_key(graph, backend, current)
    # one kernel file the record names: the record's kernels say how warm the cache is, not whether the run lost
    kernels = _kernels(Path(current.cache_dir), ["lost.so"])
    assert setup_record.write(current.cache_dir, key, backend, kernels), "no setup record written"
    # a steady loss with a plain step: the next run's estimate has its step time and its gain from this record alone
    lost = setup_record.Measured(gain=-0.05, steps=200, per_run=1.0, plain_step=0.004)
    assert setup_record.remember(current.cache_dir, key, backend, lost), "no measured figures written"
    return key


PROBE_STEPS = 2
# warmup 2 + baseline 3 + (the group + 12 clusters) x 2 x 2 probe steps = 57, then room for reruns: each runs a
# pair again (4 steps) and replays its decision step; the group may extend twice on noise alone and a loaded CI
# machine drew one rerun more than 62 steps had room for (cluster 11 left undecided). Room for five.
PROBE_RUN = 57 + 5 * 5 + 5

hvd.init()
# as a user's job turns on its logs: every rank writes to its own stderr, which horovodrun prefixes with the rank
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
tmp, scenario = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "fault"
db_url = f"sqlite:///{tmp / 'db.sqlite'}"
if scenario == "probe":
    current = make_settings(
        tmp / f"rank{hvd.rank()}",
        "horovod-probe",
        STITCHFLEET_FLUSH_SECONDS="30",
        STITCHFLEET_PROBE_STEPS="2",
        STITCHFLEET_PROBE_ROUNDS="1",
    )
    hook = StitchHook(current, backend="cpu", db_url=db_url)
    train(PROBE_RUN, hook)
    assert hook.controller is not None
    decisions = [[c.index, c.kept, c.reason] for c in hook.controller.clusters]
    print(f"rank {hvd.rank()} decisions {json.dumps(decisions)}")
    print(f"rank {hvd.rank()} group {json.dumps([hook.controller.group_proven, hook.controller.group_probe])}")
elif scenario in ("sideruns", "compile", "setup", "slower", "skip"):
    rank_dir = tmp / f"rank{hvd.rank()}"
    own: dict[str, str] = {}
    if scenario == "skip" and hvd.rank() == 1:
        own["STITCHFLEET_CACHE_DIR"] = str(rank_dir / "cache")  # another node's kernel cache: its own records
    current = make_settings(rank_dir, f"horovod-{scenario}", STITCHFLEET_FLUSH_SECONDS="30", **own)
    if own:
        lost_here(current, "cpu")
    faults = {"compile": Fault("compile", cluster=5, rank=1), "setup": Fault("setup", cluster=0, rank=1)}
    if scenario == "slower" and hvd.rank() == 1:
        db_url = f"sqlite:///{tmp / 'memory.sqlite'}"  # a verdict that reached this rank's read only
    hook = StitchHook(current, backend="cpu", fault=faults.get(scenario), db_url=db_url)
    trained: dict[str, Any] = {}
    runs = train_with_side_runs(DIFFER_STEPS, hook, 3 if scenario == "sideruns" else 0, trained)
    clusters = hook.controller.clusters if hook.controller is not None else []
    state = {
        "active": hook.active,
        "stitched": [c.index for c in clusters],
        "reverted": [c.reverted_at for c in clusters],
        "steps": hook.step,
        "runs": runs,
        "off5": hook.off.get(5, ""),
        "iterations": _iterations(db_url, hvd.rank()),
    }
    if scenario == "skip":
        state["skipped"] = hook.length.skipped
        state["set_up"] = hook.setup is not None
        state["backend_calls"] = sum(hook.backend_calls.values())
        state["loss"] = float(trained["loss"])
        state["variables"] = trained["variables"].hexdigest()
    print(f"rank {hvd.rank()} state {json.dumps(state)}")
else:
    current = make_settings(tmp / f"rank{hvd.rank()}", "horovod-job", STITCHFLEET_FLUSH_SECONDS="30")
    hook = StitchHook(current, backend="cpu", fault=Fault("constant", cluster=5, rank=1), db_url=db_url)
    run = train(16, hook)
    assert hook.controller is not None
    cluster = next(c for c in hook.controller.clusters if c.index == 5)
    reverted = f"reverted_at {cluster.reverted_at} fingerprint {cluster.fingerprint}"
    print(f"rank {hvd.rank()} {reverted} losses {len(run.losses)}")
