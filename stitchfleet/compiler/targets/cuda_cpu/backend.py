"""Launch: kernel IR programs -> rendered CUDA modules (module.py) -> ctypes launches on host arrays.

Input: a program (kernels in launch order), or many programs at once. Output:
`CudaCpuProgram`, called with host arrays by buffer name, returning the output buffers
(flat) as the sim does. Raises `CudaCpuError` for a build failure or a launch the
header's runtime aborted (its message). `compile_many` renders the kernels of many
programs (renamed `p<i>_<name>` so they can share units) into units of a bounded size and
builds the units on a few processes at once: what makes a sweep of hundreds of clusters
cost seconds of g++ per few dozen kernels instead of a second per kernel.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cuda.device_arrays import DeviceArrayError, device_dtype, from_device, to_device
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.module import CudaCpuError, CudaCpuOptions, load_module
from stitchfleet.compiler.targets.sim.interpreter import buffer_layout, verify_program

Array = npt.NDArray[Any]
Loaded = tuple[CudaKernel, ctypes.CDLL]
KERNELS_PER_UNIT = 24  # g++ time grows with the unit; this keeps one unit at a few seconds
BUILD_JOBS = 2

__all__ = ["CudaCpuBackend", "CudaCpuError", "CudaCpuOptions", "CudaCpuProgram"]


def _aligned_zeros(nbytes: int) -> Array:
    """A zeroed byte array whose data is 16-byte aligned (vector accesses assume it, as on a GPU)."""
    raw = np.zeros(nbytes + 16, np.uint8)
    offset = (-raw.ctypes.data) % 16
    view: Array = raw[offset : offset + nbytes]
    return view


class CudaCpuProgram:
    """Compiled kernels of one program; call it with host arrays by buffer name."""

    def __init__(self, loaded: list[Loaded], layout: dict[str, ir.Buffer], options: CudaCpuOptions) -> None:
        self.loaded, self.layout, self.options = loaded, layout, options

    def with_options(self, **changes: Any) -> CudaCpuProgram:
        """The same built code launched another way (`order`, `blocks`, `fill`); build flags stay."""
        return CudaCpuProgram(self.loaded, self.layout, dataclasses.replace(self.options, **changes))

    def _allocate(self, inputs: Mapping[str, Any]) -> dict[str, Array]:
        unknown = sorted(set(inputs) - set(self.layout))
        if unknown:
            raise DeviceArrayError(f"unknown buffer(s) {', '.join(unknown)} (program buffers: {sorted(self.layout)})")
        memory: dict[str, Array] = {}
        for name, buf in self.layout.items():
            memory[name] = _aligned_zeros(max(buf.size * buf.dtype.itemsize, 1))
            if name in inputs:
                data = to_device(buf, inputs[name]).view(np.uint8)
                memory[name][: data.size] = data
            elif buf.role is ir.Role.INPUT:
                raise DeviceArrayError(f"missing input buffer {name!r} ({buf.dtype.value}[{buf.size}])")
        return memory

    def _launch(self, rendered: CudaKernel, library: ctypes.CDLL, memory: dict[str, Array]) -> None:
        for buf in rendered.params:
            if buf.role is ir.Role.SCRATCH:
                memory[buf.name][:] = 0
        counter = _aligned_zeros(4)
        pointers = [memory[buf.name].ctypes.data for buf in rendered.params]
        if rendered.grid_barrier:
            pointers.append(counter.ctypes.data)
        args = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        error = ctypes.create_string_buffer(4096)
        status = getattr(library, f"sf_entry_{rendered.name}")(
            args,
            rendered.launch.grid,
            rendered.launch.block,
            rendered.dynamic_smem_bytes,
            self.options.order,
            self.options.blocks,
            int(self.options.debug),
            self.options.fill,
            counter.ctypes.data,
            error,
            len(error),
        )
        if status != 0:
            raise CudaCpuError(f"kernel {rendered.name}: {error.value.decode(errors='replace')}")

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Array]:
        memory = self._allocate(inputs)
        for rendered, library in self.loaded:
            self._launch(rendered, library, memory)
        out: dict[str, Array] = {}
        for name, buf in sorted(self.layout.items()):
            if buf.role is ir.Role.OUTPUT:
                raw = memory[name][: buf.size * buf.dtype.itemsize].view(device_dtype(buf.dtype)).copy()
                out[name] = from_device(buf, raw)
        return out


def _units(rendered: list[CudaKernel], size: int) -> list[list[CudaKernel]]:
    return [rendered[i : i + size] for i in range(0, len(rendered), size)]


class CudaCpuBackend:
    """The `Backend` that runs the CUDA renderer's text on the CPU."""

    name = "cuda-cpu"

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        debug: bool = False,
        order: int = 0,
        blocks: int = -1,
        fma: bool = True,
        race: bool = False,
    ) -> None:
        if cache_dir is None:
            from stitchfleet import settings

            cache_dir = settings.current().cache_dir
        self.options = CudaCpuOptions(Path(cache_dir), debug=debug, order=order, blocks=blocks, fma=fma, race=race)

    def compile(self, program: Sequence[ir.Kernel]) -> CudaCpuProgram:
        """One program: its kernels in one unit."""
        verify_program(program)
        rendered = [render_kernel(k) for k in program]
        library = load_module(rendered, self.options)
        return CudaCpuProgram([(r, library) for r in rendered], buffer_layout(program), self.options)

    def compile_many(
        self, programs: Sequence[Sequence[ir.Kernel]], *, per_unit: int = KERNELS_PER_UNIT, jobs: int = BUILD_JOBS
    ) -> list[CudaCpuProgram]:
        """Many programs, their kernels renamed apart and packed `per_unit` to a unit, `jobs` builds at once."""
        renamed: list[list[ir.Kernel]] = []
        for i, program in enumerate(programs):
            verify_program(program)
            renamed.append([dataclasses.replace(k, name=f"p{i}_{k.name}") for k in program])
        rendered = [[render_kernel(k) for k in program] for program in renamed]
        units = _units([r for program in rendered for r in program], per_unit)
        with ThreadPoolExecutor(max(1, min(jobs, len(units), os.cpu_count() or 1))) as pool:
            libraries = list(pool.map(lambda unit: load_module(unit, self.options), units))
        where = {r.name: lib for unit, lib in zip(units, libraries, strict=True) for r in unit}
        return [
            CudaCpuProgram([(r, where[r.name]) for r in program], buffer_layout(kernels), self.options)
            for program, kernels in zip(rendered, renamed, strict=True)
        ]
