"""training_steps: which runs are training steps, and which clusters lie on the training path."""

from __future__ import annotations

from typing import Any

import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.graph.training_steps import TrainingSteps, fetched_ops, training_path  # noqa: E402

pytestmark = pytest.mark.tf


def _graph() -> tuple[Any, dict[str, Any]]:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 8])
        hidden = tf.tanh(tf.matmul(x, w), name="hidden")  # stands for a stitched cluster's result
        loss = tf.reduce_mean(tf.square(hidden), name="loss")
        metric = tf.reduce_max(tf.abs(hidden), name="metric")  # feeds no update: off the training path
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step, name="train_op")
    return graph, {"x": x, "hidden": hidden, "loss": loss, "metric": metric, "step": step, "train": train_op}


def test_the_training_run_is_recognised_in_every_fetch_form() -> None:
    graph, t = _graph()
    steps = TrainingSteps(graph)
    steps.require([[t["hidden"].op]])
    assert steps.is_training([t["loss"], t["train"]])
    assert steps.is_training({"out": (t["train"],), "loss": t["loss"]})
    assert steps.is_training("train_op") and steps.is_training(["loss:0", "train_op"])
    assert "loss" in steps.reached and "hidden" in steps.reached


def test_side_runs_are_not_training_steps() -> None:
    graph, t = _graph()
    steps = TrainingSteps(graph)
    steps.require([[t["hidden"].op]])
    assert not steps.is_training(t["step"])  # a global-step read
    assert not steps.is_training([t["loss"], t["metric"]])  # an eval: the cluster runs, nothing is updated
    assert not steps.is_training(None) and not steps.is_training("no_such_op:0")


def test_a_run_missing_a_stitched_cluster_is_not_a_training_step() -> None:
    graph, t = _graph()
    # A second "cluster" the training run never reaches: stitching it needs feeds this run lacks.
    steps = TrainingSteps(graph)
    steps.require([[t["hidden"].op], [t["metric"].op]])
    assert not steps.is_training([t["loss"], t["train"]])
    assert steps.updates_variables([t["loss"], t["train"]])  # the rule before ranks agree on clusters


def test_the_training_path_excludes_metrics() -> None:
    graph, _ = _graph()
    path = training_path(graph)
    assert {"hidden", "x"} <= path and "metric" not in path
    # The loss value itself feeds no update (its gradient needs only shapes): a cluster that is only
    # the loss stays with TF, which is safe; in real graphs it joins the backward cluster anyway.
    assert "loss" not in path


def test_fetched_ops_flattens_nested_structures() -> None:
    graph, t = _graph()
    found = fetched_ops(graph, {"a": [t["loss"], ("train_op", None)], "b": t["step"]})
    assert sorted(op.name for op in found) == sorted(["loss", "train_op", t["step"].op.name])


@pytest.mark.parametrize(
    ("update", "trains"), [("none", False), ("saver", False), ("optimizer", True), ("assign_sub", True)]
)
def test_a_graph_trains_only_with_a_write_that_neither_initializes_nor_restores(update: str, trains: bool) -> None:
    """An evaluate or predict graph writes its variables only to initialize or restore them (a Saver's
    assigns read RestoreV2): the hook then skips its setup; an optimizer's or a hand-written update trains."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 3])
        w = tf.compat.v1.get_variable("w", [3, 2])
        loss = tf.reduce_sum(tf.matmul(x, w))
        tf.compat.v1.train.get_or_create_global_step()
        if update == "saver":
            tf.compat.v1.train.Saver()
        elif update == "optimizer":
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        elif update == "assign_sub":
            (grad,) = tf.gradients(loss, [w])
            w.assign_sub(0.1 * grad)
    assert TrainingSteps(graph).trains is trains


@pytest.mark.parametrize("resource", [True, False])
def test_gradient_accumulation_runs_are_training_steps(resource: bool) -> None:
    """A job that sums its gradients into variables over several runs and applies them every N runs: the runs
    that compute the gradients are its training steps (they run every cluster), the apply run is a side run.

    Regression: only writes of trainable variables counted, so no run was a training step and the gradient
    clusters were 'not on the training path': such a job was never stitched."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 8], use_resource=resource)
        hidden = tf.tanh(tf.matmul(x, w), name="hidden")
        loss = tf.reduce_mean(tf.square(hidden), name="loss")
        (grad,) = tf.gradients(loss, [w])
        total = tf.compat.v1.get_variable("total", [8, 8], trainable=False, use_resource=resource)
        accumulate = total.assign_add(grad)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        step = tf.compat.v1.train.get_or_create_global_step()
        apply = optimizer.apply_gradients([(total / 4.0, w)], global_step=step)
        # what stays a side run: a streaming metric's update and an average of the weights
        mean, update_mean = tf.compat.v1.metrics.mean(loss)
        average = tf.compat.v1.train.ExponentialMovingAverage(0.9).apply([w])
    steps = TrainingSteps(graph)
    steps.require([[grad.op]])
    assert grad.op.name in training_path(graph)
    assert steps.is_training([loss, accumulate])
    assert not steps.is_training(apply) and steps.updates_variables(apply)  # reaches no cluster
    assert not steps.updates_variables([mean, update_mean]) and not steps.updates_variables(average)


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_a_sparse_sgd_update_is_a_training_step(resource: bool) -> None:
    # word2vec (issue 30's corpus): every variable gets an IndexedSlices gradient, which SGD applies with
    # ScatterSub (ResourceScatterAdd for resource variables); no Apply op, and the run was not a training step
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        table = tf.compat.v1.get_variable("table", [50, 8], use_resource=resource)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    steps = TrainingSteps(graph)
    assert steps.trains and steps.updates_variables([train, loss]) and steps.trains_in([train, loss])
    assert not steps.trains_in(init) and not steps.updates_variables(loss)


def test_the_cached_training_answer_follows_the_required_clusters() -> None:
    # `is_training` remembers its answer per reached set: `require` (a cluster reverted, another enabled)
    # must drop it, and another fetch set gets its own answer.
    graph, t = _graph()
    steps = TrainingSteps(graph)
    fetches = [t["loss"], t["train"]]
    steps.require([[t["hidden"].op], [t["metric"].op]])
    assert not steps.is_training(fetches) and not steps.is_training(fetches)
    steps.require([[t["hidden"].op]])  # the metric's cluster reverted: the same fetches now train
    assert steps.is_training(fetches) and steps.is_training(fetches)
    assert not steps.is_training([t["loss"], t["metric"]])  # another fetch set: its own answer
    assert steps.is_training(fetches)
    steps.require([])  # every cluster reverted: nothing left to stitch, no training step
    assert not steps.is_training(fetches)
    steps.require([[t["metric"].op]])
    assert not steps.is_training(fetches) and steps.updates_variables(fetches)


def test_a_setups_three_questions_walk_the_graph_once_until_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook's `TrainingSteps`, the compile's data path and the selection's training path each asked for the
    variables a step updates, a scan and a walk of the graph each (issue 29: setup cost): answered once now. A
    variable added after (and its update) is still seen: the answer is the graph's as it is."""
    from stitchfleet.plugin.graph import training_steps

    graph, t = _graph()
    walks: list[int] = []
    walk = training_steps.upstream
    monkeypatch.setattr(training_steps, "upstream", lambda *a, **k: walks.append(1) or walk(*a, **k))
    first = (TrainingSteps(graph).updates, training_steps.data_path(graph), training_path(graph))
    assert len(walks) == 2  # the update's own walk once, then the data path's (training_path: `ancestors`)
    assert TrainingSteps(graph).updates == first[0] and len(walks) == 2
    with graph.as_default():
        u = tf.compat.v1.get_variable("u", [8, 8])
        tf.raw_ops.AssignAddVariableOp(resource=u.handle, value=tf.tanh(t["hidden"][:8]), name="late_update")
    assert "late_update" in TrainingSteps(graph).updates and "hidden" in training_path(graph)
    assert "late_update" not in first[0] and len(walks) == 3
    assert "late_update" in training_steps.data_path(graph)


def test_a_step_counters_resource_update_is_remembered_not_walked_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # `assign_add` on a resource variable fetches an `_UnreadVariable`: the fetch list was walked anew every step
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.get_variable("counter", [], tf.int64, use_resource=True, trainable=False)
        w = tf.compat.v1.get_variable("w", [4])
        loss = tf.reduce_sum(tf.square(w), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        step_up = tf.compat.v1.assign_add(step, 1)
    assert not isinstance(step_up, (tf.Tensor, tf.Operation))
    steps = TrainingSteps(graph)
    fetches = [loss, train, step_up]
    walks = []
    from stitchfleet.plugin.graph import training_steps

    def counted(graph: Any, fetches: object) -> list[Any]:
        walks.append(fetches)
        return fetched_ops(graph, fetches)

    monkeypatch.setattr(training_steps, "fetched_ops", counted)
    assert steps.updates_variables(fetches) and steps.updates_variables(fetches) and steps.updates_variables(fetches)
    assert len(walks) == 1
    assert not steps.updates_variables([loss])  # another list of other items is walked, and answers for itself
    assert len(walks) == 2
