"""Two-rank training with the hook, run by test_horovod under horovodrun.

Arguments: the temporary directory (shared SQLite database inside) and the scenario:
`fault` (rank 1's kernel of cluster 5 is corrupted, probing off; prints 'rank R reverted_at
S fingerprint F losses N'), `probe` (probing on, no fault; prints 'rank R decisions JSON',
each installed cluster's index, kept flag and reason, and 'rank R group JSON', the group probe's
verdict and figures), or one of the ranks-that-differ scenarios, each printing 'rank R state JSON'
(active, the stitched cluster indices, their reverted_at steps, training steps counted, runs made):
`sideruns` (rank 0 alone makes an eval-like run every 3 steps), `compile` (cluster 5 fails to
compile on rank 1 only), `setup` (rank 1's whole setup fails), `slower` (rank 1 alone reads a
fleet memory, memory.sqlite in the directory, that holds a slower verdict; rank 0 reads none).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.native.faults import Fault
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import _feeds, make_settings, train

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


def train_with_side_runs(steps: int, hook: StitchHook, side_every: int) -> int:
    """The harness's training loop; with `side_every`, rank 0 alone also runs the loss every few steps."""
    graph = models.build("bert_encoder", "small", seed=1)
    runs = 0
    with graph.as_default():
        loss, train_op = graph.get_tensor_by_name("loss:0"), graph.get_operation_by_name("train_op")
        feeds = _feeds(graph)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            for step in range(steps):
                session.run([loss, train_op], feeds)
                runs += 1
                if side_every and hvd.rank() == 0 and step % side_every == 0:
                    session.run(loss, feeds)  # logging on rank 0 only: no variable update
                    runs += 1
    return runs


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
elif scenario in ("sideruns", "compile", "setup", "slower"):
    current = make_settings(tmp / f"rank{hvd.rank()}", f"horovod-{scenario}", STITCHFLEET_FLUSH_SECONDS="30")
    faults = {"compile": Fault("compile", cluster=5, rank=1), "setup": Fault("setup", cluster=0, rank=1)}
    if scenario == "slower" and hvd.rank() == 1:
        db_url = f"sqlite:///{tmp / 'memory.sqlite'}"  # a verdict that reached this rank's read only
    hook = StitchHook(current, backend="cpu", fault=faults.get(scenario), db_url=db_url)
    runs = train_with_side_runs(DIFFER_STEPS, hook, 3 if scenario == "sideruns" else 0)
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
    print(f"rank {hvd.rank()} state {json.dumps(state)}")
else:
    current = make_settings(tmp / f"rank{hvd.rank()}", "horovod-job", STITCHFLEET_FLUSH_SECONDS="30")
    hook = StitchHook(current, backend="cpu", fault=Fault("constant", cluster=5, rank=1), db_url=db_url)
    run = train(16, hook)
    assert hook.controller is not None
    cluster = next(c for c in hook.controller.clusters if c.index == 5)
    reverted = f"reverted_at {cluster.reverted_at} fingerprint {cluster.fingerprint}"
    print(f"rank {hvd.rank()} {reverted} losses {len(run.losses)}")
