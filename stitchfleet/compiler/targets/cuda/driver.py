"""The cuda backend: kernel IR -> CUDA C -> cubin (nvcc via pycuda) -> launches with pycuda.

Input: a program (kernels in launch order) and host or device buffers. Output: a
`CudaProgram`: call it with host arrays (like the sim) or `launch` it on device
pointers (the benchmark harness passes torch allocations). The ONLY module of
stitchfleet that imports pycuda, lazily: importing this module needs no GPU, and
using it without pycuda raises `CudaUnavailableError` saying what is missing.

- Compilation: `render_kernel`, then pycuda's nvcc wrapper to a cubin for the
  current device's arch, cached on disk by hash(source, arch, nvcc/pycuda versions)
  with atomic writes (targets/cache.py); pycuda's own cache is off.
- Context: the device's primary context (`pycuda.autoprimaryctx`), the one the CUDA
  runtime, torch and JAX use, so pointers are shared.
- Launch: scratch buffers are zeroed before each kernel that declares them (as in
  the sim); a kernel with a grid barrier gets a counter buffer and is refused when
  its grid exceeds what the device really holds at once with the compiled register
  and shared memory use (it would hang otherwise). Pointers must be 16-byte aligned
  (vector accesses assume it; every CUDA allocator gives 256).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.devices import Device
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cache import ArtifactCache, cache_key
from stitchfleet.compiler.targets.cuda.device_arrays import (
    RESERVED_SMEM_PER_BLOCK,
    DeviceArrayError,
    check_coresident,
    device_dtype,
    from_device,
    resident_blocks,
    to_device,
)
from stitchfleet.compiler.targets.cuda.nvcc import OPTIONS
from stitchfleet.compiler.targets.cuda.render import render_kernel
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.sim.interpreter import buffer_layout, verify_program

ALIGNMENT = 16


class CudaUnavailableError(RuntimeError):
    """pycuda or a CUDA device is missing."""


def _pycuda() -> Any:
    """pycuda.driver with the primary context current; CudaUnavailableError when it cannot be had."""
    try:
        importlib.import_module("pycuda.autoprimaryctx")
        return importlib.import_module("pycuda.driver")
    except ImportError as err:
        raise CudaUnavailableError(
            f"the cuda backend needs pycuda ({err}); install it on a GPU machine: pip install 'stitchfleet[gpu]'"
        ) from err
    except Exception as err:  # pycuda raises its own types when there is no driver or device
        raise CudaUnavailableError(f"no usable CUDA device: {err}") from err


def _device_profile(drv: Any) -> tuple[Device, str, int]:
    """The current device's occupancy limits, its arch (`sm_90`) and the per-block reserved shared memory."""
    dev = drv.Context.get_device()
    attr = drv.device_attribute

    def get(name: str, default: int) -> int:
        return int(dev.get_attribute(getattr(attr, name))) if hasattr(attr, name) else default

    major, minor = dev.compute_capability()
    profile = Device(
        dev.name(),
        get("MULTIPROCESSOR_COUNT", 1),
        get("MAX_THREADS_PER_MULTIPROCESSOR", 2048),
        get("MAX_THREADS_PER_BLOCK", 1024),
        get("MAX_BLOCKS_PER_MULTIPROCESSOR", 16),
        get("MAX_REGISTERS_PER_MULTIPROCESSOR", 65536),
        255,
        get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 48 * 1024),
        get("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", 64 * 1024),
    )
    return profile, f"sm_{major}{minor}", RESERVED_SMEM_PER_BLOCK if major >= 8 else 0


@dataclass(frozen=True)
class _Target:
    """What code is built for and loaded on: the pycuda modules and the current device."""

    drv: Any
    compiler: Any
    arch: str
    versions: dict[str, str]
    device: Device
    reserved_smem: int


@dataclass
class _Loaded:
    rendered: CudaKernel
    function: Any
    counter: Any  # device allocation of the grid barrier counter, or None


class CudaProgram:
    """Compiled kernels of one program, bound to the current device."""

    def __init__(self, drv: Any, loaded: list[_Loaded], layout: dict[str, ir.Buffer]) -> None:
        self.drv, self.loaded, self.layout = drv, loaded, layout

    @property
    def kernel_count(self) -> int:
        return len(self.loaded)

    def allocate(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Device allocations for every buffer: inputs copied, the rest zeroed."""
        unknown = sorted(set(inputs) - set(self.layout))
        if unknown:
            raise DeviceArrayError(f"unknown buffer(s) {', '.join(unknown)} (program buffers: {sorted(self.layout)})")
        memory: dict[str, Any] = {}
        for name, buf in self.layout.items():
            nbytes = max(buf.size * buf.dtype.itemsize, 1)
            memory[name] = self.drv.mem_alloc(nbytes)
            if name in inputs:
                self.drv.memcpy_htod(memory[name], to_device(buf, inputs[name]))
            elif buf.role is ir.Role.INPUT:
                raise DeviceArrayError(f"missing input buffer {name!r} ({buf.dtype.value}[{buf.size}])")
            else:
                self.drv.memset_d8(memory[name], 0, nbytes)
        return memory

    def launch(self, pointers: Mapping[str, int], stream: Any = None) -> None:
        """Launches every kernel in order on device pointers (ints) by buffer name."""
        for item in self.loaded:
            k = item.rendered
            args = []
            for buf in k.params:
                ptr = int(pointers[buf.name])
                if ptr % ALIGNMENT:
                    raise DeviceArrayError(f"buffer {buf.name!r} at {ptr:#x} is not {ALIGNMENT}-byte aligned")
                if buf.role is ir.Role.SCRATCH:
                    self.drv.memset_d8_async(ptr, 0, buf.size * buf.dtype.itemsize, stream)
                args.append(np.uintp(ptr))
            if item.counter is not None:
                args.append(np.uintp(int(item.counter)))
            grid, block = (k.launch.grid, 1), (k.launch.block, 1, 1)
            item.function.prepared_async_call(grid, block, stream, *args, shared_size=k.dynamic_smem_bytes)

    def read(self, memory: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
        """The output buffers copied back to the host (flat)."""
        self.drv.Context.synchronize()
        out: dict[str, npt.NDArray[Any]] = {}
        for name, buf in sorted(self.layout.items()):
            if buf.role is ir.Role.OUTPUT:
                raw = np.empty(buf.size, device_dtype(buf.dtype))
                self.drv.memcpy_dtoh(raw, memory[name])
                out[name] = from_device(buf, raw)
        return out

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
        memory = self.allocate(inputs)
        self.launch({name: int(alloc) for name, alloc in memory.items()})
        return self.read(memory)


class CudaBackend:
    """The `Backend` that runs kernel IR on the current CUDA device."""

    name = "cuda"

    def __init__(self, cache_dir: Path | None = None) -> None:
        if cache_dir is None:
            from stitchfleet import settings

            cache_dir = settings.current().cache_dir / "cubin"
        self.cache = ArtifactCache(cache_dir)
        self._current: _Target | None = None

    def _target(self) -> _Target:
        """The device and toolchain, asked once per backend (`nvcc --version` is a subprocess)."""
        if self._current is None:
            drv = _pycuda()
            compiler = importlib.import_module("pycuda.compiler")
            profile, arch, reserved = _device_profile(drv)
            versions = {"nvcc": str(compiler.get_nvcc_version("nvcc")), "pycuda": str(_pycuda_version())}
            self._current = _Target(drv, compiler, arch, versions, profile, reserved)
        return self._current

    def compile(self, program: Sequence[ir.Kernel]) -> CudaProgram:
        verify_program(program)
        target = self._target()
        return CudaProgram(target.drv, [self._load(target, render_kernel(k)) for k in program], buffer_layout(program))

    def prebuild(self, kernels: Sequence[ir.Kernel], workers: int = 8) -> int:
        """Builds the cubins of `kernels` missing from the cache, `workers` nvcc runs at a time; returns how many.

        A benchmark compiles hundreds of small kernels (per_op); nvcc runs are independent
        subprocesses, so they overlap. `compile` then finds every cubin in the cache.
        """
        target = self._target()
        todo: dict[str, Callable[[], bytes]] = {}
        for kernel in kernels:
            key, build = self._builder(target, render_kernel(kernel))
            if self.cache.get(key) is None:
                todo[key] = build
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(lambda item: self.cache.get_or_build(*item), todo.items()))
        return len(todo)

    @staticmethod
    def _builder(target: _Target, k: CudaKernel) -> tuple[str, Callable[[], bytes]]:
        key = cache_key(k.source, target.arch, target.versions, OPTIONS)
        options = [o for o in OPTIONS if o != "-O3"]
        compile_ = target.compiler.compile
        return key, lambda: bytes(
            compile_(k.source, arch=target.arch, options=options, no_extern_c=True, cache_dir=False)
        )

    def _load(self, target: _Target, k: CudaKernel) -> _Loaded:
        drv = target.drv
        key, build = self._builder(target, k)
        module = drv.module_from_buffer(self.cache.get_or_build(key, build))
        function = module.get_function(k.name)
        function.prepare("P" * (len(k.params) + int(k.grid_barrier)))
        if k.dynamic_smem_bytes > 48 * 1024:
            function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, k.dynamic_smem_bytes)
        counter = None
        if k.grid_barrier:
            smem = int(function.shared_size_bytes) + k.dynamic_smem_bytes
            fits = resident_blocks(target.device, k.launch.block, function.num_regs, smem, target.reserved_smem)
            check_coresident(k.name, k.launch.grid, fits)
            counter = drv.mem_alloc(4)
            drv.memset_d32(counter, 0, 1)
        return _Loaded(k, function, counter)


def _pycuda_version() -> str:
    return str(getattr(importlib.import_module("pycuda"), "VERSION_TEXT", "unknown"))
