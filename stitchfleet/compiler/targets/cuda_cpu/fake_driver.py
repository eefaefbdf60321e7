"""The fake CUDA driver: `csrc/fake_driver.cc` built as a `libcuda.so.1` that runs kernels through cuda-cpu.

Input: a cache directory (and the `cuda.h` the launch library builds against). Output: `FakeDriver`,
the loaded fake with its controls (device facts, injected failures, the call log, context push/pop
counts, device memory the caller declares, the books of modules and pinned memory held). Once loaded,
the launch library's `sf_init` opens it as the driver of the process: load it in
a process of its own (CI runs it in a subprocess). Module images come from `module.driver_image`.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.launch_library import header_dir
from stitchfleet.compiler.targets.native_build import build_shared_object

SOURCE = files(__package__).joinpath("csrc").joinpath("fake_driver.cc").read_text(encoding="utf-8")
BUILD_TIMEOUT_S = 180
# CUresult values the tier injects (cuda.h)
INVALID_VALUE, OUT_OF_MEMORY, INVALID_HANDLE, NOT_FOUND = 1, 2, 400, 500
LAUNCH_OUT_OF_RESOURCES, LAUNCH_FAILED, ILLEGAL_ADDRESS, COOPERATIVE_LAUNCH_TOO_LARGE = 701, 719, 700, 720


@dataclass(frozen=True)
class Books:
    """What the fake's context holds: modules loaded and not unloaded, pinned allocations not freed, and the
    unloads and frees so far (never reset: a leak stays visible)."""

    modules: int
    pinned: int
    unloads: int
    frees: int


class FakeDriverError(RuntimeError):
    """The fake driver cannot be built or loaded."""


def build(cache_dir: Path, compiler: str = "g++") -> Path:
    """The fake's folder holding `libcuda.so.1`, built on a cache miss."""
    if shutil.which(compiler) is None:
        raise FakeDriverError(f"no C++ compiler {compiler!r} to build the fake CUDA driver")
    include = header_dir()
    key = hashlib.sha256(f"{SOURCE}\0{compiler}\0{include}".encode()).hexdigest()[:32]
    cache = ArtifactCache(Path(cache_dir) / "fake-driver", suffix="so")
    folder = cache.path(key).with_suffix("")
    library = folder / "libcuda.so.1"
    if library.is_file():
        return folder

    def command(source: Path, output: Path) -> list[str]:
        flags = ["-std=gnu++17", "-O1", "-g", "-shared", "-fPIC", "-pthread", "-Wl,-soname,libcuda.so.1"]
        return [compiler, *flags, f"-I{include}", str(source), "-o", str(output), "-ldl"]

    data = build_shared_object(SOURCE, "fake_driver.cc", command, BUILD_TIMEOUT_S)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"libcuda.so.1.{hashlib.sha256(data).hexdigest()[:8]}.part"
    partial.write_bytes(data)
    partial.replace(library)
    return folder


class FakeDriver:
    """The loaded fake (one per process: the soname makes it the process's libcuda.so.1)."""

    def __init__(self, folder: Path) -> None:
        try:
            self.lib = ctypes.CDLL(str(folder / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
        except OSError as err:
            raise FakeDriverError(f"cannot load the fake driver: {err}") from None
        lib = self.lib
        lib.sffake_inject.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.sffake_device.argtypes = [ctypes.c_int] * 4
        lib.sffake_schedule.argtypes = [ctypes.c_int] * 3
        lib.sffake_occupancy.argtypes = [ctypes.c_int]
        lib.sffake_log.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.sffake_log.restype = ctypes.c_size_t
        lib.sffake_pushes.restype = lib.sffake_pops.restype = ctypes.c_longlong
        lib.sffake_device_memory.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        lib.sffake_live.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 4

    def reset(self) -> None:
        """Forgets the log, the injections, a sticky fault and the occupancy override."""
        self.lib.sffake_reset()

    def inject(self, call: str, result: int, nth: int = 1, *, sticky: bool = False) -> None:
        """The `nth` next call named `call` (e.g. "cuLaunchKernel") returns `result` without running."""
        self.lib.sffake_inject(call.encode(), nth, result, int(sticky))

    def device(self, sms: int = 132, arch: tuple[int, int] = (9, 0), cooperative: bool = True) -> None:
        self.lib.sffake_device(sms, arch[0], arch[1], int(cooperative))

    def schedule(self, order: int = 0, blocks: int = -1, debug: bool = True) -> None:
        """How cuda-cpu runs each launch (fiber order, block order, its debug checks)."""
        self.lib.sffake_schedule(order, blocks, int(debug))

    def occupancy(self, blocks_per_sm: int) -> None:
        """Blocks per SM the device reports for every function from now on (-1: the fake's model)."""
        self.lib.sffake_occupancy(blocks_per_sm)

    def log(self) -> list[str]:
        """Every call since the last reset, one line each; lines starting "!" are refusals and faults."""
        size = self.lib.sffake_log(None, 0)
        buffer = ctypes.create_string_buffer(size)
        self.lib.sffake_log(buffer, size)
        return buffer.value.decode(errors="replace").splitlines()

    def device_memory(self, pointer: int, nbytes: int) -> None:
        """Declares device memory the caller allocated (TF's allocator): memsets and copies may touch it."""
        self.lib.sffake_device_memory(pointer, nbytes)

    def forget_device_memory(self) -> None:
        self.lib.sffake_forget_device_memory()

    @property
    def books(self) -> Books:
        values = [ctypes.c_longlong() for _ in range(4)]
        self.lib.sffake_live(*(ctypes.byref(v) for v in values))
        return Books(*(int(v.value) for v in values))

    @property
    def balance(self) -> tuple[int, int, int]:
        """(context pushes, pops, this thread's context stack depth) since the last reset."""
        return int(self.lib.sffake_pushes()), int(self.lib.sffake_pops()), int(self.lib.sffake_depth())

    @property
    def sticky(self) -> int:
        return int(self.lib.sffake_sticky())
