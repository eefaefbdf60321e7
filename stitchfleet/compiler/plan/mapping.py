"""Adaptive thread mapping (AStitch §4.3): how a group's work is spread over threads and blocks.

Input: a reduction's operand shape and axes (or an element count), the block size and
the blocks per wave from the occupancy model, optionally a forced mapping (tests).
Output: a `Mapping` with the reason for its choice.

Row reductions (reduced axes last), with W blocks per wave of B threads:
- cols <= 512 and rows >= W*B/32 (enough rows to give every resident warp one):
  warp per row, B/32 rows per block (horizontal packing);
- few long rows (rows*2 <= W and cols >= 2*B): task splitting, each row over
  min(W // rows, ceil(cols / B)) blocks with a cross-block combine;
- otherwise block per row.
Column reductions (reduced axes first): a thread per column, B columns per tile, the
reduced rows split over as many blocks as fill one wave (at least 32 rows each),
partials combined. Other axes: a thread per output element looping over its inputs.
In every case blocks loop over tasks when tasks exceed the grid (vertical packing).
"""

from __future__ import annotations

import math

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.ir import Node
from stitchfleet.compiler.plan.model import Layout, Mapping, MappingKind

SHORT_ROW = 512
ROW_KINDS = frozenset({MappingKind.WARP_PER_ROW, MappingKind.BLOCK_PER_ROW, MappingKind.SPLIT_ROW})


class MappingError(ValueError):
    """A forced mapping does not apply to the group it was forced on."""


def reduce_view(operand_shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[Layout, int, int]:
    """(layout, rows, cols): row layout = kept x reduced, column layout = reduced x kept. Dimensions of size 1
    are left out first: they change no element's flat index, so `(2, 1, 1, 3072)` reduced over axes (0, 3) is
    a row reduction of one 6144-element row. Judged on the literal axes it was strided, a thread per output:
    one thread summed 6144 products in order: 54 times the native error, 10 times TF's own order's
    (ConvNeXtTiny's LayerScale gradient, issue 34). Reducing only size-1 dimensions is a copy: a column layout,
    a thread per element."""
    reduced = math.prod(operand_shape[a] for a in axes)
    kept = math.prod(d for i, d in enumerate(operand_shape) if i not in axes)
    wide = [i in axes for i, d in enumerate(operand_shape) if d != 1]  # per dimension of size > 1: reduced?
    if any(wide) and wide == sorted(wide):
        return Layout.ROW, kept, reduced
    if wide == sorted(wide, reverse=True):
        return Layout.COLUMN, reduced, kept
    return Layout.STRIDED, kept, reduced


def reduce_mapping(node: Node, operand: Node, block: int, wave: int, force: MappingKind | None = None) -> Mapping:
    """The mapping of a reduction group; `force` (a row mapping) applies to row reductions only."""
    layout, rows, cols = reduce_view(operand.shape, node.attrs.get_ints("axes"))
    if layout is Layout.ROW:
        return row_mapping(rows, cols, block, wave, force)
    if layout is Layout.COLUMN:
        return column_mapping(rows, cols, block, wave)
    tasks = -(-rows // block)
    why = f"reduced axes {node.attrs.get_ints('axes')} are neither leading nor trailing: a thread per output"
    return Mapping(MappingKind.THREAD_PER_OUTPUT, rows, cols, block, block, tasks, reason=why)


def _row_kind(rows: int, cols: int, block: int, wave: int) -> tuple[MappingKind, str]:
    warps = wave * block // WARP
    if cols <= SHORT_ROW and rows >= warps:
        return MappingKind.WARP_PER_ROW, f"short rows ({cols} <= {SHORT_ROW}) and {rows} rows >= {warps} warps/wave"
    if rows * 2 <= wave and cols >= 2 * block:
        return MappingKind.SPLIT_ROW, f"few long rows ({rows} rows, {wave} blocks/wave, {cols} cols)"
    if cols > SHORT_ROW:
        return MappingKind.BLOCK_PER_ROW, f"long rows ({cols} > {SHORT_ROW})"
    return MappingKind.BLOCK_PER_ROW, f"{rows} rows are fewer than the {warps} warps of a wave"


def row_mapping(rows: int, cols: int, block: int, wave: int, force: MappingKind | None = None) -> Mapping:
    """Warp per row, block per row or task splitting (see the module docstring)."""
    if force is not None and force not in ROW_KINDS:
        raise MappingError(f"cannot force {force.value} on a row reduction")
    kind, why = (force, "forced") if force is not None else _row_kind(rows, cols, block, wave)
    if kind is MappingKind.WARP_PER_ROW:
        per_block = block // WARP
        tasks = -(-rows // per_block)
        why += f"; {per_block} rows per {block}-thread block"
        return Mapping(kind, rows, cols, block, per_block, tasks, reason=_packed(why, tasks, wave))
    if kind is MappingKind.SPLIT_ROW:
        split = max(2, min(wave // max(rows, 1), -(-cols // block)))
        why += f"; each row split over {split} blocks, partials combined across blocks"
        return Mapping(
            kind, rows, cols, block, 1, rows * split, blocks_per_row=split, reason=_packed(why, rows * split, wave)
        )
    return Mapping(kind, rows, cols, block, 1, rows, reason=_packed(why, rows, wave))


def column_mapping(rows: int, cols: int, block: int, wave: int) -> Mapping:
    """Column tiles of `block` columns; reduced rows split to fill a wave."""
    tiles = -(-cols // block)
    splits = max(1, min(wave // tiles, -(-rows // WARP)))
    why = f"column reduction: {tiles} tile(s) of {block} columns, {rows} reduced rows split over {splits} block(s)"
    if splits > 1:
        why += ", partials combined across blocks"
    return Mapping(MappingKind.COLUMN_TILES, rows, cols, block, 1, tiles * splits, row_splits=splits, reason=why)


def elementwise_mapping(elements: int, block: int, wave: int) -> Mapping:
    tasks = -(-elements // block)
    why = _packed(f"element-wise, {block} elements per task", tasks, wave)
    return Mapping(MappingKind.ELEMENTWISE, elements, 1, block, block, tasks, reason=why)


def rowwise_mapping(partition: tuple[int, int], elements: int, block: int, wave: int, producer: int) -> Mapping:
    """Element-wise over rows, adopting producer group's partition so its values stay in the block."""
    rows, per_task = partition
    tasks = -(-rows // per_task)
    why = f"adopts the row partition of group {producer} ({per_task} row(s) of {elements // rows} per task)"
    return Mapping(
        MappingKind.ROWWISE, rows, elements // rows, block, per_task, tasks, reason=_packed(why, tasks, wave)
    )


def _packed(why: str, tasks: int, wave: int) -> str:
    if tasks > wave:
        return f"{why}; {tasks} tasks over at most {wave} blocks (vertical packing, {-(-tasks // wave)} per block)"
    return why
