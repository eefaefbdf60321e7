"""One guard judgement in a process of its own (numpy only, no TF threads), then the CPU the process's other
threads used in the 0.3 s after it: OpenBLAS's spinning workers, if the judgement woke them.

Run as `python -m tests.plugin.guard.blas_spin guarded|bare`; prints `<ok> <clock ticks of other threads>`.
`bare` calls the judgement without its one-thread context (what the guard did before `blas_threads`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import GraphBuilder
from stitchfleet.plugin.guard import numeric


def other_threads_ticks() -> int:
    """User and system clock ticks of every thread of this process but the main one."""
    me, ticks = os.getpid(), 0
    for task in Path(f"/proc/{me}/task").iterdir():
        if int(task.name) != me:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks


def main(mode: str) -> None:
    builder = GraphBuilder()
    x = builder.parameter("x", (512, 1024))  # 512K elements: OpenBLAS's dot runs on every thread
    builder.output("scaled", builder.mul(x, builder.constant(0.5)))
    graph = builder.build()
    inputs = random_inputs(graph, 0)
    want = np.asarray(evaluate(graph, inputs)["scaled"], np.float32)
    got = np.nextafter(want, np.float32(np.inf))  # one ulp off everywhere: past the fast path, to the fp64 sums
    # evaluate's own BLAS calls above can leave the workers spinning ~100 ms: they park first, so that what is
    # counted is the judgement's (CI once counted 1 tick in the guarded run)
    time.sleep(0.3)
    before = other_threads_ticks()
    if mode == "guarded":
        finding = numeric.judge(graph, [inputs["x"]], [want], [got], 8.0)
    else:
        finding = numeric.judge.__wrapped__(graph, [inputs["x"]], [want], [got], 8.0)  # type: ignore[attr-defined]
    time.sleep(0.3)
    print(finding.ok, other_threads_ticks() - before)


if __name__ == "__main__":
    main(sys.argv[1])
