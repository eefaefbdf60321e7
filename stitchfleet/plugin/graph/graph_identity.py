"""A graph's identity across a job's processes and sessions: its GraphDef without what each construction draws.

Input: a GraphDef (modified in place by `canonical`) or a graph. Output: the canonical GraphDef, and `graph_key`, its
hash: the key the job's records are found by in the next run. The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

SEED_ATTRS = ("seed", "seed2")
STRING = 7  # tensorflow.core.framework.types_pb2.DT_STRING, without importing TF at this module's import


def canonical(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
    """`graph_def` (changed in place and returned) without its seeds and string constants' values, and with canonical
    function names."""
    _blank_seeds(graph_def)
    _blank_strings(graph_def.node)
    for function in graph_def.library.function:
        _blank_strings(function.node_def)
    _rename_functions(graph_def)
    return graph_def


def graph_key(graph: tf.Graph, graph_def: tf.compat.v1.GraphDef | None = None) -> str:
    """The graph's identity for the book: its GraphDef without what each construction draws anew (random
    seeds, counters in function names: `canonical`), serialized deterministically; otherwise the same
    script, or an Estimator's next `train()`, would never find its own signature. `graph_def`: `graph`'s,
    when the caller has it already."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString()) if graph_def else graph.as_graph_def()
    return hashlib.sha256(canonical(graph_def).SerializeToString(deterministic=True)).hexdigest()[:32]


def _blank_strings(nodes: Any) -> None:
    """Clears the values of string constants, keeping their shapes: a run's file names (its input files in a scratch
    directory, a dated model_dir) are drawn per run and decide nothing the plugin compiles from the graph."""
    for node in nodes:
        if node.op == "Const" and "value" in node.attr and node.attr["value"].tensor.dtype == STRING:
            node.attr["value"].tensor.ClearField("string_val")


def _seed_inputs(op_type: str) -> list[int]:
    """The positions of an op type's inputs named `seed` (stateless random ops), from TF's op registry."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    return [k for k, arg in enumerate(op_def.input_arg) if arg.name == "seed"] if op_def is not None else []


def _blank_seeds(graph_def: Any) -> None:
    consts = {node.name: node for node in graph_def.node if node.op == "Const"}
    for node in graph_def.node:
        for attr in SEED_ATTRS:
            if attr in node.attr:
                del node.attr[attr]
        if not node.op.startswith("Stateless"):
            continue
        for position in _seed_inputs(node.op):
            if position < len(node.input):
                source = consts.get(node.input[position].split(":")[0].lstrip("^"))
                if source is not None:  # the value, wherever the proto holds it
                    for field in ("tensor_content", "int_val", "int64_val"):
                        source.attr["value"].tensor.ClearField(field)


def _rename_functions(graph_def: Any) -> None:
    """Names functions `function_<k>` in the order the graph first refers to them, and sorts the library so:
    the library's own order follows the counters in their names (`cond_true_9` and `cond_false_10` swap places
    once the counter gains a digit), so numbering in that order gave two builds of one model different keys."""
    by_name = {f.signature.name: f for f in graph_def.library.function}
    if not by_name:
        return
    order: list[str] = []
    pending = [ref for node in graph_def.node for ref in _refs(node.attr, by_name)]
    while pending:
        name = pending.pop(0)
        if name not in order:
            order.append(name)
            pending += [ref for node in by_name[name].node_def for ref in _refs(node.attr, by_name)]
    order += sorted((n for n in by_name if n not in order), key=lambda n: (re.sub(r"\d+", "", n), n))
    names = {name: f"function_{k}" for k, name in enumerate(order)}
    for node in graph_def.node:
        _rename_refs(node.attr, names)
    functions = [by_name[name] for name in order]
    for function in functions:
        function.signature.name = names[function.signature.name]
        for node in function.node_def:
            _rename_refs(node.attr, names)
    kept = [type(f).FromString(f.SerializeToString()) for f in functions]
    del graph_def.library.function[:]
    graph_def.library.function.extend(kept)
    for gradient in graph_def.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)


def _refs(attrs: Any, functions: Any) -> list[str]:
    """The functions `attrs` refer to, in attribute-name order (a map's own order is not stable), by `func` or by a
    string attribute naming one (the dispatch op's `fallback`)."""
    found = []
    for key in sorted(attrs):
        value = attrs[key]
        found += [value.func.name] if value.HasField("func") else []
        found += [func.name for func in value.list.func]
        found += [value.s.decode(errors="replace")] if value.HasField("s") else []
    return [name for name in found if name in functions]


def _rename_refs(attrs: Any, names: dict[str, str]) -> None:
    for value in attrs.values():
        if value.HasField("func") and value.func.name in names:
            value.func.name = names[value.func.name]
        for func in value.list.func:
            if func.name in names:
                func.name = names[func.name]
        if value.HasField("s") and value.s.decode(errors="replace") in names:
            value.s = names[value.s.decode(errors="replace")].encode()
