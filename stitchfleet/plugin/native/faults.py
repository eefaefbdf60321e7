"""Test-only fault injection: a deliberately corrupted kernel, to prove the guard catches it.

Input: a `Fault` (what to corrupt, in which cluster, on which rank) handed to the hook's constructor; never
read from the environment by library code. The rules in full: docs/plugin/native.md.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import Attrs, Graph, Node, Op

KINDS: tuple[str, ...] = (
    "constant",
    "drop_term",
    "nan_constant",
    "off_by_one",
    "nan",
    "raise",
    "slow",
    "compile",
    "setup",
)
SLOW_SECONDS = 0.05  # what a `slow` kernel adds to each of its runs: far beyond any margin on a test graph
Array = npt.NDArray[np.generic]


class FaultError(ValueError):
    """The fault cannot be applied to this cluster (no constant, no addition to drop...)."""


@dataclass(frozen=True)
class Fault:
    """Corrupts cluster `cluster` (index in the compile report) on `rank` (None: every rank)."""

    kind: str
    cluster: int
    rank: int | None = None
    after: int = 0  # output faults start after this many runs of the kernel (a fault that starts late)
    # only the kernel compiled for this shape signature (its key) while the job runs (signature_kernels):
    # begin's kernels are right
    signature: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultError(f"fault kind {self.kind!r}: expected one of {', '.join(KINDS)}")

    def applies(self, cluster: int, rank: int, signature: str = "") -> bool:
        """Whether the kernel of `cluster` built on `rank` for `signature` ("": at begin) is corrupted."""
        return cluster == self.cluster and self.rank in (None, rank) and signature == self.signature

    def fails_setup(self, rank: int) -> bool:
        """Whether the hook's whole setup fails on `rank` (kind `setup`: a rank whose begin raised)."""
        return self.kind == "setup" and self.rank in (None, rank)

    @property
    def in_graph(self) -> bool:
        """Whether the fault lives in the compiled code alone (so any caller of that code, the native
        bridge op too, runs it), not in a Python step after the backend."""
        return self.kind in ("constant", "drop_term", "nan_constant")

    def corrupt_graph(self, graph: Graph) -> Graph:
        """The graph the backend compiles; unchanged for output-level faults. Kind `compile` fails here,
        as a compiler error on one rank would."""
        if self.kind == "compile":
            raise FaultError("injected compile failure")
        if self.kind in ("constant", "nan_constant"):
            return _replace(graph, _wrong_constant(graph, nan=self.kind == "nan_constant"))
        if self.kind == "drop_term":
            return _replace(graph, _dropped_term(graph))
        return graph

    def corrupt_outputs(self, outputs: dict[str, Array]) -> dict[str, Array]:
        """The backend's results as a buggy kernel would return them."""
        if self.kind == "raise":
            raise RuntimeError("injected backend failure")
        if self.kind == "slow":
            time.sleep(SLOW_SECONDS)  # right results, late: what only the slowdown guard can catch
            return outputs
        if self.kind not in ("off_by_one", "nan"):
            return outputs
        name = _first_float(outputs)
        value = np.array(outputs[name])
        flat = value.reshape(-1)
        if self.kind == "nan":
            flat[0] = np.nan
        else:
            # Every element reads its neighbour's value: an index off by one.
            flat[:] = np.roll(flat.copy(), 1)
        return {**outputs, name: value}


def _first_float(outputs: dict[str, Array]) -> str:
    for name, value in outputs.items():
        if np.issubdtype(np.asarray(value).dtype, np.floating) and np.asarray(value).size > 1:
            return name
    raise FaultError("no floating-point output with more than one element to corrupt")


def _replace(graph: Graph, node: Node) -> Graph:
    nodes = tuple(node if n.id == node.id else n for n in graph.nodes)
    return dataclasses.replace(graph, nodes=nodes)


def _wrong_constant(graph: Graph, nan: bool = False) -> Node:
    """The first float constant changed (x1.5 + 0.25), or NaN: a kernel whose code computes NaN in C."""
    for node in graph.nodes:
        if node.op is Op.CONSTANT and node.dtype.is_float:
            values = np.asarray(node.attrs.get("value"), dtype=np.float64) * (np.nan if nan else 1.5) + 0.25
            wrong = tuple(values.tolist()) if values.ndim else float(values)
            return dataclasses.replace(node, attrs=Attrs({**dict(node.attrs), "value": wrong}))
    raise FaultError("the cluster has no floating-point constant to corrupt")


def _dropped_term(graph: Graph) -> Node:
    for node in graph.nodes:
        if node.op is Op.ADD and node.dtype.is_float:
            kept = next((i for i in node.inputs if graph.node(i).shape == node.shape), None)
            if kept is not None:
                # max(a, a) == a: the sum's other term is gone, the graph keeps its structure.
                return dataclasses.replace(node, op=Op.MAXIMUM, inputs=(kept, kept))
    raise FaultError("the cluster has no floating-point addition whose term can be dropped")
