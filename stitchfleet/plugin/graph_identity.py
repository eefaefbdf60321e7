"""A graph's identity across a job's processes and sessions: its GraphDef without what each construction draws.

Input: a GraphDef (modified in place by `canonical`). Output: the same graph with the per-construction noise
removed: random seeds (`seed`/`seed2` attributes, and the constant seed tensors of stateless random ops, which
Keras' initializers draw per graph), and the process-wide counters in function names (`cond_v2` branches and
`tf.data` functions are named `..._<uid>`: renamed by their order in the library, references included).

Why: the signature book keys a job's recorded shape signature by its graph. A tf.estimator job builds a new
graph for every `train()` call, and a restarted pod builds its graph anew: with those parts in the key the
same model never found its own signature, guessed the batch again, and its probes ran while the kernels for
its real batch were still to come. Two graphs differing only there compute the same thing; a recalled
signature is only a hint (a wrong one costs a rebuild, never correctness).
"""

from __future__ import annotations

from typing import Any

SEED_ATTRS = ("seed", "seed2")


def canonical(graph_def: Any) -> Any:
    """`graph_def` (changed in place and returned) without its seeds and with canonical function names."""
    _blank_seeds(graph_def)
    _rename_functions(graph_def)
    return graph_def


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
    names = {f.signature.name: f"function_{k}" for k, f in enumerate(graph_def.library.function)}
    if not names:
        return
    for node in graph_def.node:
        _rename_refs(node.attr, names)
    for function in graph_def.library.function:
        function.signature.name = names[function.signature.name]
        for node in function.node_def:
            _rename_refs(node.attr, names)
    for gradient in graph_def.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)


def _rename_refs(attrs: Any, names: dict[str, str]) -> None:
    for value in attrs.values():
        if value.HasField("func") and value.func.name in names:
            value.func.name = names[value.func.name]
        for func in value.list.func:
            if func.name in names:
                func.name = names[func.name]
