"""evaluate in float64 writes element-wise results into the arrays of values no later node reads (issue 29:
fresh arrays cost page faults on every check step). The outputs must be what every node's value, computed
without reuse (`evaluate_nodes`), gives: bit for bit, whatever views, casts and outputs hold the arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from stitchfleet.compiler import evaluate as evaluate_module
from stitchfleet.compiler.evaluate import evaluate, evaluate_nodes
from stitchfleet.compiler.ir import Graph, GraphBuilder, Op

RNG = np.random.default_rng(2911)


def holders() -> Graph:
    """Values whose arrays other values hold: views (reshape, transpose, broadcast, slice) of dying values and
    dying views of living ones, a float cast (the same array), an operand read twice by one op, an output read
    again later, long element-wise chains."""
    b = GraphBuilder()
    x = b.parameter("x", (6, 8))
    y = b.parameter("y", (6, 8))
    s = b.exp(x * 0.5)  # dies into the reshape below, which lives on
    flat = b.reshape(s, (48,))
    t = b.transpose(y - x, (1, 0))  # a view of a dying value
    square = b.unary(Op.SQUARE, x + y)
    twice = square * square  # one operand read twice
    b.output("twice", twice)
    later = twice + 1.0  # an output read again: never reused
    cast = b.cast(later, "f32")  # in float64 the same array as its operand
    row = b.slice(cast, (0, 0), (1, 8))
    spread = b.broadcast_to(b.reshape(row, (8,)), (6, 8))
    chain = spread
    for k in range(6):
        chain = b.maximum(chain * 0.5 + x, y) - b.neg(chain) / (1.0 + k)
    b.output("chain", chain)
    b.output("flat", b.reshape(flat, (6, 8)) + b.transpose(t, (1, 0)))
    b.output("cast", cast)
    base = x - y * 3.0  # an output whose view dies first: the view's array is the output's
    b.output("base", base)
    b.output("viewed", b.exp(b.reshape(base, (48,))) * 2.0)
    mean = b.reduce_mean(chain, (1,), keepdims=True)
    b.output("centered", chain - b.broadcast_to(mean, (6, 8)))
    return b.build()


def _takes(monkeypatch: Any) -> list[bool]:
    """Whether each result `evaluate` computed found a free array to go into, appended as it computes."""
    taken: list[bool] = []
    real = evaluate_module._target

    def counted(*args: Any) -> Any:
        target = real(*args)
        taken.append(target is not None)
        return target

    monkeypatch.setattr(evaluate_module, "_target", counted)
    return taken


def test_outputs_are_every_nodes_values_without_reuse(monkeypatch: Any) -> None:
    graph = holders()
    taken = _takes(monkeypatch)
    for seed in range(5):
        inputs = {n: RNG.standard_normal((6, 8)).astype(np.float32) for n in ("x", "y")}
        for noise in (None, 0, 5):
            values = evaluate_nodes(graph, inputs, "float64", noise=noise)
            outputs = evaluate(graph, inputs, "float64", noise=noise)
            for name, node_id in graph.outputs:
                assert outputs[name].dtype == values[node_id].dtype, name
                assert np.array_equal(outputs[name], values[node_id], equal_nan=True), (seed, noise, name)
    assert any(taken)  # the chains' dead arrays did take results


def test_other_precisions_take_no_dead_arrays(monkeypatch: Any) -> None:
    used: list[object] = []
    monkeypatch.setattr(evaluate_module, "_target", lambda *a: used.append(a))
    inputs = {n: RNG.standard_normal((6, 8)).astype(np.float32) for n in ("x", "y")}
    for precision in ("native", "float32", "storage"):
        evaluate(holders(), inputs, precision)
    assert not used


def test_a_later_evaluation_leaves_the_last_ones_outputs_alone() -> None:
    """Dead arrays outlive an evaluation (the next cluster's values take them): never an output's."""
    graph = holders()
    first_inputs = {n: RNG.standard_normal((6, 8)).astype(np.float32) for n in ("x", "y")}
    first = evaluate(graph, first_inputs, "float64")
    kept = {name: value.copy() for name, value in first.items()}
    for seed in range(3):
        inputs = {n: RNG.standard_normal((6, 8)).astype(np.float32) for n in ("x", "y")}
        later = evaluate(graph, inputs, "float64", noise=seed)
        values = evaluate_nodes(graph, inputs, "float64", noise=seed)
        assert all(np.array_equal(later[name], values[i], equal_nan=True) for name, i in graph.outputs)
    assert all(np.array_equal(first[name], kept[name], equal_nan=True) for name in kept)
    assert evaluate_module._kept_pool()  # arrays were kept for the next evaluation
    held = sum(a.nbytes for free in evaluate_module._kept_pool().values() for a in free)
    assert held <= evaluate_module.POOL_BYTES


def test_a_pool_full_of_other_shapes_makes_room(monkeypatch: Any) -> None:
    """The per-thread pool outlives evaluations: filled with another graph's arrays, it dropped nothing and took
    nothing, so no later evaluation reused an array (CI: a worker that had judged other models first)."""
    graph = holders()
    inputs = {n: RNG.standard_normal((6, 8)).astype(np.float32) for n in ("x", "y")}
    full = {(1024, 1024): [np.empty((1024, 1024)) for _ in range(evaluate_module.POOL_BYTES // (8 << 20))]}
    monkeypatch.setattr(evaluate_module._POOLS, "pool", full, raising=False)
    taken = _takes(monkeypatch)
    evaluate(graph, inputs, "float64")
    outputs = evaluate(graph, inputs, "float64")
    values = evaluate_nodes(graph, inputs, "float64")
    assert any(taken)  # the second evaluation took the first one's dead arrays
    for name, node_id in graph.outputs:
        assert np.array_equal(outputs[name], values[node_id], equal_nan=True), name
    pool = evaluate_module._POOLS.pool
    held = sum(a.nbytes for free in pool.values() for a in free)
    assert held <= evaluate_module.POOL_BYTES and (6, 8) in pool  # room made: the new shape is in, the cap kept
