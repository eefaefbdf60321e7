"""The native bridge's fallback, written as a FunctionDef (`fallback.py`): switched off, every installed
cluster's dispatch op gives exactly what the cluster's own TF ops give on the same inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from stitchfleet.demo import models
from stitchfleet.plugin.graph.fallback import function_def
from stitchfleet.plugin.session.hook import StitchHook
from tests.plugin.hook_harness import _feeds, make_settings

pytestmark = pytest.mark.tf


def test_switched_off_every_cluster_computes_what_its_tf_ops_compute(tmp_path: Path) -> None:
    hook = StitchHook(make_settings(tmp_path, "fallback", STITCHFLEET_BRIDGE="native"), backend="cpu")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        hook.begin()
        assert hook.installed and hook._bridge is not None
        names = set(graph._functions)  # the graph's own library: its exports leave them out (exported_graph)
        assert sum(name.startswith("stitchfleet_fallback_") for name in names) == len(hook.installed)
        dispatches = [op for op in graph.get_operations() if op.type == "StitchfleetDispatch"]
        assert len(dispatches) == len(hook.installed)
        for op in dispatches:  # named by a string: TF optimizes no fallback at an executor build (issue 29)
            assert op.node_def.attr["fallback"].WhichOneof("value") == "s"
            assert op.node_def.attr["fallback"].s.decode() in names
        fetches = [(done.original, done.switched) for _, done in hook.installed]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(fetches, _feeds(graph))  # the switch vector defaults to all off
    hook.end(None)
    for original, switched in got:
        for want, value in zip(original, switched, strict=True):
            np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7)


def test_the_function_reads_its_arguments_and_returns_the_cluster_outputs(tmp_path: Path) -> None:
    hook = StitchHook(make_settings(tmp_path, "fdef", STITCHFLEET_BRIDGE="python"), backend="cpu")
    graph = models.build("bert_encoder", "small", seed=1)
    with graph.as_default():
        hook.begin()
    hook.end(None)
    _, done = hook.installed[0]
    site = done.site
    fdef = function_def(site, [t.name for t in site.inputs], {}, "probe")
    assert [a.name for a in fdef.signature.input_arg] == [f"in_{j}" for j in range(len(site.inputs))]
    assert len(fdef.signature.output_arg) == len(site.outputs)
    assert {n.name for n in fdef.node_def} >= {op.name for op in site.internal}
    assert not any(i.startswith("^") for n in fdef.node_def for i in n.input)  # control inputs dropped
    assert all("_class" not in n.attr for n in fdef.node_def)


def test_a_function_whose_nodes_form_a_cycle_is_refused_when_written() -> None:
    """TF reports a cycle in a function only when the op first runs ("N nodes in a cycle", a failed step);
    `function_def` refuses it when it writes the function, so setup declines the cluster instead."""
    from tensorflow.core.framework import function_pb2

    from stitchfleet.plugin.graph.fallback import _check_acyclic

    fdef = function_pb2.FunctionDef()
    for name, inputs in (("shape", ["broadcast:output:0"]), ("broadcast", ["in_0", "shape:output:0"])):
        node = fdef.node_def.add(name=name)
        node.input.extend(inputs)
    with pytest.raises(ValueError, match="cycle through"):
        _check_acyclic(fdef)
    del fdef.node_def[0].input[:]  # shape reads nothing now: a chain in_0 -> broadcast, shape -> broadcast
    fdef.node_def[0].input.append("in_0")
    _check_acyclic(fdef)
    diamond = function_pb2.FunctionDef()
    for name, inputs in (("a", ["b:y:0", "c:y:0"]), ("c", ["b:y:0"]), ("b", ["in_0"])):
        diamond.node_def.add(name=name).input.extend(inputs)
    _check_acyclic(diamond)  # two paths to one node are no cycle
