"""Global and shared memory of the sim, with the race and bounds checks a GPU would not do.

Input: vectorised accesses (global thread ids, element indices, values) from the
interpreter. Output: loaded values, updated memory, or an `AccessError` saying what
went wrong and for which thread. Tracking, per element, since the last barrier:
- global: the last plain writer (or ATOMIC) and its block's barrier count at the
  write, and for writable buffers the readers likewise; reset by a grid barrier. A
  read or write of an element another block wrote (or, for a write, read) in this
  grid epoch is a race; so is one by another thread of the same block with no
  `__syncthreads` between.
- shared (per block): whether the element was ever written, its writer and its
  readers since the last `__syncthreads` (read-after-write, write-after-read and
  write-after-write between different threads are races).
"""

from __future__ import annotations

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

    def atomic(self, tids: Ints, addr: Ints, values: Array, ufunc: np.ufunc) -> None:
        check_bounds(self.name, self.data.size, tids, addr)
        if self.dirty:
            bad = self._unordered(tids, addr) & (self.writer[addr] != ATOMIC)
            if bad.any():
                self._raise_conflict(tids, addr, bad, "atomic update")
        self._check_war(tids, addr)
        ufunc.at(self.data, addr, values)
        self.writer[addr] = ATOMIC
        self.dirty = True


class SharedBuffer:
    """One `__shared__` array per block, with per-element init, writer and reader records."""

    def __init__(self, name: str, dtype: np.dtype[Any], size: int, grid: int, block: int) -> None:
        self.name, self.size, self.block = name, size, block
        self.data = np.zeros((grid, size), dtype)
        self.init = np.zeros((grid, size), bool)
        self.writer = np.full((grid, size), NONE, np.int64)
        self.reader = np.full((grid, size), NONE, np.int64)

    def barrier(self, blocks: Ints) -> None:
        self.writer[blocks] = NONE
        self.reader[blocks] = NONE

    def _keys(self, tids: Ints, addr: Ints) -> tuple[Ints, Ints]:
        check_bounds(self.name, self.size, tids, addr)
        return tids // self.block, tids % self.block

    def load(self, tids: Ints, addr: Ints) -> Array:
        blocks, local = self._keys(tids, addr)
        if not self.init[blocks, addr].all():
            k = int(np.argmax(~self.init[blocks, addr]))
            raise AccessError(
                f"read of uninitialised shared {self.name}[{int(addr[k])}] by thread {int(local[k])} of block "
                f"{int(blocks[k])} (no thread wrote it before this read; missing write or barrier)"
            )
        w = self.writer[blocks, addr]
        self._fail_if((w != NONE) & (w != local), blocks, local, addr, verb="reads", other=w)
        self._note_readers(blocks, local, addr)
        return self.data[blocks, addr]

    def _note_readers(self, blocks: Ints, local: Ints, addr: Ints) -> None:
        current = self.reader[blocks, addr]
        wanted = np.where((current == NONE) | (current == local), local, MANY)
        self.reader[blocks, addr] = wanted
        clash = self.reader[blocks, addr] != wanted  # two threads read one element in this access
        self.reader[blocks[clash], addr[clash]] = MANY

    def _fail_if(
        self, bad: npt.NDArray[np.bool_], blocks: Ints, local: Ints, addr: Ints, *, verb: str, other: Ints
    ) -> None:
        if bad.any():
            k = int(np.argmax(bad))
            who = "several threads" if other[k] == MANY else f"thread {int(other[k])}"
            what = "written" if verb == "reads" else "accessed"
            raise AccessError(
                f"shared memory race: thread {int(local[k])} of block {int(blocks[k])} {verb} {self.name}"
                f"[{int(addr[k])}] {what} by {who} since the last __syncthreads"
            )

    def store(self, tids: Ints, addr: Ints, values: Array) -> None:
        blocks, local = self._keys(tids, addr)
        self._check_write(blocks, local, addr, atomic=False)
        self.writer[blocks, addr] = local
        raise_if_duplicate(self.name, self.writer[blocks, addr], local, addr)
        self.data[blocks, addr] = values
        self.init[blocks, addr] = True

    def _check_write(self, blocks: Ints, local: Ints, addr: Ints, atomic: bool) -> None:
        w, r = self.writer[blocks, addr], self.reader[blocks, addr]
        w_ok = (w == NONE) | (w == local) | ((w == ATOMIC) & atomic)
        self._fail_if(~w_ok, blocks, local, addr, verb="writes", other=w)
        self._fail_if((r != NONE) & (r != local), blocks, local, addr, verb="writes", other=r)

    def atomic(self, tids: Ints, addr: Ints, values: Array, ufunc: np.ufunc) -> None:
        blocks, local = self._keys(tids, addr)
        if not self.init[blocks, addr].all():
            raise AccessError(f"atomic update of uninitialised shared {self.name} (shared memory is not zeroed)")
        self._check_write(blocks, local, addr, atomic=True)
        ufunc.at(self.data, (blocks, addr), values)
        self.writer[blocks, addr] = ATOMIC
        self.init[blocks, addr] = True
