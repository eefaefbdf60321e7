"""The backend interface: how a compiled program is run, whatever runs it.

Input: a program, the kernels of one compiled cluster in launch order. Output:
an executable that maps named input buffers (numpy arrays) to the output buffers.
`sim` (numpy interpreter) implements it now; `cuda` and `cpu` plug in later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.kernel.ir import Kernel

Program = Sequence[Kernel]


class Executable(Protocol):
    """A compiled program: inputs by buffer name -> outputs by buffer name (flat arrays)."""

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, npt.NDArray[np.generic]]: ...


class Backend(Protocol):
    """Something that turns kernel IR into an executable."""

    name: str

    def compile(self, program: Program) -> Executable: ...
