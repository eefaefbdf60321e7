"""Prints the corpus table of benchmarks/README.md: each program of the corpus, plain and shimmed.

Usage: STITCHFLEET_CORPUS_DIR=DIR PYTHONPATH=. python scripts/corpus_table.py [STEPS] (default 100); DIR holds
the adapted programs (tests/corpus/README.md: they are not committed). Figures: finished (both runs),
per-step losses vs plain (largest relative difference), clusters installed / refused / reverted (the
shimmed run's log and ledger), booked iterations vs steps. Nothing is asserted: tests/corpus does that.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.corpus import corpus_runs

STYLES = {
    "google_bert_run_classifier.py": "TPUEstimator on CPU, tf.data TFRecords, AdamWeightDecay, clipping, dropout",
    "horovod_tensorflow_mnist.py": "MonitoredTrainingSession + hooks, tf.layers, dropout, Adam, Horovod",
    "horovod_tensorflow_word2vec.py": "plain tf.Session loop, NCE loss, variable batch, Horovod",
    "horovod_tensorflow_mnist_estimator.py": "tf.estimator.Estimator, numpy_input_fn queues, Momentum, evaluate after",
    "models_cifar10_train.py": "MonitoredTrainingSession, reader queues + random distortions, LRN, SGD + EMA",
    "models_ptb_word_lm.py": "tf.train.Supervisor, static 2-layer LSTM, gradient clipping, meta-graph re-import",
    "tfexamples_dcgan.py": "plain tf.Session loop, DCGAN: two Adam optimizers in one run, conv2d_transpose",
}


def main() -> None:
    if corpus_runs.PROGRAMS is None:
        sys.exit(f"corpus_table: set {corpus_runs.CORPUS_DIR} to the directory holding the corpus programs")
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(
        "| program | style | finished (plain/shim) | losses vs plain | clusters installed/refused/reverted "
        "| iterations vs steps |"
    )
    print("|---|---|---|---|---|---|")
    for program in sorted(STYLES):
        with tempfile.TemporaryDirectory() as scratch:
            tmp = Path(scratch)
            plain = corpus_runs.run(program, steps, tmp / "plain", enabled=False)
            shim = corpus_runs.run(program, steps, tmp / "shim", enabled=True)
            found = corpus_runs.telemetry(tmp / "shim", shim)
        same = len(plain.losses) == len(shim.losses)
        worst = corpus_runs.worst_difference(plain.losses, shim.losses) if same else float("nan")
        losses = "identical" if same and worst == 0.0 else f"max rel. diff {worst:.2g}"
        clusters = f"{found.installed}/{len(found.refused)}/{len(found.reverted)}"
        print(
            f"| {program} | {STYLES[program]} | {plain.finished}/{shim.finished} | {losses} | {clusters} "
            f"| {found.iterations} vs {len(shim.losses)} |"
        )
        for reason in found.refused:
            print(f"|  | refused: {reason[:150]} | | | | |")
        for reason in found.reverted:
            print(f"|  | reverted: {reason[:150]} | | | | |")
        for reason in found.not_attached:
            print(f"|  | not attached: {reason[:150]} | | | | |")


if __name__ == "__main__":
    main()
