"""Inlines functional control flow whose outcome is known into a GraphDef.

Input: a `GraphDef` with a function library. The rules in full: docs/plugin/frontend.md.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph

CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
CONDS = frozenset({"If", "StatelessIf"})
MAX_DEPTH = 8  # nested calls are inlined round by round


def _producer(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def _constant_predicate(nodes: dict[str, Any], name: str) -> bool | None:
    node = nodes.get(_producer(name))
    while node is not None and node.op == "Identity":
        node = nodes.get(_producer(node.input[0]))
    if node is None or node.op != "Const":
        return None
    value = tf.make_ndarray(node.attr["value"].tensor)
    return bool(value) if value.size == 1 else None


def _target(node: Any, nodes: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The function to inline for this node and its data inputs, or None to keep the node."""
    data = [i for i in node.input if not i.startswith("^")]
    if node.op in CALLS:
        return node.attr["f"].func.name, data
    if node.op in CONDS:
        pred = _constant_predicate(nodes, data[0])
        if pred is None:
            return None
        return node.attr["then_branch" if pred else "else_branch"].func.name, data[1:]
    return None


def _rename(name: str, prefix: str, args: dict[str, str]) -> str:
    control = name.startswith("^")
    bare = name.lstrip("^")
    op, _, index = bare.partition(":")
    renamed = args[op] if op in args else f"{prefix}/{op}" + (f":{index}" if index else "")
    return f"^{_producer(renamed)}" if control else renamed


def _inline(node: Any, fdef: Any, inputs: list[str]) -> list[Any]:
    body, nested_to_flat = function_def_to_graph.function_def_to_graph_def(fdef)
    arg_names = [a.name for a in fdef.signature.input_arg]
    args = dict(zip(arg_names, inputs, strict=True))
    controls = [i for i in node.input if i.startswith("^")]
    made = []
    for inner in body.node:
        if inner.name in args:
            continue
        copy = tf.compat.v1.NodeDef()
        copy.CopyFrom(inner)
        copy.name = f"{node.name}/{inner.name}"
        del copy.input[:]
        copy.input.extend(_rename(i, node.name, args) for i in inner.input)
        if not any(not i.startswith("^") for i in inner.input):
            copy.input.extend(controls)  # a body source still waits for what the call waited for
        copy.device = copy.device or node.device
        made.append(copy)
    results = [_rename(nested_to_flat[fdef.ret[o.name]], node.name, args) for o in fdef.signature.output_arg]
    # the body's side effects (its control outputs) still happen before anything that reads the call
    effects = [f"^{node.name}/{fdef.control_ret[name]}" for name in fdef.signature.control_output]
    forward = tf.compat.v1.NodeDef(name=node.name, op="IdentityN")
    forward.input.extend(results + controls + effects)
    forward.attr["T"].list.type.extend(node.attr["Tout"].list.type)
    return [*made, forward]


def inline_functions(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
    """The GraphDef with known calls and conds inlined (a copy; the input is left alone)."""
    library = {f.signature.name: f for f in graph_def.library.function}
    current = graph_def
    for _ in range(MAX_DEPTH):
        nodes = {n.name: n for n in current.node}
        out = tf.compat.v1.GraphDef()
        out.versions.CopyFrom(current.versions)
        out.library.CopyFrom(current.library)
        changed = False
        for node in current.node:
            target = _target(node, nodes)
            if target is None or target[0] not in library:
                out.node.add().CopyFrom(node)
                continue
            out.node.extend(_inline(node, library[target[0]], target[1]))
            changed = True
        current = out
        if not changed:
            break
    return current
