"""A cluster's kernels as one launchable program: the spec the launch library and the TF GPU op run.

Input: a cluster graph and its lowering (`Lowered`: kernels in launch order, parameter and output
buffers). Output: `LaunchPlan`: the module source (the rendered kernels, whose stores into floating
op outputs note NaN/Inf in the cluster's flag, and the blame kernels; one NVRTC compile), the kernel
names, the per-launch scratch size and the flat int64 `spec` that `csrc/launch.c` documents. Op
inputs are the graph's parameters in order, op outputs its outputs in order (the native bridge's
positional contract); every other buffer (scratch, partials, values handed from one kernel to the
next) lives at a 256-byte aligned offset in one scratch allocation per launch, so two steps in
flight never share one. Pure data: no GPU, no TF.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from stitchfleet.compiler.ir import DType, Graph, Op
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.targets.cuda.launch_source import CHECKS
from stitchfleet.compiler.targets.cuda.render import module_text, render_program
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.sim.interpreter import buffer_layout

SPEC_VERSION = 1
INPUT, OUTPUT, SCRATCH = 0, 1, 2
SCRATCH_ALIGNMENT = 256  # what CUDA allocators give; vector accesses need 16
CHECKED = {DType.F32: 0, DType.F16: 1, DType.BF16: 2, DType.F64: 3}  # dtype codes of sf_blame_<dtype>


class LaunchPlanError(ValueError):
    """The lowering cannot be described as one program (a buffer the op cannot provide)."""


@dataclass(frozen=True)
class LaunchPlan:
    """One cluster's program: `source` compiles to the module holding `names` and the checks."""

    kernels: tuple[CudaKernel, ...]
    source: str
    spec: tuple[int, ...]
    scratch_bytes: int
    inputs: tuple[str, ...]  # graph parameter names: the op's inputs in order
    outputs: tuple[str, ...]  # graph output names: the op's outputs in order
    passthrough: tuple[int, ...]  # per output, the input it forwards unchanged, or -1
    repeats: tuple[int, ...]  # per output, the earlier output whose buffer it shares (its value, stored once), or -1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.kernels)


def _aligned(offset: int) -> int:
    return -(-offset // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT


def _walk(body: Iterable[ir.Stmt]) -> Iterator[ir.Stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ir.For):
            yield from _walk(stmt.body)
        elif isinstance(stmt, ir.If):
            yield from _walk(stmt.then)
            yield from _walk(stmt.orelse)


def atomic_targets(kernel: ir.Kernel) -> set[str]:
    """Global buffers the kernel combines into atomically: they must start at zero (the identity of ADD)."""
    return {s.buffer.name for s in _walk(kernel.body) if isinstance(s, ir.Atomic) and isinstance(s.buffer, ir.Buffer)}


def _positions(graph: Graph, lowered: Lowered) -> tuple[dict[str, int], dict[str, int], tuple[int, ...]]:
    """Buffer name -> op input position, buffer name -> op output position, and passed-through outputs."""
    order = {str(p.attrs["name"]): i for i, p in enumerate(graph.parameters)}
    inputs = {buffer: order[param] for param, buffer in lowered.inputs}
    outputs: dict[str, int] = {}
    for j, (_, buffer) in enumerate(lowered.outputs):
        outputs.setdefault(buffer, j)  # a repeated output names its source's buffer: the source's position
    passthrough = tuple(
        order[str(graph.node(node).attrs["name"])] if graph.node(node).op is Op.PARAMETER else -1
        for _, node in graph.outputs
    )
    return inputs, outputs, passthrough


def _scratch_layout(layout: dict[str, ir.Buffer], provided: set[str]) -> tuple[dict[str, int], int]:
    """Offsets of the buffers the op does not provide, then the end (the counter goes there)."""
    offsets: dict[str, int] = {}
    end = 0
    for name, buf in sorted(layout.items()):
        if name in provided:
            continue
        offsets[name] = end
        end = _aligned(end + max(buf.size * buf.dtype.itemsize, 1))
    return offsets, end


def plan_launches(graph: Graph, lowered: Lowered) -> LaunchPlan:
    """The program of one lowered cluster (see the module docstring)."""
    layout = buffer_layout(lowered.kernels)
    inputs, outputs, passthrough = _positions(graph, lowered)
    for buffer, j in outputs.items():
        if passthrough[j] >= 0 and buffer in layout:
            raise LaunchPlanError(f"output {lowered.outputs[j][0]} is a parameter yet a kernel writes {buffer}")
    offsets, end = _scratch_layout(layout, set(inputs) | set(outputs))
    barrier = any(_has_grid_sync(k) for k in lowered.kernels)
    counter = end if barrier else -1
    scratch_bytes = end + SCRATCH_ALIGNMENT if barrier else end
    spec: list[int] = [SPEC_VERSION, len(graph.parameters), len(graph.outputs), scratch_bytes, counter]
    spec.append(len(lowered.kernels))
    zeroed: set[str] = set()
    checks = [
        (j, graph.node(node).dtype, math.prod(graph.node(node).shape)) for j, (_, node) in enumerate(graph.outputs)
    ]
    repeats = lowered.repeats  # a repeat's check is its source's
    checks = [(j, d, size) for j, d, size in checks if d in CHECKED and passthrough[j] < 0 and repeats[j] < 0]
    noted = frozenset(buffer for j, (_, buffer) in enumerate(lowered.outputs) if j in {c[0] for c in checks})
    rendered = render_program(lowered.kernels, noted)
    for kernel, cuda in zip(lowered.kernels, rendered, strict=True):
        spec += [cuda.launch.grid, cuda.launch.block, cuda.dynamic_smem_bytes, int(cuda.grid_barrier)]
        spec.append(len(cuda.params))
        for buf in cuda.params:
            spec += _param(buf.name, inputs, outputs, offsets)
        # Scratch starts at zero for every kernel declaring it (as the sim and the pycuda backend run it);
        # atomically combined targets once, before their first kernel.
        zero = {b.name for b in cuda.params if b.role is ir.Role.SCRATCH} | (atomic_targets(kernel) - zeroed)
        zeroed |= zero
        ranges = _zero_ranges(zero, layout, offsets, outputs)
        spec.append(len(ranges))
        for offset, size in ranges:
            spec += [offset, size]
    spec.append(len(checks))
    for j, dtype, size in checks:
        spec += [j, size, CHECKED[dtype]]
    return LaunchPlan(
        rendered,
        module_text(rendered) + CHECKS,
        tuple(spec),
        scratch_bytes,
        tuple(str(p.attrs["name"]) for p in graph.parameters),
        tuple(name for name, _ in graph.outputs),
        passthrough,
        repeats,
    )


def _has_grid_sync(kernel: ir.Kernel) -> bool:
    return any(isinstance(s, ir.GridSync) for s in _walk(kernel.body))


def _param(name: str, inputs: dict[str, int], outputs: dict[str, int], offsets: dict[str, int]) -> list[int]:
    if name in inputs:
        return [INPUT, inputs[name]]
    if name in outputs:
        return [OUTPUT, outputs[name]]
    return [SCRATCH, offsets[name]]


def _zero_ranges(
    names: set[str], layout: dict[str, ir.Buffer], offsets: dict[str, int], outputs: dict[str, int]
) -> list[tuple[int, int]]:
    """Scratch byte ranges to clear; an op output that must start at zero is refused (TF's allocator
    hands it uninitialised and the spec can clear scratch only)."""
    ranges = []
    for name in sorted(names):
        if name in outputs:
            raise LaunchPlanError(f"output buffer {name} is combined atomically: it would need zeroing by the op")
        buf = layout[name]
        ranges.append((offsets[name], max(buf.size * buf.dtype.itemsize, 1)))
    return ranges
