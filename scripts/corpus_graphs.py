"""Training graphs of corpus programs built in this process, for the step benchmarks (figures, not tests).

Input: a corpus program's file name ($STITCHFLEET_CORPUS_DIR, tests/corpus/README.md) that this module knows how to
build. Output: (graph, loss, train op, feeds) as `bench_step._build` gives them: the program's own model and optimizer
code, called as its training loop calls them, with its input pipeline replaced by placeholders fed seeded batches of
the shapes the program trains on (a profile times the model's step, not its tf.data reading).
"""

from __future__ import annotations

import functools
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BERT = "google_bert_run_classifier.py"
# What the corpus copy trains: tests/corpus/README.md (batch 8, sequences of 128, BERT's flags' defaults).
BERT_BATCH, BERT_SEQUENCE, BERT_STEPS, BERT_VOCABULARY = 8, 128, 2000, 66
BERT_CONFIG: dict[str, str | int | float] = {
    "vocab_size": BERT_VOCABULARY,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}


@functools.cache
def _program(name: str) -> dict[str, Any]:
    """The program's module globals, loaded once: its absl flags are defined at import and cannot be twice."""
    directory = os.environ.get("STITCHFLEET_CORPUS_DIR")
    if not directory:
        raise FileNotFoundError("STITCHFLEET_CORPUS_DIR is not set: the corpus programs live outside the checkout")
    return runpy.run_path(str(Path(directory) / name), run_name="corpus_program")


def bert() -> tuple[Any, Any, Any, Callable[[], dict[Any, Any]]]:
    """BERT run_classifier's training graph: `create_model` and `create_optimizer` (AdamWeightDecay, clipping)."""
    import tensorflow as tf

    program = _program(BERT)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)  # the program's RunConfig(tf_random_seed=0)
        shape = [BERT_BATCH, BERT_SEQUENCE]
        ids, mask, segments = (tf.compat.v1.placeholder(tf.int32, shape, name=n) for n in ("ids", "mask", "segments"))
        labels = tf.compat.v1.placeholder(tf.int32, [BERT_BATCH], name="labels")
        config = program["BertConfig"].from_dict(BERT_CONFIG)
        loss = program["create_model"](config, True, ids, mask, segments, labels, 2, False)[0]
        train_op = program["create_optimizer"](loss, 5e-5, BERT_STEPS, BERT_STEPS // 10, False)
    rng = np.random.default_rng(0)
    lengths = rng.integers(6, 24, BERT_BATCH)  # [CLS] + 4-20 words + " ." + [SEP], as the program's data
    positions = np.arange(BERT_SEQUENCE)[None, :]
    filled = (positions < lengths[:, None]).astype(np.int32)
    data = {
        ids: (rng.integers(5, BERT_VOCABULARY, shape) * filled).astype(np.int32),
        mask: filled,
        segments: np.zeros(shape, np.int32),
        labels: rng.integers(0, 2, BERT_BATCH).astype(np.int32),
    }
    return graph, loss, train_op, lambda: data


BUILDERS: dict[str, Callable[[], tuple[Any, Any, Any, Callable[[], dict[Any, Any]]]]] = {BERT: bert}
