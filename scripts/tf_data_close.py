"""How long TensorFlow takes to close a session whose graph holds an autotuned tf.data iterator, in plain TF.

Input: none (a small `map(AUTOTUNE) -> batch -> prefetch(AUTOTUNE)` pipeline read for a few seconds; stitchfleet is
not imported); optional `--run SECONDS --trials N`. Output: on stdout, each trial's `Session.close()` time and, per
condition (the machine as it is; every core kept busy by spinning processes), the median, the maximum and how many
closes took over `--slow` seconds. Why: the corpus BERT's runs sometimes end 35-64 s after their last step, in
`RootDataset::Iterator::~Iterator` waiting for tf.data's autotune thread (benchmarks/README.md, sessions 28 and 38).
Run from the repository root: PYTHONPATH=. python scripts/tf_data_close.py [--run 3] [--trials 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

CONDITIONS = {"as is": 0, "cores busy": os.cpu_count() or 1}


def close_seconds(run: float, spinners: int) -> float:
    """Reads the pipeline for `run` seconds in a fresh graph and session, then times `close()` with `spinners`
    CPU-bound processes beside it (started just before, killed after)."""
    graph = tf.Graph()
    with graph.as_default():
        numbers = tf.data.Dataset.range(10**12).map(lambda x: tf.cast(x, tf.float32) * 2.0, tf.data.AUTOTUNE)
        batches = numbers.batch(8).prefetch(tf.data.AUTOTUNE)
        element = tf.compat.v1.data.make_one_shot_iterator(batches).get_next()
        session = tf.compat.v1.Session()
        started = time.perf_counter()
        while time.perf_counter() - started < run:
            session.run(element)
        busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(spinners)]
        try:
            time.sleep(0.05)  # the spinners on the cores before the close starts
            closing = time.perf_counter()
            session.close()
            return time.perf_counter() - closing
        finally:
            for process in busy:
                process.kill()
                process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=float, default=3.0, help="seconds each trial reads the pipeline (default 3)")
    parser.add_argument("--trials", type=int, default=15, help="closes per condition, alternated (default 15)")
    parser.add_argument("--slow", type=float, default=0.5, help="a close over this many seconds is slow (0.5)")
    args = parser.parse_args(argv)
    if args.run <= 0 or args.trials < 1 or args.slow <= 0:
        parser.error("--run and --slow must be positive and --trials at least 1")
    tf.compat.v1.disable_v2_behavior()
    times: dict[str, list[float]] = {name: [] for name in CONDITIONS}
    for trial in range(args.trials):
        for name, spinners in CONDITIONS.items():
            times[name].append(close_seconds(args.run, spinners))
            print(f"trial {trial + 1}/{args.trials} {name}: close {times[name][-1]:.3f} s", file=sys.stderr, flush=True)
    print(f"Session.close() after {args.run:g} s of an autotuned tf.data pipeline, TF {tf.__version__}:")
    print(f"| condition | closes | median s | max s | over {args.slow:g} s |")
    print("|---|---:|---:|---:|---:|")
    for name, found in times.items():
        slow = sum(t > args.slow for t in found)
        print(f"| {name} | {len(found)} | {statistics.median(found):.3f} | {max(found):.2f} | {slow} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
