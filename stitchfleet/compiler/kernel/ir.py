"""The kernel IR: low-level SIMT code, one immutable `Kernel` per GPU launch.

Input: nothing (data types). Output: frozen dataclasses for buffers, expressions,
statements, the launch configuration and the kernel, plus small constructors
(`i64`, `add`, `lt`...) that keep lowering code short. Math ops reuse the graph
IR's `Op` names and meanings; `IndexOp.MOD` adds C-style integer remainder, and
`Op.DIV` on integers truncates toward zero, as C does. Indices are integer
expressions (threadIdx.x and friends are i64 here).

The same IR is interpreted by the sim backend and rendered to CUDA C and C+OpenMP,
so it stays small and regular: a kernel is a tuple of statements over thread-local
variables, global buffers (parameters) and per-block shared buffers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeAlias

from stitchfleet.compiler import devices
from stitchfleet.compiler.ir.types import COMPARISONS, DType, Op

WARP_SIZE = devices.WARP  # the device profiles' warp width (devices.py), one constant for every target
MAX_BLOCK_THREADS = 1024
DEFAULT_SHARED_LIMIT = 48 * 1024  # the static __shared__ limit per block on every CUDA arch


class Role(enum.Enum):
    """What a global buffer is to its kernel. Scratch is allocated and zeroed by the runtime."""

    INPUT = "in"
    OUTPUT = "out"
    SCRATCH = "scratch"


class Special(enum.Enum):
    """Per-thread hardware indices (all i64 in the IR)."""

    THREAD_IDX = "threadIdx.x"
    BLOCK_IDX = "blockIdx.x"
    BLOCK_DIM = "blockDim.x"
    GRID_DIM = "gridDim.x"
    LANE = "lane"
    WARP = "warp"


class IndexOp(enum.Enum):
    """Integer index math that the graph IR has no op for."""

    MOD = "MOD"


class ShuffleMode(enum.Enum):
    DOWN = "down"
    XOR = "xor"


@dataclass(frozen=True)
class Buffer:
    """A global-memory kernel parameter of `size` elements."""

    name: str
    dtype: DType
    size: int
    role: Role


@dataclass(frozen=True)
class SharedBuffer:
    """A per-block `__shared__` array of `size` elements.

    With `offset` (bytes) it is a typed view of the kernel's shared arena instead of an
    array of its own: views may overlap, which is how a planner reuses space for values
    whose lifetimes do not overlap (the sim checks that a view only reads bytes it wrote).
    """

    name: str
    dtype: DType
    size: int
    offset: int | None = None

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def end(self) -> int:
        """One past the last arena byte of a view (its own size for an array)."""
        return (self.offset or 0) + self.nbytes


AnyBuffer: TypeAlias = Buffer | SharedBuffer


# ---- expressions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Const:
    value: int | float | bool
    dtype: DType


@dataclass(frozen=True)
class SpecialIndex:
    which: Special

    @property
    def dtype(self) -> DType:
        return DType.I64


@dataclass(frozen=True)
class Var:
    """A thread-local variable (a register)."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Unary:
    op: Op
    x: Expr

    @property
    def dtype(self) -> DType:
        return self.x.dtype


@dataclass(frozen=True)
class Binary:
    op: Op | IndexOp
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:
        return DType.BOOL if self.op in COMPARISONS else self.a.dtype


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DType:
        return self.a.dtype


@dataclass(frozen=True)
class Cast:
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Load:
    """`buffer[index]` from a global or shared buffer."""

    buffer: AnyBuffer
    index: Expr

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype


Expr: TypeAlias = Const | SpecialIndex | Var | Unary | Binary | Select | Cast | Load


# ---- statements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Assign:
    var: Var
    value: Expr


@dataclass(frozen=True)
class Store:
    buffer: AnyBuffer
    index: Expr
    value: Expr


@dataclass(frozen=True)
class For:
    """`for (var = start; var < stop; var += step)`; bounds may differ per thread (step > 0)."""

    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class If:
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class SyncThreads:
    """`__syncthreads()`: every thread of the block must reach it."""


@dataclass(frozen=True)
class GridSync:
    """A cooperative-groups grid barrier: every block must reach it and all must be co-resident."""


@dataclass(frozen=True)
class Shuffle:
    """`var = __shfl_{mode}_sync(active, value, offset, width)`."""

    var: Var
    value: Expr
    offset: int
    mode: ShuffleMode = ShuffleMode.DOWN
    width: int = WARP_SIZE


@dataclass(frozen=True)
class Atomic:
    """`atomicAdd` / `atomicMax` / `atomicMin` (op ADD, MAXIMUM, MINIMUM) on a global or shared element."""

    op: Op
    buffer: AnyBuffer
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Comment:
    text: str


Stmt: TypeAlias = Assign | Store | For | If | SyncThreads | GridSync | Shuffle | Atomic | Comment
ATOMIC_OPS = frozenset({Op.ADD, Op.MAXIMUM, Op.MINIMUM})


# ---- the kernel ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """1-D launch configuration and the resource bounds the planner derived it from."""

    grid: int
    block: int
    max_coresident_blocks: int
    max_registers: int | None = None
    dynamic_smem_bytes: int = 0
    shared_limit_bytes: int = DEFAULT_SHARED_LIMIT

    @property
    def threads(self) -> int:
        return self.grid * self.block


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Buffer, ...]
    shared: tuple[SharedBuffer, ...]
    launch: Launch
    body: tuple[Stmt, ...]
    doc: str = field(default="", compare=False)

    def param(self, name: str) -> Buffer:
        """The parameter called `name`; KeyError naming the kernel otherwise."""
        for buf in self.params:
            if buf.name == name:
                return buf
        raise KeyError(f"kernel {self.name!r} has no parameter {name!r}")

    @property
    def arena_bytes(self) -> int:
        """Bytes of the shared arena: up to the end of its last view (0 without views)."""
        return max((s.end for s in self.shared if s.offset is not None), default=0)

    @property
    def shared_bytes(self) -> int:
        own = sum(s.nbytes for s in self.shared if s.offset is None)
        return self.arena_bytes + own + self.launch.dynamic_smem_bytes


# ---- constructors --------------------------------------------------------------------------

THREAD_IDX = SpecialIndex(Special.THREAD_IDX)
BLOCK_IDX = SpecialIndex(Special.BLOCK_IDX)
BLOCK_DIM = SpecialIndex(Special.BLOCK_DIM)
GRID_DIM = SpecialIndex(Special.GRID_DIM)
LANE = SpecialIndex(Special.LANE)
WARP = SpecialIndex(Special.WARP)


def i64(value: int) -> Const:
    return Const(int(value), DType.I64)


def const(value: float | int | bool, dtype: DType) -> Const:
    """A constant of `dtype`, its Python value normalised (float for float dtypes)."""
    if dtype is DType.BOOL:
        return Const(bool(value), dtype)
    return Const(float(value) if dtype.is_float else int(value), dtype)


def add(a: Expr, b: Expr) -> Binary:
    return Binary(Op.ADD, a, b)


def sub(a: Expr, b: Expr) -> Binary:
    return Binary(Op.SUB, a, b)


def mul(a: Expr, b: Expr) -> Binary:
    return Binary(Op.MUL, a, b)


def div(a: Expr, b: Expr) -> Binary:
    return Binary(Op.DIV, a, b)


def mod(a: Expr, b: Expr) -> Binary:
    return Binary(IndexOp.MOD, a, b)


def lt(a: Expr, b: Expr) -> Binary:
    return Binary(Op.LESS, a, b)


def eq(a: Expr, b: Expr) -> Binary:
    return Binary(Op.EQUAL, a, b)


def global_thread_index() -> Binary:
    """blockIdx.x * blockDim.x + threadIdx.x."""
    return add(mul(BLOCK_IDX, BLOCK_DIM), THREAD_IDX)
