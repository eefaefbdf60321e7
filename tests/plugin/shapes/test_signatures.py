"""Shape signatures (`plugin/shapes/signatures.py`): placeholders of unknown shape, the signature a run's feeds
give them, TF's shapes under it, the book a job's processes share, and the frontend converting a
`None`-batch graph under a signature into the clusters of its static twin."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.compiler.pipeline import Options, compile_graph  # noqa: E402
from stitchfleet.plugin.frontend.converter import convert  # noqa: E402
from stitchfleet.plugin.graph import graph_identity  # noqa: E402
from stitchfleet.plugin.graph.mapping import StepOps  # noqa: E402
from stitchfleet.plugin.shapes import signatures  # noqa: E402
from stitchfleet.plugin.shapes.signatures import Signature, SignatureBook  # noqa: E402

pytestmark = pytest.mark.tf


def mlp(batch: int | None, seed: int = 0, data: tuple[Any, Any, int] | None = None) -> Any:
    """A matmul, Keras layer norm, GELU, a hand-written normalisation, a mean loss and Adam, as TF1 scripts
    write it (the train op is "train"); `data` (features, labels, batch size): read from a `tf.data`
    iterator over them (`batch(...).repeat()`: the last batch of each pass is partial) instead of fed."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        if data is None:
            x = tf.compat.v1.placeholder(tf.float32, [batch, 16], name="x")
            y = tf.compat.v1.placeholder(tf.int64, [batch], name="y")
        else:
            dataset = tf.data.Dataset.from_tensor_slices(data[:2]).batch(data[2]).repeat()
            x, y = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        w = tf.compat.v1.get_variable("w", [16, 32])
        h = tf.nn.gelu(tf.keras.layers.LayerNormalization()(tf.matmul(x, w)))  # Keras reads shapes at run time
        mean, var = tf.nn.moments(h, [1], keepdims=True)
        h = (h - mean) * tf.math.rsqrt(var + 1e-5)
        logits = tf.matmul(h, tf.compat.v1.get_variable("v", [32, 4]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="train")
    return graph


def test_placeholders_of_unknown_shape_and_the_signature_feeds_give_them() -> None:
    graph = mlp(None)
    found = signatures.unknown_sources(graph)
    assert [op.name for op in found] == ["x", "y"]
    feeds = {"x:0": np.zeros((8, 16), np.float32), graph.get_tensor_by_name("y:0"): np.zeros(8, np.int64)}
    seen = signatures.observed(found, feeds)
    assert seen == Signature.of({"x": (8, 16), "y": (8,)}) and seen.key == "x=8x16,y=8"
    assert signatures.observed(found, {"x:0": np.zeros((8, 16), np.float32)}) is None  # y not fed
    assert signatures.observed(found, {"x:0": np.zeros((8, 15)), "y:0": np.zeros(8)}) is None  # x's 16 known
    assert signatures.unknown_sources(mlp(8)) == []


def test_tf_shapes_under_a_signature() -> None:
    graph = mlp(None)
    shapes = signatures.concrete_shapes(graph, Signature.of({"x": (8, 16), "y": (8,)}))
    assert shapes["x:0"] == (8, 16) and shapes["MatMul:0"] == (8, 32) and shapes["y:0"] == (8,)
    assert "w:0" not in shapes  # fully shaped already: TF's own shape is used


def test_the_graph_key_ignores_seeds_and_tells_graphs_apart() -> None:
    assert graph_identity.graph_key(mlp(None, seed=1)) == graph_identity.graph_key(mlp(None, seed=2))
    assert graph_identity.graph_key(mlp(None)) != graph_identity.graph_key(mlp(4))


def test_the_book_keeps_the_latest_signature_first_and_survives_a_bad_file(tmp_path: Path) -> None:
    book = SignatureBook(tmp_path, "k")
    assert book.recall() is None
    first, second = Signature.of({"x": (8, 16)}), Signature.of({"x": (4, 16)})
    assert book.record(first) and book.record(second) and book.record(first)
    assert book.recall() == first
    assert json.loads(book.path.read_text())["signatures"] == [{"x": [8, 16]}, {"x": [4, 16]}]
    for n in range(signatures.MAX_SIGNATURES + 3):
        book.record(Signature.of({"x": (n + 1, 16)}))
    assert len(json.loads(book.path.read_text())["signatures"]) == signatures.MAX_SIGNATURES
    book.path.write_text("{not json")
    assert book.recall() is None and book.record(first) and book.recall() == first


def _clusters(conversion: Any) -> list[list[str]]:
    art = compile_graph(conversion.graph, Options(baselines=("per_op",)))
    return [sorted(n.op.name for n in graph.nodes) for graph in art.cluster_graphs]


def test_a_none_batch_graph_under_its_signature_gets_the_clusters_of_its_static_twin() -> None:
    static = _clusters(convert(StepOps(mlp(8))))
    graph = mlp(None)
    bare = _clusters(convert(StepOps(graph)))
    signature = Signature.of({"x": (8, 16), "y": (8,)})
    under = _clusters(convert(StepOps(graph), shapes=signatures.concrete_shapes(graph, signature)))
    assert under == static
    assert sum(map(len, bare)) < sum(map(len, static)) // 2  # what a `None` batch costs without a signature


def test_learning_the_fed_signature_records_it_and_keeps_what_begin_built_for(tmp_path: Path) -> None:
    """The first training step's signature goes into the book; `signature` stays begin's guess, which the kernels
    per signature read as what the ops' own kernels were built for. Before, `learn` replaced it: under Horovod,
    whose kernels per signature start after that step, begin's kernels were taken for the fed batch's."""
    graph = mlp(None)
    shapes = signatures.Specialisation(graph, StepOps(graph), tmp_path)
    guess = Signature.of({"x": (signatures.GUESS, 16), "y": (signatures.GUESS,)})
    assert shapes.guessed and shapes.signature == guess
    fed = {"x:0": np.zeros((8, 16), np.float32), "y:0": np.zeros(8, np.int64)}
    step = SimpleNamespace(fetches=["train"], feed_dict=fed)  # what a session run's `original_args` holds
    assert shapes.learn(step, lambda fetches: True) == Signature.of({"x": (8, 16), "y": (8,)})
    assert shapes.signature == guess and shapes.guessed
    assert shapes.book is not None and shapes.book.recall() == Signature.of({"x": (8, 16), "y": (8,)})
    assert shapes.learn(step, lambda fetches: True) is None  # once per process


def test_an_iterators_reads_are_sources_too() -> None:
    """A `tf.data` iterator's batch (`IteratorGetNext`) has an unknown batch dimension like a placeholder's; its
    outputs are keyed by tensor name, their shapes come from the step (fetched), and under a signature TF's
    shape inference gives the graph the shapes of its static twin."""
    data = (np.zeros((20, 16), np.float32), np.zeros(20, np.int64), 8)
    graph = mlp(None, data=data)
    found = signatures.unknown_sources(graph)
    assert [op.type for op in found] == ["IteratorGetNext"]
    assert signatures.partial_shapes(found) == {"IteratorGetNext:0": (None, 16), "IteratorGetNext:1": (None,)}
    read = {"IteratorGetNext:0": (8, 16), "IteratorGetNext:1": (8,)}
    assert signatures.observed(found, {}, read) == Signature.of(read)
    assert signatures.observed(found, {}) is None  # not read yet
    assert signatures.observed(found, {}, {**read, "IteratorGetNext:0": (8, 15)}) is None  # 16 is known
    shapes = signatures.concrete_shapes(graph, Signature.of(read))
    assert shapes["MatMul:0"] == (8, 32)
    assert _clusters(convert(StepOps(graph), shapes=shapes)) == _clusters(convert(StepOps(mlp(8))))


def test_the_second_signature_tells_a_batch_from_a_length_of_the_same_size() -> None:
    """The oracle's second signature grows each unknown dimension by one plus its axis: the batch alike in every
    source (feeds stay consistent), a length guessed as large as the batch to another size. With one larger for
    all, a tokens tensor's `[batch, length]` and a `[length, batch]` one had the same shapes under both."""
    graph = tf.Graph()
    with graph.as_default():
        tokens = tf.compat.v1.placeholder(tf.int32, [None, None], name="tokens")
        tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        flipped = tf.transpose(tokens)
    sources = signatures.unknown_sources(graph)
    guess = Signature.of({"tokens": (32, 32), "labels": (32,)})
    wider = signatures.wider(guess, sources)
    assert wider.as_dict() == {"tokens": (33, 34), "labels": (33,)}
    oracle = signatures.ShapeOracle(signatures.concrete_shapes(graph, guess), signatures.concrete_shapes(graph, wider))
    assert oracle.pair(tokens) == ((32, 32), (33, 34)) and not oracle.same(tokens, flipped)


def test_a_guess_tf_rejects_is_replaced_by_one_it_accepts(tmp_path: Path) -> None:
    """Regression (issue 30, the corpus' DCGAN): the discriminator reads a concatenation of two batches
    (`[2 x batch, 2]`) against labels of one placeholder. GUESS everywhere made its labels `[32]` against `[64, 2]`,
    TF's shape inference rejected the guess ("Dimensions must be equal, but are 64 and 32") and that ValueError
    ended the whole setup. Now a multiple of GUESS per source that TF accepts is guessed, and the oracle's second
    signature keeps the relation too."""
    graph = tf.Graph()
    with graph.as_default():
        noise = tf.compat.v1.placeholder(tf.float32, [None, 8], name="noise")
        real = tf.compat.v1.placeholder(tf.float32, [None, 8], name="real")
        target = tf.compat.v1.placeholder(tf.int32, [None], name="disc_target")
        fake = tf.tanh(tf.matmul(noise, tf.compat.v1.get_variable("g", [8, 8])))
        logits = tf.matmul(tf.concat([fake, real], axis=0), tf.compat.v1.get_variable("d", [8, 2]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=logits))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    shapes = signatures.Specialisation(graph, StepOps(graph), tmp_path)
    assert shapes.guessed and shapes.signature is not None
    assert shapes.signature.as_dict() == {"noise": (32, 8), "real": (32, 8), "disc_target": (64,)}
    assert shapes.known["concat:0"] == (64, 8)
    with pytest.raises(ValueError, match="Dimensions must be equal"):
        signatures.concrete_shapes(graph, signatures.wider(shapes.signature, shapes.sources))
    second = signatures.concrete_shapes(graph, signatures.doubled(shapes.signature, shapes.sources))
    assert second["concat:0"] == (128, 8)
