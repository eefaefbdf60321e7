"""NVRTC through ctypes: compile rendered CUDA C to cubin (or PTX) inside the process, with a cache.

Input: CUDA C source and an arch (`sm_90`). Output: the cubin/PTX bytes, or `NvrtcError` with
NVRTC's log and the numbered source lines it points at. This is how a training pod compiles its
kernels: TF's GPU install brings libnvrtc (the `nvidia-cuda-nvrtc-cu12` wheel) and the CUDA
headers (`nvidia-cuda-runtime-cu12`), rarely nvcc. The same wheels install on a CPU machine, so
CI compiles every kernel with the NVRTC a pod would use; nvcc stays for CI's extra checks.

Where things are found, first hit wins: an explicit path; the NVIDIA wheels' folders
(`nvidia/cuda_nvrtc/lib`, `nvidia/cuda_runtime/include`) on sys.path; then a CUDA toolkit
(the one whose nvcc is on PATH, `/usr/local/cuda`) and the loader's search path. The cache key holds the source,
the arch, NVRTC's version and the options, so a newer NVRTC never reuses an older one's cubin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.targets.cache import ArtifactCache, cache_key

# 550/177: a variable set or declared but never read; the lowering leaves a few (harmless).
OPTIONS = ("--std=c++17", "-default-device", "--diag-suppress=550,177")
TOOLKITS = ("/usr/local/cuda",)
SONAMES = ("libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so")
NVRTC_SUCCESS = 0


class NvrtcError(RuntimeError):
    """NVRTC is missing or rejected the source."""


def _wheel_dir(package: str, sub: str) -> Path | None:
    """<site-packages>/nvidia/<package>/<sub> when that NVIDIA wheel is installed."""
    try:
        spec = importlib.util.find_spec(f"nvidia.{package}")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = Path(root) / sub
        if found.is_dir():
            return found
    return None


def _toolkits() -> list[Path]:
    """CUDA toolkits: the one whose nvcc is on PATH, then the usual install folder."""
    nvcc = shutil.which("nvcc")
    roots = [Path(nvcc).resolve().parent.parent] if nvcc else []
    return [*roots, *(Path(root) for root in TOOLKITS)]


def library_candidates() -> list[Path]:
    """Where libnvrtc may be, most specific first (the wheel's, then a toolkit's)."""
    found: list[Path] = []
    wheel = _wheel_dir("cuda_nvrtc", "lib")
    if wheel is not None:
        found += sorted(wheel.glob("libnvrtc.so.*[0-9]"))
    for root in _toolkits():
        found += [root / "lib64" / name for name in SONAMES]
    return [path for path in found if path.is_file() and "builtins" not in path.name and ".alt." not in path.name]


def include_dirs() -> list[Path]:
    """Folders holding cuda_fp16.h and cuda_bf16.h (the rendered prelude includes both)."""
    found = [path for path in [_wheel_dir("cuda_runtime", "include")] if path is not None]
    found += [root / "include" for root in _toolkits()]
    return [path for path in found if (path / "cuda_fp16.h").is_file()]


@dataclass(frozen=True)
class Nvrtc:
    """One loaded libnvrtc, its version and the archs it compiles for."""

    path: str
    version: str
    archs: tuple[str, ...]  # sm_XX, oldest first
    includes: tuple[str, ...]
    lib: ctypes.CDLL

    def compile(self, source: str, arch: str, cache: ArtifactCache | None = None, target: str = "cubin") -> bytes:
        """The compiled bytes (cached by source, arch, NVRTC version, options and target)."""
        if arch not in self.archs:
            raise NvrtcError(f"NVRTC {self.version} cannot compile for {arch} (it accepts {', '.join(self.archs)})")
        if target not in ("cubin", "ptx"):
            raise NvrtcError(f"target must be cubin or ptx, got {target!r}")
        options = self.options(arch, target)
        key = cache_key(source, arch, {"nvrtc": self.version}, (*options, target))
        if cache is None:
            return self._run(source, options, target)
        return cache.get_or_build(key, lambda: self._run(source, options, target))

    def options(self, arch: str, target: str) -> tuple[str, ...]:
        """NVRTC options: a real arch (sm_XX) gives a cubin, a virtual one (compute_XX) PTX."""
        gpu = arch if target == "cubin" else arch.replace("sm_", "compute_")
        return (*OPTIONS, f"--gpu-architecture={gpu}", *(f"--include-path={path}" for path in self.includes))

    def _run(self, source: str, options: Sequence[str], target: str) -> bytes:
        program = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            encoded = [option.encode() for option in options]
            array = (ctypes.c_char_p * len(encoded))(*encoded)
            status = self.lib.nvrtcCompileProgram(program, len(encoded), array)
            if status != NVRTC_SUCCESS:
                log = self._log(program)
                raise NvrtcError(f"NVRTC {self.version} failed ({self._error(status)}):\n{log}{_context(log, source)}")
            return self._output(program, target)
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))

    def _output(self, program: ctypes.c_void_p, target: str) -> bytes:
        size_fn, get_fn = (
            (self.lib.nvrtcGetCUBINSize, self.lib.nvrtcGetCUBIN)
            if target == "cubin"
            else (self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX)
        )
        size = ctypes.c_size_t()
        self._check(size_fn(program, ctypes.byref(size)), f"nvrtcGet{target.upper()}Size")
        buffer = ctypes.create_string_buffer(size.value)
        self._check(get_fn(program, buffer), f"nvrtcGet{target.upper()}")
        data = buffer.raw[: size.value]
        return data.rstrip(b"\0") if target == "ptx" else data

    def _log(self, program: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        if self.lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)) != NVRTC_SUCCESS:
            return ""
        buffer = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(program, buffer)
        return buffer.value.decode(errors="replace")

    def _error(self, status: int) -> str:
        return (self.lib.nvrtcGetErrorString(status) or b"unknown error").decode()

    def _check(self, status: int, call: str) -> None:
        if status != NVRTC_SUCCESS:
            raise NvrtcError(f"{call} failed: {self._error(status)}")


def _declare(lib: ctypes.CDLL) -> None:
    """C signatures of the NVRTC calls used (ctypes would otherwise truncate pointers)."""
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p]
    lib.nvrtcCreateProgram.argtypes += [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    for name in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize", "nvrtcGetPTXSize"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for name in ("nvrtcGetProgramLog", "nvrtcGetCUBIN", "nvrtcGetPTX"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcGetNumSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.nvrtcGetSupportedArchs.argtypes = [ctypes.POINTER(ctypes.c_int)]


def _archs(lib: ctypes.CDLL) -> tuple[str, ...]:
    count = ctypes.c_int()
    if lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) != NVRTC_SUCCESS or count.value <= 0:
        raise NvrtcError("NVRTC did not list the archs it supports")
    values = (ctypes.c_int * count.value)()
    lib.nvrtcGetSupportedArchs(values)
    return tuple(f"sm_{value}" for value in sorted(set(values)))


def load(path: str | Path) -> Nvrtc:
    """NVRTC from one library file; NvrtcError when it cannot be loaded or used."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise NvrtcError(f"cannot load NVRTC from {path}: {err}") from None
    _declare(lib)
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != NVRTC_SUCCESS:
        raise NvrtcError(f"{path}: nvrtcVersion failed")
    includes = tuple(str(folder) for folder in include_dirs())
    return Nvrtc(str(path), f"{major.value}.{minor.value}", _archs(lib), includes, lib)


def find_nvrtc(path: str | Path | None = None) -> Nvrtc | None:
    """The first usable NVRTC (an explicit `path`, the wheel's, a toolkit's, the loader's), else None."""
    candidates: list[str] = [str(path)] if path else [str(found) for found in library_candidates()]
    if not path:
        candidates += [name for name in [ctypes.util.find_library("nvrtc")] if name]
    for candidate in candidates:
        try:
            return load(candidate)
        except NvrtcError:
            continue
    return None


def _context(log: str, source: str) -> str:
    """The source lines NVRTC's messages point at (`kernel.cu(12): error ...`), numbered."""
    lines = source.splitlines()
    wanted = sorted({int(n) for n in re.findall(r"kernel\.cu\((\d+)\)", log) if 0 < int(n) <= len(lines)})
    return "".join(f"\n  {n:5d} | {lines[n - 1]}" for n in wanted[:8])
