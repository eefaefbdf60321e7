"""Two-rank training with the hook, run by test_horovod under horovodrun; rank 1's kernel is corrupted.

Argument: the temporary directory (shared SQLite database inside). Prints one line per rank:
'rank R reverted_at S fingerprint F losses N'.
"""

from __future__ import annotations

import sys
from pathlib import Path

import horovod.tensorflow as hvd

from stitchfleet.plugin.faults import Fault
from stitchfleet.plugin.hook import StitchHook
from tests.plugin.hook_harness import make_settings, train

hvd.init()
tmp = Path(sys.argv[1])
current = make_settings(tmp / f"rank{hvd.rank()}", "horovod-job", STITCHFLEET_FLUSH_SECONDS="30")
hook = StitchHook(
    current, backend="cpu", fault=Fault("constant", cluster=5, rank=1), db_url=f"sqlite:///{tmp / 'db.sqlite'}"
)
run = train(16, hook)
assert hook.controller is not None
cluster = next(c for c in hook.controller.clusters if c.index == 5)
print(f"rank {hvd.rank()} reverted_at {cluster.reverted_at} fingerprint {cluster.fingerprint} losses {len(run.losses)}")
