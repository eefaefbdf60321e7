"""What the frontend produces: the IR graph plus the bridge back to TensorFlow.

Input: filled in by the converter. The rules in full: docs/plugin/frontend.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import Graph

Fate = Literal["lowered", "boundary", "folded", "alias", "dropped"]


class FrontendError(ValueError):
    """The input cannot be converted at all (unreadable file, malformed GraphDef); the message names it."""


class TensorRef(NamedTuple):
    """One TF tensor: the producing op's name and the output index."""

    op: str
    output: int

    @property
    def name(self) -> str:
        return f"{self.op}:{self.output}"


@dataclass(frozen=True)
class Disposition:
    """What became of one TF op.

    lowered: it became IR ops. boundary: a PARAMETER or OPAQUE node stands for it.
    folded: its value was computed at conversion time (shape arithmetic).
    alias: it forwards its input (Identity, StopGradient) and has no IR node of its own.
    dropped: nothing in the IR stands for it (no data outputs, or outputs of a type the IR cannot hold).
    """

    op_type: str
    fate: Fate
    reason: str = ""


@dataclass(frozen=True)
class Conversion:
    graph: Graph
    origins: Mapping[int, TensorRef]
    tensors: Mapping[str, int]
    ops: Mapping[str, Disposition]
    folded: Mapping[str, npt.NDArray[np.generic]]

    @property
    def skipped(self) -> dict[str, Disposition]:
        """Every TF op that did not become IR ops, with its reason."""
        return {name: d for name, d in self.ops.items() if d.fate != "lowered"}

    def node_of(self, tensor_name: str) -> int:
        """The IR node holding a TF tensor's value ('op:0'); KeyError naming the tensor when none does."""
        try:
            return self.tensors[tensor_name]
        except KeyError:
            raise KeyError(f"TF tensor {tensor_name!r} has no IR node") from None
