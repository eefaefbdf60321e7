"""Walks over a TF graph's ops: what a set of ops depends on, and what depends on it.

Input: Output: the ops reached, by name, in a dict (`upstream`, `downstream`) or their names (`ancestors`).
The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf


def upstream(
    roots: Iterable[tf.Operation],
    *,
    control: bool = True,
    stop: Collection[str] = (),
    also: Mapping[str, Sequence[tf.Operation]] | None = None,
) -> dict[str, tf.Operation]:
    """`roots` and every op they depend on through data edges (and control edges with `control`), not
    entering ops named in `stop`; `also` adds what an op needs beyond its inputs (by its name)."""
    seen: dict[str, Any] = {}
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in seen or op.name in stop:
            continue
        seen[op.name] = op
        stack += [t.op for t in op.inputs]
        stack += list(op.control_inputs) if control else []
        stack += list((also or {}).get(op.name, ()))
    return seen


def downstream(
    roots: Iterable[tf.Operation],
    *,
    control: bool = True,
    skip: Callable[[tf.Operation], bool] | None = None,
    known: Collection[str] = (),
) -> dict[str, tf.Operation]:
    """`roots` and every op that depends on them through data edges (and control edges with `control`),
    leaving out (and not walking past) ops `skip` names and ops already `known`."""
    seen: dict[str, Any] = {}
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op.name in seen or op.name in known or (skip is not None and skip(op)):
            continue
        seen[op.name] = op
        stack += [reader for t in op.outputs for reader in t.consumers()]
        stack += list(op._control_outputs) if control else []
    return seen


def ancestors(roots: Iterable[tf.Operation]) -> set[str]:
    """Names of the ops `roots` depend on through data and control edges, the roots included."""
    return set(upstream(roots))
