"""Where the hook's setup puts what it adds to the user's graph, and what the job exports of that graph.

Input: the graph a hook sets up, around its `begin` (`setup_additions(graph)`, a context manager). Output:
side effects only. The rules in full: docs/plugin/session.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger("stitchfleet.plugin")


@contextlib.contextmanager
def setup_additions(graph: tf.Graph) -> Iterator[None]:
    """Around the hook's setup of `graph`: top-level names, and whatever it added (even when it failed part
    way) hidden from the graph's exports after."""
    ops_before = len(graph.get_operations())  # kept in creation order: what comes later was added here
    functions_before = set(graph._functions)
    collections_before = {key: len(graph.get_collection(key)) for key in graph.get_all_collection_keys()}
    try:
        with graph.name_scope(None):
            yield
    finally:
        try:
            _hide(graph, ops_before, functions_before, collections_before)
        except Exception:  # an export with our ops is still a working one in this process
            log.exception("stitchfleet: could not hide the stitching from the graph's exports")


def _hide(graph: Any, ops_before: int, functions_before: set[str], collections_before: dict[Any, int]) -> None:
    added = graph.get_operations()[ops_before:]
    if not added:
        return
    ops = frozenset(op.name for op in added)
    functions = frozenset(graph._functions) - functions_before
    for key in graph.get_all_collection_keys():
        # A v1 cond of the Python bridge registers its context in COND_CONTEXT: exported, it names ops
        # the filtered GraphDef no longer has, and importing the meta graph fails on it.
        del graph.get_collection_ref(key)[collections_before.get(key, 0) :]
    graph.as_graph_def = _filtered(graph.as_graph_def, ops, functions)


def _filtered(as_graph_def: Callable[..., Any], ops: frozenset[str], functions: frozenset[str]) -> Callable[..., Any]:
    def as_graph_def_as_written(*args: Any, **kwargs: Any) -> Any:
        graph_def = as_graph_def(*args, **kwargs)
        kept = [node for node in graph_def.node if node.name not in ops]
        del graph_def.node[:]
        graph_def.node.extend(kept)
        library = graph_def.library
        kept_functions = [f for f in library.function if f.signature.name not in functions]
        del library.function[:]
        library.function.extend(kept_functions)
        kept_gradients = [g for g in library.gradient if g.function_name not in functions]
        del library.gradient[:]
        library.gradient.extend(kept_gradients)
        return graph_def

    return as_graph_def_as_written
