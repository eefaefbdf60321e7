"""The launch library from Python: build the C source, load it with ctypes, pack a kernel's arguments.

Input: `launch_source.SOURCE`, a C compiler, the CUDA driver header (`cuda.h` from the
`nvidia-cuda-runtime-cu12` wheel or a toolkit); then cubins (NVRTC's, nvcc's) and device
pointers and a stream handle (ints, from pycuda, torch or TF). Output: `LaunchLibrary` with
`init`, `device`, `load`, `function`, `occupancy`, `launch` and, for a whole cluster, `program` (a
`LaunchPlan` loaded once, run per step on a stream, as the TF GPU op does), each raising `LaunchError` with the
driver call that failed and its message. `pack_arguments` is the launch contract of a rendered
kernel (its buffers in parameter order, then the grid barrier's counter) and runs on any machine.
The built library is cached by hash of its source, compiler and header folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stitchfleet.compiler.kernel import ir
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.launch_plan import LaunchPlan
from stitchfleet.compiler.targets.cuda.launch_source import SOURCE
from stitchfleet.compiler.targets.cuda.nvrtc import include_dirs
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.native_build import build_shared_object

ALIGNMENT = 16
BUILD_TIMEOUT_S = 120


class LaunchError(RuntimeError):
    """The launch library cannot be built or loaded, or a driver call it made failed."""


@dataclass(frozen=True)
class DeviceInfo:
    """The current context's device as the driver reports it."""

    sms: int
    arch: str
    cooperative: bool


@dataclass(frozen=True)
class Function:
    """A loaded kernel with its compiled resource use."""

    handle: int
    name: str
    registers: int
    static_smem: int


def header_dir() -> Path:
    """A folder with the driver API's cuda.h; LaunchError naming where it looked when none has it."""
    for folder in include_dirs():
        if (folder / "cuda.h").is_file():
            return folder
    raise LaunchError("no cuda.h: install nvidia-cuda-runtime-cu12 (the dev extra) or a CUDA toolkit")


def build(cache: ArtifactCache, compiler: str = "cc") -> Path:
    """The built library's path in `cache` (suffix so), compiled on a miss."""
    if shutil.which(compiler) is None:
        raise LaunchError(f"no C compiler {compiler!r} on PATH to build the launch library")
    include = header_dir()
    key = hashlib.sha256(f"{SOURCE}\0{compiler}\0{include}".encode()).hexdigest()

    def command(source: Path, output: Path) -> list[str]:
        return [compiler, "-O2", "-shared", "-fPIC", "-std=gnu99", f"-I{include}", str(source), "-o", str(output)]

    cache.get_or_build(key, lambda: build_shared_object(SOURCE, "launch.c", command, BUILD_TIMEOUT_S))
    return cache.path(key)


def pack_arguments(kernel: CudaKernel, pointers: Mapping[str, int], counter: int = 0) -> list[int]:
    """The kernel's arguments in parameter order: each buffer's device pointer, then the barrier counter.

    Checks what a GPU would not: a missing buffer, a null one (refused alike by the C packer: a
    zero-size tensor never reaches a kernel, whose buffers have an element each, so a cluster with one
    gets no launch plan and stays with TF), a pointer not 16-byte aligned (vector accesses
    assume it), a grid barrier without a counter or a counter for a kernel without one.
    """
    missing = [buf.name for buf in kernel.params if buf.name not in pointers]
    if missing:
        raise LaunchError(f"kernel {kernel.name}: no pointer for buffer(s) {', '.join(missing)}")
    values = [int(pointers[buf.name]) for buf in kernel.params]
    for buf, value in zip(kernel.params, values, strict=True):
        if value == 0:  # as csrc/launch.c's sf_pack: every kernel buffer has an element (kernel/verify.py)
            raise LaunchError(f"kernel {kernel.name}: buffer {buf.name} is a null buffer")
        if value % ALIGNMENT:
            raise LaunchError(f"kernel {kernel.name}: buffer {buf.name} at {value:#x} is not {ALIGNMENT}-byte aligned")
    if kernel.grid_barrier and not counter:
        raise LaunchError(f"kernel {kernel.name} has a grid barrier: it needs a counter (4 bytes of scratch)")
    if counter and not kernel.grid_barrier:
        raise LaunchError(f"kernel {kernel.name} has no grid barrier: it takes no counter")
    return [*values, counter] if kernel.grid_barrier else values


def scratch_bytes(kernel: CudaKernel) -> int:
    """Bytes of per-launch scratch a kernel's caller allocates: its SCRATCH buffers and the counter."""
    buffers = sum(buf.size * buf.dtype.itemsize for buf in kernel.params if buf.role is ir.Role.SCRATCH)
    return buffers + (4 if kernel.grid_barrier else 0)


class LaunchLibrary:
    """The loaded C library; call `init` once before the driver calls."""

    def __init__(self, path: Path) -> None:
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise LaunchError(f"cannot load the launch library {path}: {err}") from None
        self._declare()

    def _declare(self) -> None:
        lib, c_int_p = self.lib, ctypes.POINTER(ctypes.c_int)
        lib.sf_last_error.restype = ctypes.c_char_p
        lib.sf_device_info.argtypes = [c_int_p, c_int_p, c_int_p, c_int_p]
        lib.sf_module_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.sf_module_unload.argtypes = [ctypes.c_void_p]
        lib.sf_function.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
        lib.sf_function.argtypes += [c_int_p, c_int_p]
        lib.sf_occupancy.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, c_int_p]
        lib.sf_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        lib.sf_launch.argtypes += [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64]
        lib.sf_coresident_grid.restype = ctypes.c_longlong
        lib.sf_coresident_grid.argtypes = [ctypes.c_int, ctypes.c_int]
        spec, pointers = ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_void_p)
        lib.sf_spec_check.argtypes = [spec, ctypes.c_longlong]
        lib.sf_pack.argtypes = [spec, ctypes.c_longlong, ctypes.c_int, pointers, pointers, ctypes.c_uint64]
        lib.sf_pack.argtypes += [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int, c_int_p]
        lib.sf_program_create.argtypes = [ctypes.c_char_p, spec, ctypes.c_longlong, ctypes.POINTER(ctypes.c_char_p)]
        lib.sf_program_create.argtypes += [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.sf_program_run.argtypes = [ctypes.c_void_p, pointers, pointers, ctypes.c_uint64, ctypes.c_void_p]
        lib.sf_program_flags.restype = ctypes.POINTER(ctypes.c_int)
        lib.sf_program_flags.argtypes = [ctypes.c_void_p]
        lib.sf_program_blame.argtypes = [ctypes.c_void_p, pointers, pointers, ctypes.c_void_p]
        lib.sf_program_destroy.argtypes = [ctypes.c_void_p]
        lib.sf_primary_enter.argtypes = [ctypes.c_int]
        lib.sf_primary_leave.argtypes = [ctypes.c_int]

    def _check(self, status: int) -> None:
        if status != 0:
            raise LaunchError((self.lib.sf_last_error() or b"unknown error").decode(errors="replace"))

    def init(self) -> None:
        """Opens the CUDA driver (libcuda.so.1); LaunchError saying so on a machine without one."""
        self._check(self.lib.sf_init())

    def device(self) -> DeviceInfo:
        sms, major, minor, cooperative = (ctypes.c_int() for _ in range(4))
        self._check(self.lib.sf_device_info(*(ctypes.byref(v) for v in (sms, major, minor, cooperative))))
        return DeviceInfo(sms.value, f"sm_{major.value}{minor.value}", bool(cooperative.value))

    def load(self, cubin: bytes) -> int:
        """A module handle for `cubin` in the current context."""
        module = ctypes.c_void_p()
        self._check(self.lib.sf_module_load(cubin, ctypes.byref(module)))
        return int(module.value or 0)

    def unload(self, module: int) -> None:
        self._check(self.lib.sf_module_unload(module))

    def function(self, module: int, kernel: CudaKernel) -> Function:
        handle, registers, static = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
        refs = (ctypes.byref(handle), ctypes.byref(registers), ctypes.byref(static))
        self._check(self.lib.sf_function(module, kernel.name.encode(), kernel.dynamic_smem_bytes, *refs))
        return Function(int(handle.value or 0), kernel.name, registers.value, static.value)

    def occupancy(self, function: Function, kernel: CudaKernel) -> int:
        """Blocks of `kernel` one SM holds at once, from the compiled function's real resource use."""
        blocks = ctypes.c_int()
        self._check(
            self.lib.sf_occupancy(function.handle, kernel.launch.block, kernel.dynamic_smem_bytes, ctypes.byref(blocks))
        )
        return blocks.value

    def coresident_grid(self, blocks_per_sm: int, sms: int) -> int:
        return int(self.lib.sf_coresident_grid(blocks_per_sm, sms))

    def check_spec(self, spec: Sequence[int]) -> None:
        """LaunchError with the first field the C side rejects (no driver needed)."""
        self._check(self.lib.sf_spec_check(_longs(spec), len(spec)))

    def pack(
        self, spec: Sequence[int], kernel: int, inputs: Sequence[int], outputs: Sequence[int], scratch: int
    ) -> list[int]:
        """Kernel `kernel`'s argument values as the C runner packs them (no driver needed)."""
        values, count = (ctypes.c_uint64 * 256)(), ctypes.c_int()
        args = (_longs(spec), len(spec), kernel, _pointers(inputs), _pointers(outputs), scratch, values, 256)
        self._check(self.lib.sf_pack(*args, ctypes.byref(count)))
        return list(values[: count.value])

    def program(self, image: bytes, plan: LaunchPlan, stream: int = 0) -> Program:
        """The plan's module loaded in the context of `stream`, co-residency checked (LaunchError if not)."""
        handle = ctypes.c_void_p()
        names = (ctypes.c_char_p * len(plan.names))(*(name.encode() for name in plan.names))
        args = (image, _longs(plan.spec), len(plan.spec), names, stream, ctypes.byref(handle))
        self._check(self.lib.sf_program_create(*args))
        return Program(self, int(handle.value or 0), plan)

    @contextlib.contextmanager
    def primary(self, ordinal: int = 0) -> Iterator[None]:
        """The device's primary context current for the calls inside (occupancy at plan time, in a thread
        that has no context of its own)."""
        self._check(self.lib.sf_primary_enter(ordinal))
        try:
            yield
        finally:
            self._check(self.lib.sf_primary_leave(ordinal))

    def launch(self, function: Function, kernel: CudaKernel, arguments: list[int], stream: int = 0) -> None:
        """One launch of `kernel` on `stream` (0: the legacy default stream), cooperative with a grid barrier."""
        values = [ctypes.c_uint64(value) for value in arguments]
        array = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values))
        counter = arguments[-1] if kernel.grid_barrier else 0
        launch = kernel.launch
        self._check(
            self.lib.sf_launch(
                function.handle, launch.grid, launch.block, kernel.dynamic_smem_bytes, stream, array, counter
            )
        )


class Program:
    """A loaded cluster program (`LaunchLibrary.program`); `run` is one asynchronous step on a stream."""

    def __init__(self, library: LaunchLibrary, handle: int, plan: LaunchPlan) -> None:
        self.library, self.handle, self.plan = library, handle, plan

    def run(self, inputs: Sequence[int], outputs: Sequence[int], scratch: int, stream: int = 0) -> None:
        """Every kernel in order; a NaN/Inf stored into a checked output sets flag word 0 (`flags`)."""
        if scratch == 0 and self.plan.scratch_bytes:
            raise LaunchError(f"the program needs {self.plan.scratch_bytes} bytes of scratch")
        lib = self.library.lib
        self.library._check(lib.sf_program_run(self.handle, _pointers(inputs), _pointers(outputs), scratch, stream))

    def flags(self) -> tuple[int, int]:
        """(a stitched kernel stored NaN/Inf, `blame` found one where TF's value was finite), read from mapped
        host memory without a sync: what the GPU wrote by the time it is read."""
        words = self.library.lib.sf_program_flags(self.handle)
        return int(words[0]), int(words[1])

    def blame(self, ours: Sequence[int], theirs: Sequence[int], stream: int = 0) -> None:
        """Compares each checked output with TF's values for it on `stream`; sets flag word 1 on a fault."""
        self.library._check(self.library.lib.sf_program_blame(self.handle, _pointers(ours), _pointers(theirs), stream))

    def close(self) -> None:
        if self.handle:
            self.library.lib.sf_program_destroy(self.handle)
            self.handle = 0


def _longs(values: Sequence[int]) -> Any:
    return (ctypes.c_longlong * len(values))(*values)


def _pointers(values: Sequence[int]) -> Any:
    return (ctypes.c_void_p * max(len(values), 1))(*(value or None for value in values))
