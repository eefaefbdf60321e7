"""Build and launch: rendered CUDA text -> g++ shared object (cached) -> ctypes launches.

Input: a program (kernels in launch order). Output: `CudaCpuProgram`, called with host
arrays by buffer name, returning the output buffers (flat) as the sim does. Raises
`CudaCpuError` for a build failure or a launch the header's runtime aborted (its message).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# The one place this backend names the renderer and the shared runtime helpers.
from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.render.cuda import CudaKernel, render_kernel
from stitchfleet.compiler.runtime.cpu import CpuCompileError, compiler_version
from stitchfleet.compiler.runtime.cubin_cache import CubinCache, cache_key
from stitchfleet.compiler.runtime.device_arrays import DeviceArrayError, device_dtype, from_device, to_device
from stitchfleet.compiler.runtime.native_build import BuildError, build_shared_object
from stitchfleet.compiler.runtime.sim import buffer_layout, verify_program
from stitchfleet.compiler.targets.cuda_cpu.header import HEADER, LAUNCHER

Array = npt.NDArray[Any]

SMEM_CAPACITY = 227 * 1024  # the largest opt-in dynamic shared memory of the profiles (H100/H200)
STACK_BYTES = 64 * 1024
COMPILE_TIMEOUT_S = 300.0
BASE_FLAGS = ("-std=gnu++17", "-O1", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing")
DEBUG_FLAGS = ("-fsanitize=alignment", "-fno-sanitize-recover=alignment")
FMA_FLAGS = ("-ffp-contract=fast", "-mfma")
_STUB_HEADERS = ("cuda_fp16.h", "cuda_bf16.h")  # their content is in HEADER


class CudaCpuError(RuntimeError):
    """The kernel did not build, or its run was aborted (deadlock, a debug check)."""


@dataclass(frozen=True)
class CudaCpuOptions:
    cache_dir: Path
    debug: bool = False
    reverse: bool = False
    fma: bool = False
    compiler: str = "g++"

    @property
    def flags(self) -> tuple[str, ...]:
        extra = (DEBUG_FLAGS if self.debug else ()) + (FMA_FLAGS if self.fma else ())
        return (*BASE_FLAGS, *extra, f"-DSF_SMEM_CAPACITY={SMEM_CAPACITY}", f"-DSF_STACK_BYTES={STACK_BYTES}")


def translation_unit(rendered: CudaKernel) -> str:
    """HEADER, the renderer's text unchanged, the launcher and a typed entry point."""
    args = [f"sf_ptr{{a[{i}]}}" for i in range(len(rendered.params) + (1 if rendered.grid_barrier else 0))]
    entry = (
        f"static void sf_entry_body(void** a) {{ {rendered.name}({', '.join(args)}); }}\n"
        'extern "C" int sf_entry(void** a, unsigned grid, unsigned block, size_t smem, int reverse, int debug,\n'
        "                        unsigned* counter, char* error, size_t error_size) {\n"
        f"  return sf_launch_kernel(sf_entry_body, a, grid, block, smem, {int(rendered.grid_barrier)}, reverse, debug,"
        " counter, error, error_size);\n}\n"
    )
    return f'{HEADER}\n#line 1 "{rendered.name}.cu"\n{rendered.source}\n{LAUNCHER}\n{entry}'


def _build(text: str, options: CudaCpuOptions) -> bytes:
    def command(source: Path, output: Path) -> list[str]:
        for name in _STUB_HEADERS:
            (source.parent / name).write_text("// provided by the cuda-cpu header\n")
        return [
            "nice",
            "-n",
            "10",
            options.compiler,
            *options.flags,
            "-I",
            str(source.parent),
            str(source),
            "-o",
            str(output),
        ]

    try:
        return build_shared_object(text, "kernel.cpp", command, COMPILE_TIMEOUT_S)
    except BuildError as err:
        raise CudaCpuError(str(err)) from None


_LOADED: dict[Path, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def _compiler_version(compiler: str) -> str:
    try:
        return compiler_version(compiler)  # the cpu backend's, cached per process
    except CpuCompileError as err:
        raise CudaCpuError(f"C++ compiler {compiler!r} is not usable: {err}") from None


def load_kernel(rendered: CudaKernel, options: CudaCpuOptions) -> ctypes.CDLL:
    """The kernel's shared object, built on a cache miss (key: sha256 of the whole unit and flags)."""
    text = translation_unit(rendered)
    cache = CubinCache(Path(options.cache_dir) / "cuda-cpu", suffix="so")
    key = cache_key(
        text, hashlib.sha256(b"x86-64").hexdigest(), {"cxx": _compiler_version(options.compiler)}, options.flags
    )
    path = cache.path(key) if cache.get(key) is not None else cache.put(key, _build(text, options))
    with _LOCK:
        if path not in _LOADED:
            library = ctypes.CDLL(str(path))
            library.sf_entry.restype = ctypes.c_int
            library.sf_entry.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_size_t,
            ]
            _LOADED[path] = library
        return _LOADED[path]


def _aligned_zeros(nbytes: int) -> Array:
    """A zeroed byte array whose data is 16-byte aligned (vector accesses assume it, as on a GPU)."""
    raw = np.zeros(nbytes + 16, np.uint8)
    offset = (-raw.ctypes.data) % 16
    view: Array = raw[offset : offset + nbytes]
    return view


class CudaCpuProgram:
    """Compiled kernels of one program; call it with host arrays by buffer name."""

    def __init__(
        self, loaded: list[tuple[CudaKernel, ctypes.CDLL]], layout: dict[str, ir.Buffer], options: CudaCpuOptions
    ) -> None:
        self.loaded, self.layout, self.options = loaded, layout, options

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
        status = library.sf_entry(
            args,
            rendered.launch.grid,
            rendered.launch.block,
            rendered.dynamic_smem_bytes,
            int(self.options.reverse),
            int(self.options.debug),
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


class CudaCpuBackend:
    """The `Backend` that runs the CUDA renderer's text on the CPU."""

    name = "cuda-cpu"

    def __init__(
        self, cache_dir: Path | None = None, *, debug: bool = False, reverse: bool = False, fma: bool = False
    ) -> None:
        if cache_dir is None:
            from stitchfleet import settings

            cache_dir = settings.current().cache_dir
        self.options = CudaCpuOptions(Path(cache_dir), debug=debug, reverse=reverse, fma=fma)

    def compile(self, program: Sequence[ir.Kernel]) -> CudaCpuProgram:
        verify_program(program)
        loaded = []
        for kernel in program:
            rendered = render_kernel(kernel)
            loaded.append((rendered, load_kernel(rendered, self.options)))
        return CudaCpuProgram(loaded, buffer_layout(program), self.options)


def threads_hint() -> int:
    """OS threads a non-grid-barrier launch uses (the header's pool)."""
    return min(2, os.cpu_count() or 1)
