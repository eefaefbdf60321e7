"""Shared pieces of C generation for one stitched cluster: the function's parameters, the
generator state every emitter reads, and the small C idioms (typed ranges, accumulators).

Input: the cluster graph and its StitchPlan. Output: data (`Param`, `CSource`, `Gen`) and
C text fragments used by `source` (loops, groups, the function) and `reduction`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stitchfleet.compiler.ir import DType, Graph, Op
from stitchfleet.compiler.kernel import ir as k
from stitchfleet.compiler.lower import Namer, Phase
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.cpu import cexpr as c
from stitchfleet.compiler.targets.cpu.rowcache import RowCache

LANES = 16
# Below this many elements touched by a planned loop, OpenMP's runner (the `_entry` and the function itself;
# the TF bridge op passes its own runner, plugin/native/csrc/pool.h) runs its tasks on the calling thread.
# High on purpose: on a busy 2-core machine (TF's own pools, other processes) a worker thread that is descheduled
# holds the region's closing barrier for a scheduler time slice (measured: 0.18 ms serial vs
# 3-12 ms with 2 threads for a 130k-element GELU cluster), so only clusters whose serial run
# takes milliseconds are worth the gamble.
PARALLEL_ELEMENTS = 1 << 22
MEMORY_ORDER_ACCUMULATORS = 2048  # a strided reduction's kept block, in accumulators on the stack


@dataclass(frozen=True)
class Param:
    """One pointer argument of the C function."""

    cname: str
    name: str  # graph parameter or output name
    dtype: DType
    shape: tuple[int, ...]
    output: bool


@dataclass(frozen=True)
class CSource:
    function: str
    text: str
    params: tuple[Param, ...]

    @property
    def entry(self) -> str:
        """`int entry(void *const *buffers)`: the function with every pointer in one array (inputs then
        outputs), the signature a caller that knows no cluster (the TF bridge op) can use."""
        return f"{self.function}_entry"


def ident(prefix: str, index: int, name: str) -> str:
    return f"{prefix}{index}_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"


@dataclass
class Gen:
    graph: Graph
    plan: StitchPlan
    ph: Phase
    names: Namer
    bounds: dict[str, int]
    caches: list[RowCache] = field(default_factory=list)  # the current task's row caches
    ready: list[RowCache] = field(default_factory=list)  # those its groups so far have written
    stored: dict[int, k.Buffer] = field(default_factory=dict)  # node -> output an earlier part wrote whole

    def group_bounds(self, **extra: int) -> dict[str, int]:
        return {**self.bounds, **extra}


_EXACT = frozenset({Op.REDUCE_MAX, Op.REDUCE_MIN})  # the result is one of the operands: no rounding


def accumulator(dtype: DType, op: Op | None = None) -> DType:
    """Float sums accumulate in double: free on a memory-bound CPU loop, and the result then no longer
    depends on the summation order the plan's task split imposes (one rounding at the end). A max or
    min is exact in any float type holding its operands, so it stays in the compute type: twice the
    lanes per vector and no conversions (the demo softmax's row max)."""
    if op in _EXACT and dtype.is_float:
        return DType.F64 if dtype is DType.F64 else DType.F32
    return DType.F64 if dtype.is_float else dtype


def loop_range(var: str, start: str, count: int, limit: int) -> str:
    """`for` over [start, min(start + count, limit))."""
    return f"for (int64_t {var} = {start}; {var} < sf_min_int64_t({start} + {count}L, {limit}L); ++{var})"


def no_shared_reduce(dtype: DType) -> k.SharedBuffer:
    raise c.CRenderError("CPU code reduces in registers; it has no per-warp shared arrays")
