"""Global and shared memory of the sim, with the race and bounds checks a GPU would not do.

Input: vectorised accesses (global thread ids, element indices, values) from the
interpreter. Output: loaded values, updated memory, or an `AccessError` saying what
went wrong and for which thread. Tracking, per element, since the last barrier:
- global: the last plain writer (or ATOMIC) and its block's barrier count at the
  write, and for writable buffers the readers likewise; reset by a grid barrier. A
  read or write of an element another block wrote (or, for a write, read) in this
  grid epoch is a race; so is one by another thread of the same block with no
  `__syncthreads` between.
- shared (per block, per element of an array or per byte of the arena that typed
  views share): which view last wrote it (a view reading bytes it did not write
  reads a value whose space was reused, or nothing), its writer and its readers
  since the last `__syncthreads` (read-after-write, write-after-read and
  write-after-write between different threads are races).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
Ints = npt.NDArray[np.int64]

NONE = -1
ATOMIC = -2
MANY = -3


class AccessError(Exception):
    """One invalid access; the interpreter adds kernel and statement."""


def check_bounds(name: str, size: int, tids: Ints, addr: Ints) -> None:
    bad = (addr < 0) | (addr >= size)
    if bad.any():
        k = int(np.argmax(bad))
        raise AccessError(
            f"out-of-bounds index {int(addr[k])} into {name!r} of {size} elements (thread {int(tids[k])})"
        )


def raise_if_duplicate(name: str, recorded: Ints, tids: Ints, addr: Ints) -> None:
    """After `recorded[...] = tids`, an entry that did not stick was overwritten by another thread."""
    lost = recorded != tids
    if lost.any():
        a = int(addr[int(np.argmax(lost))])
        raise AccessError(f"write-write race: several threads store {name}[{a}] in one step")


def apply_atomic(
    data: Array, where: tuple[Ints, ...], values: Array, ufunc: np.ufunc, fit: Callable[[Array], Array] | None
) -> None:
    """Fold `values` into `data[where]` one update at a time, as the target's atomics do.

    With `fit` (bf16: the CUDA compare-and-swap loop stores a bf16 after every add) each
    update is rounded before the next one to the same element; threads apply in id
    order, one legal order. Updates to distinct elements go together, round by round.
    """
    if fit is None:
        ufunc.at(data, where, values)
        return
    values = np.broadcast_to(values, where[0].shape)
    keys = np.ravel_multi_index(where, data.shape)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
    run = np.arange(sorted_keys.size) - np.repeat(starts, np.diff(np.r_[starts, sorted_keys.size]))
    rank = np.empty_like(run)
    rank[order] = run  # how many earlier updates hit the same element
    for r in range(int(rank.max(initial=-1)) + 1):
        pick = rank == r
        at = tuple(w[pick] for w in where)
        data[at] = fit(ufunc(data[at], values[pick]))


class GlobalBuffer:
    """One global buffer and its per-element writer record for the current grid epoch."""

    def __init__(self, name: str, data: Array, block: int, block_epoch: Ints, *, writable: bool) -> None:
        self.name, self.data, self.block = name, data, block
        self.block_epoch = block_epoch  # shared with the interpreter: barrier count per block
        self.writer = np.full(data.size, NONE, np.int64)
        self.stamp = np.zeros(data.size, np.int64)
        self.dirty = False
        # Reads matter only where a later write may follow (inputs are read-only): write-after-read races.
        self.track_reads = writable
        size = data.size if writable else 0
        self.reader, self.reader_block = np.full(size, NONE, np.int64), np.full(size, NONE, np.int64)
        self.read_stamp = np.zeros(size, np.int64)
        self.read_dirty = False

    def new_epoch(self) -> None:
        if self.dirty:
            self.writer.fill(NONE)
            self.dirty = False
        if self.read_dirty:
            self.reader.fill(NONE)
            self.reader_block.fill(NONE)
            self.read_dirty = False

    def _note_reads(self, tids: Ints, addr: Ints) -> None:
        blocks = tids // self.block
        for record, who in ((self.reader, tids), (self.reader_block, blocks)):
            current = record[addr]
            wanted = np.where((current == NONE) | (current == who), who, MANY)
            record[addr] = wanted
            clash = record[addr] != wanted  # several threads (blocks) read one element in this access
            record[addr[clash]] = MANY
        self.read_stamp[addr] = self.block_epoch[blocks]
        self.read_dirty = True

    def _check_war(self, tids: Ints, addr: Ints) -> None:
        if not self.read_dirty:
            return
        r, rb, blocks = self.reader[addr], self.reader_block[addr], tids // self.block
        ordered = (rb == blocks) & (self.read_stamp[addr] < self.block_epoch[blocks])
        bad = (r != NONE) & (r != tids) & ~ordered
        if bad.any():
            k = int(np.argmax(bad))
            who = "several threads" if r[k] == MANY else f"thread {int(r[k])}"
            raise AccessError(
                f"write-after-read race: thread {int(tids[k])} writes {self.name}[{int(addr[k])}] read by {who} "
                "in this grid epoch with no barrier between"
            )

    def _unordered(self, tids: Ints, addr: Ints) -> npt.NDArray[np.bool_]:
        """Accesses that conflict with this epoch's last writer of the element."""
        w = self.writer[addr]
        blocks = tids // self.block
        synced = (w // self.block == blocks) & (self.stamp[addr] < self.block_epoch[blocks])
        conflict: npt.NDArray[np.bool_] = (w == ATOMIC) | ((w >= 0) & (w != tids) & ~synced)
        return conflict

    def _raise_conflict(self, tids: Ints, addr: Ints, bad: npt.NDArray[np.bool_], verb: str) -> None:
        k = int(np.argmax(bad))
        w, t, a = int(self.writer[addr[k]]), int(tids[k]), int(addr[k])
        if w == ATOMIC:
            raise AccessError(f"{verb} of {self.name}[{a}] by thread {t} after an atomic update in the same grid epoch")
        if w // self.block != t // self.block:
            raise AccessError(
                f"cross-block {verb}: thread {t} (block {t // self.block}) {verb}s {self.name}[{a}] written by "
                f"thread {w} (block {w // self.block}) without a grid barrier between"
            )
        raise AccessError(f"race: thread {t} {verb}s {self.name}[{a}] written by thread {w} with no __syncthreads")

    def load(self, tids: Ints, addr: Ints) -> Array:
        check_bounds(self.name, self.data.size, tids, addr)
        if self.dirty:
            bad = self._unordered(tids, addr)
            if bad.any():
                self._raise_conflict(tids, addr, bad, "read")
        if self.track_reads:
            self._note_reads(tids, addr)
        return self.data[addr]

    def store(self, tids: Ints, addr: Ints, values: Array) -> None:
        check_bounds(self.name, self.data.size, tids, addr)
        if self.dirty:
            bad = self._unordered(tids, addr)
            if bad.any():
                self._raise_conflict(tids, addr, bad, "write")
        self._check_war(tids, addr)
        self.writer[addr] = tids
        raise_if_duplicate(self.name, self.writer[addr], tids, addr)
        self.data[addr] = values
        self.stamp[addr] = self.block_epoch[tids // self.block]
        self.dirty = True

    def atomic(
        self, tids: Ints, addr: Ints, values: Array, ufunc: np.ufunc, fit: Callable[[Array], Array] | None = None
    ) -> None:
        check_bounds(self.name, self.data.size, tids, addr)
        if self.dirty:
            bad = self._unordered(tids, addr) & (self.writer[addr] != ATOMIC)
            if bad.any():
                self._raise_conflict(tids, addr, bad, "atomic update")
        self._check_war(tids, addr)
        apply_atomic(self.data, (addr,), values, ufunc, fit)
        self.writer[addr] = ATOMIC
        self.dirty = True


class SharedMemory:
    """Per-block shared cells (an array's elements, or an arena's bytes) and their records.

    `owner` is the view that last wrote a cell (NONE: never written): a view may read
    only cells it wrote itself, so reusing arena space while a value is live is caught.
    """

    def __init__(self, grid: int, cells: int) -> None:
        self.owner = np.full((grid, cells), NONE, np.int64)
        self.writer = np.full((grid, cells), NONE, np.int64)
        self.reader = np.full((grid, cells), NONE, np.int64)
        self.names: list[str] = []

    def register(self, name: str) -> int:
        self.names.append(name)
        return len(self.names) - 1

    def barrier(self, blocks: Ints) -> None:
        self.writer[blocks] = NONE
        self.reader[blocks] = NONE


class SharedBuffer:
    """A `__shared__` array per block, or a typed view of a per-block arena (`arena_view`)."""

    def __init__(self, name: str, data: Array, memory: SharedMemory, cells: tuple[int, int], block: int) -> None:
        self.name, self.data, self.memory, self.block = name, data, memory, block
        self.size = data.shape[1]
        self.first, self.width = cells  # the first cell, and cells per element
        self.id = memory.register(name)

    @classmethod
    def array(cls, name: str, dtype: np.dtype[Any], size: int, grid: int, block: int) -> SharedBuffer:
        """An array of its own: one cell per element."""
        return cls(name, np.zeros((grid, size), dtype), SharedMemory(grid, size), (0, 1), block)

    @classmethod
    def view(
        cls, name: str, arena: tuple[Array, SharedMemory], dtype: np.dtype[Any], *, offset: int, size: int, block: int
    ) -> SharedBuffer:
        """`size` elements of `dtype` at byte `offset` of a (grid x bytes) uint8 arena: one cell per byte."""
        data, memory = arena
        typed = data[:, offset : offset + size * dtype.itemsize].view(dtype)
        return cls(name, typed, memory, (offset, dtype.itemsize), block)

    def barrier(self, blocks: Ints) -> None:
        self.memory.barrier(blocks)

    def _keys(self, tids: Ints, addr: Ints) -> tuple[Ints, Ints, Ints, Ints]:
        """Blocks, local thread ids, and the (accesses x cells) indices of the records."""
        check_bounds(self.name, self.size, tids, addr)
        blocks = tids // self.block
        cells = self.first + addr[:, None] * self.width + np.arange(self.width)
        return blocks, tids % self.block, blocks[:, None], cells

    def load(self, tids: Ints, addr: Ints) -> Array:
        blocks, local, rows, cells = self._keys(tids, addr)
        owner = self.memory.owner[rows, cells]
        if (owner == NONE).any():
            k = int(np.argmax((owner == NONE).any(axis=1)))
            raise AccessError(
                f"read of uninitialised shared {self.name}[{int(addr[k])}] by thread {int(local[k])} of block "
                f"{int(blocks[k])} (no thread wrote it before this read; missing write or barrier)"
            )
        if (owner != self.id).any():
            k = int(np.argmax((owner != self.id).any(axis=1)))
            other = self.memory.names[int(owner[k][owner[k] != self.id][0])]
            raise AccessError(
                f"read of shared {self.name}[{int(addr[k])}] by thread {int(local[k])} of block {int(blocks[k])}: "
                f"its bytes were last written through {other} (arena space reused while {self.name} was live)"
            )
        w = self.memory.writer[rows, cells]
        self._fail_if((w != NONE) & (w != local[:, None]), blocks, local, addr, verb="reads", other=w)
        self._note_readers(rows, local[:, None], cells)
        return self.data[blocks, addr]

    def _note_readers(self, rows: Ints, local: Ints, cells: Ints) -> None:
        reader = self.memory.reader
        current = reader[rows, cells]
        wanted = np.where((current == NONE) | (current == local), local, MANY)
        reader[rows, cells] = wanted
        clash = reader[rows, cells] != wanted  # two threads read one element in this access
        reader[np.broadcast_to(rows, clash.shape)[clash], cells[clash]] = MANY

    def _fail_if(
        self, bad: npt.NDArray[np.bool_], blocks: Ints, local: Ints, addr: Ints, *, verb: str, other: Ints
    ) -> None:
        if bad.any():
            k = int(np.argmax(bad.any(axis=1)))
            who_id = int(other[k][bad[k]][0])
            who = "several threads" if who_id == MANY else f"thread {who_id}"
            what = "written" if verb == "reads" else "accessed"
            raise AccessError(
                f"shared memory race: thread {int(local[k])} of block {int(blocks[k])} {verb} {self.name}"
                f"[{int(addr[k])}] {what} by {who} since the last __syncthreads"
            )

    def store(self, tids: Ints, addr: Ints, values: Array) -> None:
        blocks, local, rows, cells = self._keys(tids, addr)
        self._check_write(blocks, local, addr, rows, cells, atomic=False)
        self.memory.writer[rows, cells] = local[:, None]
        lost = (self.memory.writer[rows, cells] != local[:, None]).any(axis=1)
        if lost.any():
            a = int(addr[int(np.argmax(lost))])
            raise AccessError(f"write-write race: several threads store {self.name}[{a}] in one step")
        self.data[blocks, addr] = values
        self.memory.owner[rows, cells] = self.id

    def _check_write(self, blocks: Ints, local: Ints, addr: Ints, rows: Ints, cells: Ints, *, atomic: bool) -> None:
        w, r, me = self.memory.writer[rows, cells], self.memory.reader[rows, cells], local[:, None]
        w_ok = (w == NONE) | (w == me) | ((w == ATOMIC) & atomic)
        self._fail_if(~w_ok, blocks, local, addr, verb="writes", other=w)
        self._fail_if((r != NONE) & (r != me), blocks, local, addr, verb="writes", other=r)

    def atomic(
        self, tids: Ints, addr: Ints, values: Array, ufunc: np.ufunc, fit: Callable[[Array], Array] | None = None
    ) -> None:
        blocks, local, rows, cells = self._keys(tids, addr)
        if (self.memory.owner[rows, cells] != self.id).any():
            raise AccessError(f"atomic update of uninitialised shared {self.name} (shared memory is not zeroed)")
        self._check_write(blocks, local, addr, rows, cells, atomic=True)
        apply_atomic(self.data, (blocks, addr), values, ufunc, fit)
        self.memory.writer[rows, cells] = ATOMIC
