"""The sim backend: a numpy interpreter of the kernel IR with CUDA semantics and race checks.

Input: a program (kernels run in order) and named host arrays for its global buffers.
Output: the arrays of every buffer some kernel writes as an output (flat). All threads
of all blocks step through each statement together (state is one vector per variable
over the whole grid); a set of active thread ids stands for divergence masks. It
raises `SimError`, naming kernel and statement, for what a GPU would get wrong
silently: shared/global races, cross-block reads without a grid barrier, out-of-bounds
indices, shuffles from inactive lanes, barriers reached by part of a block or grid,
grid barriers with more blocks than can be co-resident, reads of unset variables.
Global buffers persist between the kernels of a program; scratch is zeroed per launch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from stitchfleet.compiler.evaluate import round_bf16
from stitchfleet.compiler.ir.types import DType, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.kernel.printer import format_stmt
from stitchfleet.compiler.kernel.verify import KernelError, verify
from stitchfleet.compiler.targets.sim import numerics
from stitchfleet.compiler.targets.sim.memory import (
    AccessError,
    Array,
    GlobalBuffer,
    Ints,
    SharedBuffer,
    SharedMemory,
)

_ATOMIC_UFUNC: dict[Op, np.ufunc] = {Op.ADD: np.add, Op.MAXIMUM: np.maximum, Op.MINIMUM: np.minimum}


class SimError(RuntimeError):
    """The program misbehaves (or is invalid); the message names kernel and statement."""


class _Launch:
    """One kernel launch: thread state, memories and the statement interpreter."""

    def __init__(self, kernel: ir.Kernel, memory: dict[str, Array]) -> None:
        self.kernel, self.block, self.grid = kernel, kernel.launch.block, kernel.launch.grid
        self.threads = self.grid * self.block
        self.block_epoch: Ints = np.zeros(self.grid, np.int64)
        self.globals = {
            b.name: GlobalBuffer(
                b.name, memory[b.name], self.block, self.block_epoch, writable=b.role is not ir.Role.INPUT
            )
            for b in kernel.params
        }
        self.shared = self._shared(kernel)
        self.vars: dict[str, Array] = {}
        self.defined: dict[str, Array] = {}

    def _shared(self, kernel: ir.Kernel) -> dict[str, SharedBuffer]:
        """Arrays of their own, and typed views of one byte arena per block."""
        arena = (np.zeros((self.grid, kernel.arena_bytes), np.uint8), SharedMemory(self.grid, kernel.arena_bytes))
        out = {}
        for s in kernel.shared:
            if s.offset is None:
                out[s.name] = SharedBuffer.array(s.name, s.dtype.numpy, s.size, self.grid, self.block)
            else:
                out[s.name] = SharedBuffer.view(
                    s.name, arena, s.dtype.numpy, offset=s.offset, size=s.size, block=self.block
                )
        self.shared_memories = [arena[1], *(b.memory for b in out.values() if b.memory is not arena[1])]
        return out

    def run(self) -> None:
        with np.errstate(all="ignore"):  # inf/nan are data here, as on the GPU
            self._body(self.kernel.body, "body", np.arange(self.threads, dtype=np.int64))

    def _body(self, body: tuple[ir.Stmt, ...], path: str, idx: Ints) -> None:
        for i, stmt in enumerate(body):
            here = f"{path}[{i}]"
            try:
                _STMTS[type(stmt)](self, stmt, here, idx)
            except (AccessError, ArithmeticError) as problem:
                raise SimError(
                    f"kernel {self.kernel.name!r}: statement `{format_stmt(stmt)}` at {here}: {problem}"
                ) from None

    # ---- expressions ---------------------------------------------------------------------

    def eval(self, expr: ir.Expr, idx: Ints) -> Array:
        return _EXPRS[type(expr)](self, expr, idx)

    def _special(self, which: ir.Special, idx: Ints) -> Array:
        if which is ir.Special.BLOCK_IDX:
            return idx // self.block
        if which in (ir.Special.BLOCK_DIM, ir.Special.GRID_DIM):
            return np.full(len(idx), self.block if which is ir.Special.BLOCK_DIM else self.grid, np.int64)
        local = idx % self.block
        if which is ir.Special.LANE:
            return local % ir.WARP_SIZE
        return local // ir.WARP_SIZE if which is ir.Special.WARP else local

    def _var(self, var: ir.Var, idx: Ints) -> Array:
        defined = self.defined.get(var.name)
        if defined is None or not defined[idx].all():
            missing = idx if defined is None else idx[~defined[idx]]
            raise AccessError(f"thread {int(missing[0])} reads variable {var.name!r} before assigning it")
        return self.vars[var.name][idx]

    def _select(self, expr: ir.Select, idx: Ints) -> Array:
        """Like C's `?:`, evaluates only the chosen side per thread (a guarded load stays in bounds)."""
        cond = self.eval(expr.cond, idx).astype(bool)
        out = np.zeros(len(idx), expr.dtype.numpy)
        if cond.any():
            out[cond] = self.eval(expr.a, idx[cond])
        if not cond.all():
            out[~cond] = self.eval(expr.b, idx[~cond])
        return out

    def _memory(self, buf: ir.AnyBuffer) -> GlobalBuffer | SharedBuffer:
        return self.globals[buf.name] if isinstance(buf, ir.Buffer) else self.shared[buf.name]

    def _load(self, expr: ir.Load, idx: Ints) -> Array:
        return self._memory(expr.buffer).load(idx, self.eval(expr.index, idx).astype(np.int64))

    # ---- statements ----------------------------------------------------------------------

    def assign(self, var: ir.Var, idx: Ints, value: Array) -> None:
        if var.name not in self.vars:
            self.vars[var.name] = np.zeros(self.threads, var.dtype.numpy)
            self.defined[var.name] = np.zeros(self.threads, bool)
        self.vars[var.name][idx] = value
        self.defined[var.name][idx] = True

    def _assign(self, stmt: ir.Assign, path: str, idx: Ints) -> None:
        self.assign(stmt.var, idx, self.eval(stmt.value, idx))

    def _store(self, stmt: ir.Store, path: str, idx: Ints) -> None:
        addr = self.eval(stmt.index, idx).astype(np.int64)
        self._memory(stmt.buffer).store(idx, addr, self.eval(stmt.value, idx))

    def _atomic(self, stmt: ir.Atomic, path: str, idx: Ints) -> None:
        addr = self.eval(stmt.index, idx).astype(np.int64)
        # bf16 is kept in float32 here; the target's CAS loop rounds after every update.
        fit = round_bf16 if stmt.buffer.dtype is DType.BF16 else None
        self._memory(stmt.buffer).atomic(idx, addr, self.eval(stmt.value, idx), _ATOMIC_UFUNC[stmt.op], fit)

    def _for(self, stmt: ir.For, path: str, idx: Ints) -> None:
        start, stop, step = (self.eval(e, idx).astype(np.int64) for e in (stmt.start, stmt.stop, stmt.step))
        if (step <= 0).any():
            raise AccessError(f"loop step {int(step[np.argmax(step <= 0)])} is not positive")
        self.assign(stmt.var, idx, start)
        live, current = idx, start
        while True:
            keep = current < stop
            live, stop, step = live[keep], stop[keep], step[keep]
            if len(live) == 0:
                return
            self._body(stmt.body, f"{path}.body", live)
            current = self.vars[stmt.var.name][live] + step
            self.assign(stmt.var, live, current)

    def _if(self, stmt: ir.If, path: str, idx: Ints) -> None:
        cond = self.eval(stmt.cond, idx).astype(bool)
        if cond.any():
            self._body(stmt.then, f"{path}.then", idx[cond])
        if stmt.orelse and not cond.all():
            self._body(stmt.orelse, f"{path}.else", idx[~cond])

    def _sync_threads(self, stmt: ir.SyncThreads, path: str, idx: Ints) -> None:
        counts = np.bincount(idx // self.block, minlength=self.grid)
        partial = (counts > 0) & (counts < self.block)
        if partial.any():
            b = int(np.argmax(partial))
            raise AccessError(f"divergent barrier: only {int(counts[b])} of {self.block} threads of block {b} reach it")
        blocks = np.nonzero(counts)[0]
        self.block_epoch[blocks] += 1
        for memory in self.shared_memories:
            memory.barrier(blocks)

    def _grid_sync(self, stmt: ir.GridSync, path: str, idx: Ints) -> None:
        limit = self.kernel.launch.max_coresident_blocks
        if self.grid > limit:
            raise AccessError(f"grid barrier with {self.grid} blocks but only {limit} can be co-resident: deadlock")
        if len(idx) != self.threads:
            raise AccessError(f"divergent grid barrier: only {len(idx)} of {self.threads} threads reach it")
        for buf in self.globals.values():
            buf.new_epoch()
        self.block_epoch += 1
        everyone = np.arange(self.grid)
        for memory in self.shared_memories:
            memory.barrier(everyone)

    def _shuffle(self, stmt: ir.Shuffle, path: str, idx: Ints) -> None:
        values = np.zeros(self.threads, stmt.var.dtype.numpy)
        values[idx] = self.eval(stmt.value, idx)
        active = np.zeros(self.threads, bool)
        active[idx] = True
        seg_lane = (idx % ir.WARP_SIZE) % stmt.width
        if stmt.mode is ir.ShuffleMode.DOWN:
            src = np.where(seg_lane + stmt.offset < stmt.width, idx + stmt.offset, idx)
        else:
            src = idx - seg_lane + (seg_lane ^ stmt.offset)
        inactive = ~active[src]
        if inactive.any():
            k = int(np.argmax(inactive))
            raise AccessError(
                f"thread {int(idx[k])} shuffles from lane {int(src[k]) % ir.WARP_SIZE}, which is inactive (divergent)"
            )
        self.assign(stmt.var, idx, values[src])

    def _nothing(self, stmt: ir.Stmt, path: str, idx: Ints) -> None:
        """Comments do nothing."""


def _const(launch: _Launch, expr: ir.Const, idx: Ints) -> Array:
    return numerics.fit(np.full(len(idx), expr.value), expr.dtype)


_EXPRS: dict[type, Callable[[_Launch, Any, Ints], Array]] = {
    ir.Const: _const,
    ir.SpecialIndex: lambda s, e, idx: s._special(e.which, idx),
    ir.Var: lambda s, e, idx: s._var(e, idx),
    ir.Unary: lambda s, e, idx: numerics.unary(e.op, s.eval(e.x, idx), e.dtype),
    ir.Binary: lambda s, e, idx: numerics.binary(e.op, s.eval(e.a, idx), s.eval(e.b, idx), e.dtype),
    ir.Select: lambda s, e, idx: s._select(e, idx),
    ir.Cast: lambda s, e, idx: numerics.cast(s.eval(e.x, idx), e.dtype),
    ir.Load: lambda s, e, idx: s._load(e, idx),
}
_STMTS: dict[type, Callable[[_Launch, Any, str, Ints], None]] = {
    ir.Assign: _Launch._assign,
    ir.Store: _Launch._store,
    ir.Atomic: _Launch._atomic,
    ir.For: _Launch._for,
    ir.If: _Launch._if,
    ir.SyncThreads: _Launch._sync_threads,
    ir.GridSync: _Launch._grid_sync,
    ir.Shuffle: _Launch._shuffle,
    ir.Comment: _Launch._nothing,
}


# ---- programs ------------------------------------------------------------------------------


def buffer_layout(kernels: Sequence[ir.Kernel]) -> dict[str, ir.Buffer]:
    """Each global buffer of the program by name (its first declaration); SimError on disagreement."""
    layout: dict[str, ir.Buffer] = {}
    for kernel in kernels:
        for buf in kernel.params:
            first = layout.setdefault(buf.name, buf)
            if (first.dtype, first.size) != (buf.dtype, buf.size):
                raise SimError(
                    f"kernel {kernel.name!r}: buffer {buf.name!r} is {buf.dtype.value}[{buf.size}] but an earlier "
                    f"kernel declares it {first.dtype.value}[{first.size}]"
                )
    return layout


def _initial_memory(layout: dict[str, ir.Buffer], given: Mapping[str, Any]) -> dict[str, Array]:
    unknown = sorted(set(given) - set(layout))
    if unknown:
        raise SimError(f"unknown buffer(s) {', '.join(unknown)} (program buffers: {', '.join(sorted(layout))})")
    memory: dict[str, Array] = {}
    for name, buf in layout.items():
        if name in given:
            memory[name] = _host_array(buf, given[name])
        elif buf.role is ir.Role.INPUT:
            raise SimError(f"missing input buffer {name!r} ({buf.dtype.value}[{buf.size}])")
        else:
            memory[name] = np.zeros(buf.size, buf.dtype.numpy)
    return memory


def _host_array(buf: ir.Buffer, value: Any) -> Array:
    array = np.asarray(value)
    if array.dtype != buf.dtype.numpy or array.size != buf.size:
        raise SimError(
            f"buffer {buf.name!r}: got {array.dtype}{list(array.shape)}, "
            f"expected {buf.dtype.numpy} with {buf.size} elements"
        )
    return numerics.fit(array.reshape(-1).copy(), buf.dtype)


def verify_program(kernels: Sequence[ir.Kernel]) -> None:
    """Verifies every kernel and the agreement of their buffers; SimError otherwise."""
    for kernel in kernels:
        try:
            verify(kernel)
        except KernelError as invalid:
            raise SimError(f"invalid kernel: {invalid}") from invalid
    buffer_layout(kernels)


def run(kernels: Sequence[ir.Kernel], buffers: Mapping[str, Any], *, check: bool = True) -> dict[str, Array]:
    """Runs the kernels in order; returns every buffer some kernel declares as an output (flat)."""
    if check:
        verify_program(kernels)
    layout = buffer_layout(kernels)
    memory = _initial_memory(layout, buffers)
    for kernel in kernels:
        for buf in kernel.params:
            if buf.role is ir.Role.SCRATCH:
                memory[buf.name] = np.zeros(buf.size, buf.dtype.numpy)
        _Launch(kernel, memory).run()
    outputs = {b.name for k in kernels for b in k.params if b.role is ir.Role.OUTPUT}
    return {name: memory[name] for name in sorted(outputs)}


class SimExecutable:
    """A verified program bound to the sim; call it with the input buffers."""

    def __init__(self, kernels: Sequence[ir.Kernel]) -> None:
        self.kernels = tuple(kernels)

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Array]:
        return run(self.kernels, inputs, check=False)


class SimBackend:
    """The `Backend` that runs kernel IR in numpy (exact, slow, CI-friendly)."""

    name = "sim"

    def compile(self, program: Sequence[ir.Kernel]) -> SimExecutable:
        verify_program(program)
        return SimExecutable(program)
