"""A cluster's TF ops as a graph function, written as a FunctionDef: what the dispatch op runs switched off.

Input: a mapped `Site`, the names of the tensors its inputs are read from now (an earlier cluster's switched
output may stand for an original tensor), the map of such switched outputs back to the tensors they replaced,
and the graph. The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2

from stitchfleet.plugin.graph.mapping import Site
from stitchfleet.plugin.graph.recompute import recomputed

_NAMES = itertools.count()


def tensor_name(text: str) -> str:
    """`op` -> `op:0`; `op:k` unchanged (how GraphDef inputs name tensors)."""
    return text if ":" in text else f"{text}:0"


def _output_ref(op: Any, index: int) -> str:
    """A FunctionDef's name for output `index` of `op`: `op:<output arg>:<position in it>`."""
    start = 0
    for arg in op.op_def.output_arg:
        if arg.number_attr:
            count = int(op.get_attr(arg.number_attr))
        elif arg.type_list_attr:
            count = len(op.get_attr(arg.type_list_attr))
        else:
            count = 1
        if index < start + count:
            return f"{op.name}:{arg.name}:{index - start}"
        start += count
    raise KeyError(f"{op.name} has no output {index}")


def function_def(site: Site, outer: Sequence[str], originals: Mapping[str, str], name: str) -> function_pb2.FunctionDef:
    """The site's FunctionDef (see the module docstring); KeyError when a read cannot be resolved."""
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    refs: dict[str, str] = {}  # tensor name (as interior ops read it) -> its name in the function
    for j, (tensor, current) in enumerate(zip(site.inputs, outer, strict=True)):
        arg = fdef.signature.input_arg.add(name=f"in_{j}")
        # A ref input (a TF1 variable's slot read by its `read` Identity) comes in as its value: a function's
        # argument cannot be a ref, and one declared float_ref failed the step ('expected type float != float_ref').
        arg.type = tensor.dtype.base_dtype.as_datatype_enum
        refs[tensor.name] = refs[current] = arg.name
    for j, (folded, value) in enumerate(site.folded.items()):
        if folded in site.varying:
            continue  # recomputed below for each call's shapes
        constant = tf.make_tensor_proto(value)
        node = fdef.node_def.add(name=f"folded_{j}", op="Const")
        node.attr["dtype"].type = constant.dtype
        node.attr["value"].tensor.CopyFrom(constant)
        refs[folded] = f"folded_{j}:output:0"
    interior = site.internal_names
    chain, renamed = recomputed(site, set(refs), originals)
    by_name = {op.name: op for op in [*chain, *site.internal]}
    own = {n: o for n, o in originals.items() if o.rsplit(":", 1)[0] in interior}
    own.update(renamed)

    def ref(text: str) -> str:
        tensor = tensor_name(own.get(tensor_name(text), text))
        if tensor in refs:
            return refs[tensor]
        op_name, index = tensor.rsplit(":", 1)
        return _output_ref(by_name[op_name], int(index))

    for op in [*chain, *site.internal]:
        node = fdef.node_def.add()
        node.CopyFrom(op.node_def)
        reads = [ref(n) for n in node.input if not n.startswith("^")]
        del node.input[:]
        node.input.extend(reads)
        if "_class" in node.attr:
            del node.attr["_class"]  # colocation with ops that are not in the function
    for k, output in enumerate(site.outputs):
        result = fdef.signature.output_arg.add(name=f"out_{k}")
        result.type = output.dtype.as_datatype_enum
        fdef.ret[result.name] = ref(output.name)
    _check_acyclic(fdef)
    return fdef


def _check_acyclic(fdef: Any) -> None:
    """ValueError naming a node on a cycle of the function's nodes: TF finds one only when the op first runs
    ("N nodes in a cycle"), and the job's step would fail there; found here, the cluster is declined at setup."""
    reads = {node.name: {ref.split(":", 1)[0] for ref in node.input} for node in fdef.node_def}
    done: set[str] = set()
    for start in reads:
        path, stack = set(), [(start, False)]
        while stack:
            name, leaving = stack.pop()
            if leaving:
                path.discard(name)
                done.add(name)
            elif name in path:
                raise ValueError(f"the cluster's TF path holds a cycle through {name!r}")
            elif name in reads and name not in done:
                path.add(name)
                stack += [(name, True), *((read, False) for read in reads[name])]


def define(site: Site, outer: Sequence[str], originals: Mapping[str, str], graph: tf.Graph) -> str:
    """Registers the site's function in `graph`'s library and returns its name."""
    fdef = function_def(site, outer, originals, f"stitchfleet_fallback_{site.index}_{next(_NAMES)}")
    library = graph_pb2.GraphDef()
    library.versions.CopyFrom(graph.graph_def_versions)
    library.library.function.append(fdef)
    with graph.as_default():
        tf.graph_util.import_graph_def(library, name="")
    return str(fdef.signature.name)
