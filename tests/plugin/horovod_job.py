"""Two-rank training with the hook, run by test_horovod under horovodrun.

Arguments: the temporary directory (shared SQLite database inside) and the scenario:
`fault` (rank 1's kernel of cluster 5 is corrupted, probing off; prints 'rank R reverted_at
S fingerprint F losses N') or `probe` (probing on, no fault; prints 'rank R decisions JSON',
each installed cluster's index, kept flag and reason, and 'rank R group JSON', the group probe's
verdict and figures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import horovod.tensorflow as hvd

from stitchfleet.plugin.faults import Fault
from stitchfleet.plugin.hook import StitchHook
from tests.plugin.hook_harness import make_settings, train

PROBE_STEPS = 2
PROBE_RUN = 62  # warmup 2 + baseline 3 + (the group + 12 clusters) x 2 x 2 probe steps, then stitched steps

hvd.init()
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
else:
    current = make_settings(tmp / f"rank{hvd.rank()}", "horovod-job", STITCHFLEET_FLUSH_SECONDS="30")
    hook = StitchHook(current, backend="cpu", fault=Fault("constant", cluster=5, rank=1), db_url=db_url)
    run = train(16, hook)
    assert hook.controller is not None
    cluster = next(c for c in hook.controller.clusters if c.index == 5)
    reverted = f"reverted_at {cluster.reverted_at} fingerprint {cluster.fingerprint}"
    print(f"rank {hvd.rank()} {reverted} losses {len(run.losses)}")
