"""The stitch plan as data: groups, thread mappings, edges with schemes, shared memory, launches.

Input: built by `plan.planner.plan_cluster`. Output: frozen records that the lowering
turns into kernel IR and the CompileReport carries (`to_json`). Every choice holds the
reason it was made, so a report says why a cluster became the kernels it did.

Vocabulary (AStitch §3-4): a *group* is a dominant op (a reduction, an expensive
element-wise op whose result is broadcast, or a cluster output no dominant computes)
plus the ops inlined into it (local scheme: registers, same thread). A group
*exports* values other groups read, through shared memory (regional) or global
scratch (global). A *loop* is a set of groups sharing one task partition (a task is
a set of rows a block handles at once); a *stage* is a set of loops between grid
barriers; `kernels` lists the stages each launch runs.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class GroupKind(enum.Enum):
    REDUCE = "reduce"
    ELEMENTWISE = "elementwise"  # an expensive op whose result is broadcast
    OUTPUT = "output"  # a cluster output no dominant group computes


class Layout(enum.Enum):
    """How a reduction's operand is viewed: reduced axes last (row), first (column) or neither."""

    ROW = "row"
    COLUMN = "column"
    STRIDED = "strided"


class MappingKind(enum.Enum):
    WARP_PER_ROW = "warp_per_row"  # horizontal packing: block_threads/32 rows per block
    BLOCK_PER_ROW = "block_per_row"
    SPLIT_ROW = "split_row"  # task splitting: several blocks per row, cross-block combine
    COLUMN_TILES = "column_tiles"  # a thread per column, rows split over blocks, partials combined
    THREAD_PER_OUTPUT = "thread_per_output"  # strided reductions: a thread loops over its reduced elements
    ROWWISE = "rowwise"  # element-wise over rows of `cols` elements, adopting a producer's partition
    ELEMENTWISE = "elementwise"  # element-wise, block_threads elements per task


class Combine(enum.Enum):
    """How a split reduction's blocks combine (only for mappings that `combines`)."""

    PARTIALS = "partials"  # per-task partials in global scratch, folded after a grid barrier by a finalize loop
    ATOMIC = "atomic"  # each task adds its partial to the value atomically: ready after one grid barrier


class Scheme(enum.Enum):
    LOCAL = "local"
    REGIONAL = "regional"
    GLOBAL = "global"
    INDEPENDENT = "independent"


@dataclass(frozen=True)
class Mapping:
    """Threads to data for one group. `rows`x`cols` is the group's 2-D view of its work.

    A task is `rows_per_task` rows (`blocks_per_row` > 1: a slice of one row; column tiles:
    a tile of `block_threads` columns by rows/`row_splits` rows). Blocks loop over tasks
    with stride gridDim (vertical packing when tasks exceed the grid).
    """

    kind: MappingKind
    rows: int
    cols: int
    block_threads: int
    rows_per_task: int
    tasks: int
    blocks_per_row: int = 1
    row_splits: int = 1
    reason: str = ""

    @property
    def combines(self) -> bool:
        """Whether partial results of several blocks are combined (needs a grid barrier)."""
        return self.blocks_per_row > 1 or self.row_splits > 1

    @property
    def partial_count(self) -> int:
        """How many cross-block partials a combining mapping writes (one per task slice of each value)."""
        return self.rows * self.blocks_per_row if self.blocks_per_row > 1 else self.row_splits * self.cols

    @property
    def partition(self) -> tuple[int, int] | None:
        """(rows, rows per task) when every row is computed by exactly one block, else None."""
        if self.combines or self.kind is MappingKind.COLUMN_TILES:
            return None
        return (self.rows, self.rows_per_task)


@dataclass(frozen=True)
class Group:
    """A dominant and what it inlines; `exports` are read by other groups, `outputs` leave the cluster."""

    id: int
    kind: GroupKind
    dominant: int
    tail: tuple[int, ...]  # ops after the dominant computed once per result element (sub-dominants)
    inlined: tuple[int, ...]  # producers recomputed in this group's threads (local scheme)
    exports: tuple[int, ...]
    outputs: tuple[int, ...]
    layout: Layout | None
    mapping: Mapping
    reason: str
    combine: Combine | None = None  # set when the mapping combines partial results of several blocks

    @property
    def roots(self) -> tuple[int, ...]:
        return (self.dominant, *self.tail)


@dataclass(frozen=True)
class Edge:
    """Group `producer` exports `node`, read by group `consumer`."""

    producer: int
    consumer: int
    node: int
    scheme: Scheme
    reason: str


@dataclass(frozen=True)
class SharedBuffer:
    """A regional value in shared memory: `rows_per_task` elements live from group `first` to `last`."""

    node: int
    loop: int
    offset: int
    bytes: int
    first: int
    last: int


@dataclass(frozen=True)
class Loop:
    """Groups (in order) sharing one task partition; `partition` is (rows, rows per task)."""

    id: int
    stage: int
    groups: tuple[int, ...]
    tasks: int
    finalize: tuple[int, ...] = ()  # groups whose cross-block partials this loop combines


@dataclass(frozen=True)
class Launch:
    kernel: int
    stages: tuple[int, ...]
    grid: int
    block_threads: int
    max_coresident_blocks: int
    registers: int
    smem_bytes: int  # regional values of its loops, then the block-reduce scratch (if any)
    grid_barriers: int
    reason: str
    scratch_offset: int = 0  # byte offset of the block-reduce scratch in the kernel's shared arena


@dataclass(frozen=True)
class Choice:
    """A planning decision: `action` on `subject`, and why."""

    action: str
    subject: str
    reason: str


@dataclass(frozen=True)
class StitchPlan:
    cluster: int
    device: str
    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    loops: tuple[Loop, ...]
    shared: tuple[SharedBuffer, ...]
    launches: tuple[Launch, ...]
    choices: tuple[Choice, ...] = field(default=())
    # Per cluster output, the earlier output whose bytes it holds (-1: the kernel stores it, or it passes an
    # input through): its kernel stores each value once (plan/repeats.py). Empty: no output repeats another.
    repeats: tuple[int, ...] = field(default=())

    def repeat_of(self, output: int) -> int:
        """The earlier output whose buffer output `output` shares, or -1."""
        return self.repeats[output] if self.repeats else -1

    @property
    def kernel_count(self) -> int:
        return len(self.launches)

    def group(self, group_id: int) -> Group:
        return self.groups[group_id]

    def edge_scheme(self, producer: int, consumer: int) -> Scheme | None:
        return next((e.scheme for e in self.edges if (e.producer, e.consumer) == (producer, consumer)), None)

    def to_json(self) -> dict[str, object]:
        doc = asdict(self)
        return _enum_values(doc)  # type: ignore[return-value]


def _enum_values(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _enum_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_enum_values(v) for v in value]
    return value
