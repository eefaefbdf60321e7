"""graph_identity: a model built again (a tf.estimator's next train(), a restarted pod) has the same key;
another model does not.

Regression: Keras' initializers put fresh stateless seeds into every graph as constants, and cond_v2 names
its branch functions with a process-wide counter, so an Estimator's second train() never found the shape
signature its first had recorded: it guessed the batch again and probed while its kernels were compiling."""

from __future__ import annotations

from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import ops  # noqa: E402

from stitchfleet.plugin.graph.graph_identity import canonical, graph_key  # noqa: E402

pytestmark = pytest.mark.tf


def _model(width: int = 32) -> Any:
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.cond(step >= 0, lambda: step + 1, lambda: step)  # cond_v2: branch functions named by a counter
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(width)(x))
        tf.reduce_mean(tf.keras.layers.Dense(4)(h), name="loss")
    return graph


def test_the_same_model_built_again_has_the_same_key() -> None:
    first, second = _model(), _model()
    assert first.as_graph_def() != second.as_graph_def()  # seeds and function names differ as built
    assert graph_key(first) == graph_key(second)
    assert graph_key(_model(width=48)) != graph_key(first)


def test_function_references_follow_their_renamed_functions() -> None:
    graph_def = canonical(_model().as_graph_def())
    names = {f.signature.name for f in graph_def.library.function}
    assert names and all(name.startswith("function_") for name in names)
    used = {v.func.name for n in graph_def.node for v in n.attr.values() if v.HasField("func")}
    assert used and used <= names


def _conds(count: int) -> None:
    """Moves cond_v2's process-wide counter on by `count` branch pairs."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        for _ in range(count):
            tf.cond(step >= 0, lambda: step + 1, lambda: step)


def _branch_numbers(graph: Any) -> tuple[int, int]:
    """The counter values in the names of `_model`'s then and else branch functions (cond_true_N, cond_false_M)."""
    names = [f.signature.name.rsplit("_", 1) for f in graph.as_graph_def().library.function]
    numbers = {prefix: int(number) for prefix, number in names}
    return numbers["cond_true"], numbers["cond_false"]


def _model_across_a_power_of_ten() -> Any:
    """`_model` built with its then branch numbered one below a power of ten and its else branch at it: the two names
    a digit apart. The counter is `ops.uid()` (cond_v2's `unique_fn_name`); a build takes the same number of values up
    to its then branch every time, so the counter is moved on to just short of the next power. Another thread of the
    process taking a value meanwhile would shift the build: then the next power is tried."""
    before = ops.uid()
    lead = _branch_numbers(_model())[0] - before
    for _ in range(3):
        power = 10 ** len(str(ops.uid() + 10 * lead))
        while ops.uid() < power - lead - 1:  # ~0.25 s a million, where building 900 conds moved it ~13000 in ~8 s
            pass
        graph = _model()
        if _branch_numbers(graph) == (power - 1, power):
            return graph
    raise AssertionError(f"no build straddled a power of ten: the last named its branches {_branch_numbers(graph)}")


def test_the_key_does_not_follow_the_library_order_that_counters_give() -> None:
    """Regression (CI, session 9): after other tests had built conds in the process, the branch functions'
    counters gained a digit between two builds, the library listed the else branch before the then branch,
    and functions numbered in library order gave the same model two keys."""
    keys = {graph_key(_model())}
    _conds(9)  # other tests' conds in the process
    keys.add(graph_key(_model()))
    # Where the counter gains a digit between the two branches of one build (then ...9, else 10...0), and once past
    # it: the builds the bug gave another key. Walking there by building conds (1 + 9 + 90 + 900 of them, ~8 s)
    # reached a new digit only while the process's counter was small; the counter is moved on to it directly.
    keys.add(graph_key(_model_across_a_power_of_ten()))
    keys.add(graph_key(_model()))
    assert len(keys) == 1


def _reader(path: str, scale: float = 2.0) -> Any:
    graph = tf.Graph()
    with graph.as_default():
        records = tf.data.TFRecordDataset([path]).map(tf.strings.length)
        lengths = tf.compat.v1.data.make_one_shot_iterator(records).get_next()
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        tf.reduce_mean(x * scale + tf.cast(lengths, tf.float32), name="loss")
    return graph


def test_a_runs_file_names_are_not_part_of_its_graphs_key() -> None:
    """Regression (issue 29): the corpus's BERT run_classifier reads `train.tf_record` from a per-run scratch
    directory, so each run had its own key and never found its setup's record or the fleet's verdict."""
    first, second = _reader("/tmp/run-a/train.tf_record"), _reader("/tmp/run-b/train.tf_record")
    assert first.as_graph_def() != second.as_graph_def()
    assert graph_key(first) == graph_key(second)
    assert graph_key(_reader("/tmp/run-a/train.tf_record", scale=3.0)) != graph_key(first)  # a number still counts


def _named_by_string(counter: int) -> Any:
    """A GraphDef whose node names a library function by a string attribute, as the dispatch op names its fallback
    (`stitchfleet_fallback_<cluster>_<process-wide counter>`)."""
    graph_def = tf.compat.v1.GraphDef()
    function = graph_def.library.function.add()
    function.signature.name = f"stitchfleet_fallback_0_{counter}"
    node = graph_def.node.add(name="stitched", op="StitchfleetDispatch")
    node.attr["fallback"].s = function.signature.name.encode()
    node.attr["symbol"].s = b"cluster_0"
    return graph_def


def test_a_function_named_by_a_string_attribute_is_renamed_with_its_reference() -> None:
    first, second = canonical(_named_by_string(3)), canonical(_named_by_string(17))
    assert first == second
    assert first.node[0].attr["fallback"].s.decode() == first.library.function[0].signature.name == "function_0"
    assert first.node[0].attr["symbol"].s == b"cluster_0"  # a string naming no function is left alone
