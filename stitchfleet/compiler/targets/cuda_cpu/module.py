"""A cuda-cpu module: rendered CUDA kernels -> one C++ translation unit -> a cached shared object.

Input: rendered kernels (`CudaKernel`, names unique within the module) and build options.
Output: a loaded `ctypes.CDLL` with one entry `sf_entry_<name>` per kernel, each launching
that kernel with the cuda backend's contract. Several kernels share one unit because the
compatibility header and the prelude dominate g++'s time (about 1 s per unit), so a unit
of twenty kernels costs little more than a unit of one; built units are cached on disk by
the hash of their whole text, the compiler version and the flags.

The normal build compiles the renderer's text unchanged, contracting a*b+c into FMAs as NVRTC
does by default (`FMA_FLAGS`; `fma=False` builds without). The checked build (`debug`)
adds `-fsanitize=alignment` (its reports become launch errors, not a dead process) and
one line after each static `__shared__` declaration, `SF_SHARED_FILL(name);`, so the
header can fill static shared memory with the launch's fill byte at the start of each
block, as it does the dynamic `extern __shared__` buffer. Nothing else of the text changes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.targets.cache import artifact_cache, cache_key
from stitchfleet.compiler.targets.cpu.executable import CpuCompileError, compiler_version
from stitchfleet.compiler.targets.cuda.prelude import PRELUDE
from stitchfleet.compiler.targets.cuda.render import kernel_text
from stitchfleet.compiler.targets.cuda.signature import CudaKernel
from stitchfleet.compiler.targets.cuda_cpu.header import HEADER, LAUNCHER, RACE_CHECK
from stitchfleet.compiler.targets.native_build import BuildError, build_shared_object

SMEM_CAPACITY = 227 * 1024  # the largest opt-in dynamic shared memory of the profiles (H100/H200)
STACK_BYTES = 64 * 1024
COMPILE_TIMEOUT_S = 300.0
BASE_FLAGS = ("-std=gnu++17", "-fPIC", "-shared", "-pthread", "-fno-strict-aliasing")
# Recoverable, so that the header's own handler turns a report into a launch error.
DEBUG_FLAGS = ("-fsanitize=alignment", "-fsanitize-recover=alignment", "-DSF_CHECKED=1")
# FMA contraction on, as NVRTC's default (--fmad=true) has it: NVVM and ptxas may fuse any a*b+c / a*b-c of
# float or double into one FMA. GCC does so with -ffp-contract=fast (across statements, as NVVM does after
# inlining) from -O2 on (its widening-mul pass; -O2 also inlines as nvcc does), with -mfma for the instruction.
# Its rule is a subset of the GPU's: a product is fused only when every use of it is an add or subtract in
# the same basic block; NVVM also fuses across a select, and ptxas fuses what NVVM leaves (a product with
# other uses, a*b - c*d). Which of two products is fused may differ (both legal): the tolerance rule judges.
FMA_FLAGS = ("-O2", "-ffp-contract=fast", "-mfma")
# The build without contraction (`fma=False`): what the cuda-cpu tier ran before FMA, kept for comparisons.
PLAIN_FLAGS = ("-O1", "-ffp-contract=off")
# GCC's thread-sanitizer instrumentation with csrc/race_check.cc as its runtime (no libtsan): every load and
# store reports to the race check first.
RACE_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0")
_STUB_HEADERS = ("cuda_fp16.h", "cuda_bf16.h")  # their content is in HEADER
# The form cuda_shared renders a static shared array in (its own line; hand-written test
# kernels may leave out the alignment).
_STATIC_SHARED = re.compile(r"^(\s*)__shared__ (?:__align__\(\d+\) )?[A-Za-z_][\w ]* (\w+)\[\d+\];$", re.MULTILINE)
_ANY_STATIC_SHARED = re.compile(r"^\s*__shared__ ", re.MULTILINE)
# A kernel's definition as the renderer writes it; bounds when it declares them.
_KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\((\d+)(?:,\s*\d+)?\)\s+)?(\w+)\(')
MAX_BLOCK = 1024
# The blame kernels of every cluster module (csrc/nonfinite_checks.cu, defined by its SF_BLAME macro):
# name -> element type. Each takes (ours, theirs, elements, flag).
BLAME_KERNELS = {
    "sf_blame_f32": "float",
    "sf_blame_f16": "__half",
    "sf_blame_bf16": "__nv_bfloat16",
    "sf_blame_f64": "double",
}
IMAGE_MAGIC = b"SFCUDACPU1\n"
_LAUNCH_ARGTYPES = [
    ctypes.POINTER(ctypes.c_void_p),  # kernel parameters (device pointers)
    ctypes.c_uint,  # grid
    ctypes.c_uint,  # block
    ctypes.c_size_t,  # dynamic shared bytes
    ctypes.c_int,  # fiber order
    ctypes.c_int,  # block order (-1: concurrent)
    ctypes.c_int,  # debug checks
    ctypes.c_int,  # shared memory fill byte
    ctypes.c_void_p,  # grid barrier counter
    ctypes.c_char_p,  # error message buffer
    ctypes.c_size_t,  # its size
]


class CudaCpuError(RuntimeError):
    """The kernel did not build, or its run was aborted (deadlock, a debug check)."""


@dataclass(frozen=True)
class CudaCpuOptions:
    """How units are built and launched.

    `order`: each block's fibers in thread order (0), reversed (1), reshuffled every round (2).
    `blocks`: -1 blocks run concurrently on OS threads (atomics across blocks in whatever order
    they happen); 0, 1 one block at a time in index or reversed order, >= 2 in an order
    shuffled with that value as seed: a run is reproducible bit for bit, atomics included.
    """

    cache_dir: Path
    debug: bool = False
    order: int = 0
    blocks: int = -1
    fma: bool = True  # contract a*b+c as NVRTC does by default (FMA_FLAGS); False: exact products
    race: bool = False  # the shared-memory race check and random yields (a checked build: needs debug)
    fill: int = 0xFF  # byte that shared memory holds before a block writes it (0xff: NaN in every float type)
    compiler: str = "g++"

    @property
    def flags(self) -> tuple[str, ...]:
        extra = (
            (FMA_FLAGS if self.fma else PLAIN_FLAGS)
            + (DEBUG_FLAGS if self.debug else ())
            + (RACE_FLAGS if self.race else ())
        )
        return (*BASE_FLAGS, *extra, f"-DSF_SMEM_CAPACITY={SMEM_CAPACITY}", f"-DSF_STACK_BYTES={STACK_BYTES}")


def instrumented(text: str) -> str:
    """The kernel text with `SF_SHARED_FILL(name);` after each static shared declaration (checked builds)."""
    return _STATIC_SHARED.sub(lambda m: f"{m.group(0)}\n{m.group(1)}SF_SHARED_FILL({m.group(2)});", text)


def launch_bounds(text: str) -> dict[str, int]:
    """Kernel name -> the block size its `__launch_bounds__` allows (MAX_BLOCK when it declares none)."""
    return {m.group(2): int(m.group(1) or MAX_BLOCK) for m in _KERNEL.finditer(text)}


def _bounds_check(bound: int) -> str:
    """C++ refusing a launch wider than `__launch_bounds__` (NVRTC's kernel would fail to launch)."""
    if bound >= MAX_BLOCK:
        return ""
    return (
        f"  if (block > {bound}u) {{\n"
        f'    std::snprintf(error, error_size, "launch of %u threads exceeds __launch_bounds__({bound})", block);\n'
        "    return 1;\n  }\n"
    )


def _entry(rendered: CudaKernel, bound: int) -> str:
    count = len(rendered.params) + (1 if rendered.grid_barrier else 0)
    args = ", ".join(f"sf_ptr{{a[{i}]}}" for i in range(count))
    name = rendered.name
    return (
        f"static void sf_body_{name}(void** a) {{ {name}({args}); }}\n"
        f'extern "C" int sf_entry_{name}(void** a, unsigned grid, unsigned block, size_t smem, int order,\n'
        "    int blocks, int debug, int fill, unsigned* counter, char* error, size_t error_size) {\n"
        + _bounds_check(bound)
        + f"  return sf_launch_kernel(sf_body_{name}, a, grid, block, smem, {int(rendered.grid_barrier)},"
        " order, blocks, debug, fill, counter, error, error_size);\n}\n"
    )


def _driver_entry(name: str, count: int, barrier: bool, bound: int, body: str) -> str:
    """The fake driver's entry: kernelParams (a pointer to each value) unpacked, then the cuda-cpu launch."""
    counter = f"static_cast<unsigned*>(a[{count - 1}])" if barrier else "nullptr"
    return (
        f"static void sf_body_{name}(void** a) {{ {body}; }}\n"
        f'extern "C" const int sf_params_{name} = {count};\n'
        f'extern "C" const int sf_bounds_{name} = {bound};\n'
        f'extern "C" int sf_cu_{name}(void** p, unsigned grid, unsigned block, size_t smem, int order, int blocks,\n'
        "    int debug, int fill, char* error, size_t error_size) {\n"
        f"  void* a[{max(count, 1)}] = {{nullptr}};\n"
        f"  for (int i = 0; i < {count}; ++i) a[i] = *static_cast<void**>(p[i]);\n"
        f"  return sf_launch_kernel(sf_body_{name}, a, grid, block, smem, {int(barrier)}, order, blocks, debug, fill,"
        f" {counter}, error, error_size);\n}}\n"
    )


def driver_unit(source: str, kernels: Sequence[CudaKernel], *, checked: bool = False) -> str:
    """A cluster module's whole source (what NVRTC compiles: prelude with the `sf_nonfinite_flag` global,
    kernels, blame kernels) as one cuda-cpu unit with an `sf_cu_<name>` entry per kernel and blame kernel,
    for the fake driver."""
    bounds = launch_bounds(source)
    text = instrumented(source) if checked else source
    entries = []
    for rendered in kernels:
        count = len(rendered.params) + (1 if rendered.grid_barrier else 0)
        body = f"{rendered.name}({', '.join(f'sf_ptr{{a[{i}]}}' for i in range(count))})"
        entries.append(_driver_entry(rendered.name, count, rendered.grid_barrier, bounds[rendered.name], body))
    for name, element in BLAME_KERNELS.items():
        if name in bounds or f"SF_BLAME({name}," in source:
            ours, theirs = (f"static_cast<const {element}*>(a[{i}])" for i in (0, 1))
            body = f"{name}({ours}, {theirs}, reinterpret_cast<long long>(a[2]), sf_ptr{{a[3]}})"
            entries.append(_driver_entry(name, 4, False, bounds.get(name, MAX_BLOCK), body))
    return "\n".join([HEADER, f'#line 1 "module.cu"\n{text}', f'#line 1 "cuda-cpu-launcher"\n{LAUNCHER}', *entries])


def translation_unit(kernels: Sequence[CudaKernel], *, checked: bool = False, race: bool = False) -> str:
    """HEADER, the prelude once, each kernel's text (instrumented when checked), the launcher, the race check
    (race builds), the entries."""
    if race and not checked:
        raise CudaCpuError("the race check needs the checked build (debug): it learns static shared arrays there")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names) or not names:
        raise CudaCpuError(f"a module needs one or more kernels with unique names, got {names}")
    parts = [HEADER, PRELUDE]
    for rendered in kernels:
        text = kernel_text(rendered)
        if checked:
            shown = instrumented(text)
            # a renderer that declared static shared memory in another form would go unfilled: refuse
            if shown.count("SF_SHARED_FILL(") != len(_ANY_STATIC_SHARED.findall(text)):
                raise CudaCpuError(f"kernel {rendered.name}: a static __shared__ declaration of unknown form")
            text = shown
        parts.append(f'#line 1 "{rendered.name}.cu"\n{text}')
    parts.append(f'#line 1 "cuda-cpu-launcher"\n{LAUNCHER}')
    if race:
        parts.append(f'#line 1 "race_check.cc"\n{RACE_CHECK}')
    parts += [_entry(k, launch_bounds(k.source).get(k.name, MAX_BLOCK)) for k in kernels]
    return "\n".join(parts)


@functools.cache
def _cpu_has_fma() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # no way to tell: g++'s -mfma build runs or dies with SIGILL, as on any FMA-less CPU
    return re.search(r"^flags\s*:.*\bfma\b", flags, re.MULTILINE) is not None


def _check_cpu(options: CudaCpuOptions) -> None:
    """A contracting unit (built here or cached) runs only on a CPU with FMA instructions: refuse it elsewhere."""
    if options.fma and not _cpu_has_fma():
        raise CudaCpuError("this CPU has no FMA instructions: use cuda-cpu with fma=False (no contraction)")


def _build(text: str, options: CudaCpuOptions) -> bytes:
    def command(source: Path, output: Path) -> list[str]:
        for name in _STUB_HEADERS:
            (source.parent / name).write_text("// provided by the cuda-cpu header\n")
        # nice: CI machines are shared, and a unit's build is never on a latency path
        where = ["-I", str(source.parent), str(source), "-o", str(output)]
        if not options.race:
            return ["nice", "-n", "10", options.compiler, *options.flags, *where]
        # Compiled with the instrumentation, linked without it: the driver would link libtsan, whose
        # runtime cannot be dlopened (static TLS) and is not wanted (race_check.cc is the runtime).
        obj = output.with_suffix(".o")
        compile_ = [options.compiler, *options.flags, "-c", "-I", str(source.parent), str(source), "-o", str(obj)]
        link = [options.compiler, "-shared", "-pthread", str(obj), "-o", str(output)]
        return ["nice", "-n", "10", "sh", "-c", f"{shlex.join(compile_)} && {shlex.join(link)}"]

    try:
        return build_shared_object(text, "kernels.cpp", command, COMPILE_TIMEOUT_S)
    except BuildError as err:
        raise CudaCpuError(str(err)) from None


def _compiler_version(compiler: str) -> str:
    try:
        return compiler_version(compiler)  # the cpu backend's, cached per process
    except CpuCompileError as err:
        raise CudaCpuError(f"C++ compiler {compiler!r} is not usable: {err}") from None


_LOADED: dict[Path, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def load_module(kernels: Sequence[CudaKernel], options: CudaCpuOptions) -> ctypes.CDLL:
    """The module's shared object, built on a cache miss, loaded once per process."""
    _check_cpu(options)
    text = translation_unit(kernels, checked=options.debug, race=options.race)
    cache = artifact_cache(Path(options.cache_dir), "cuda-cpu")
    arch = hashlib.sha256(b"x86-64").hexdigest()
    key = cache_key(text, arch, {"cxx": _compiler_version(options.compiler)}, options.flags)
    path = cache.path(key) if cache.get(key) is not None else cache.put(key, _build(text, options))
    with _LOCK:
        if path not in _LOADED:
            library = ctypes.CDLL(str(path))
            for rendered in kernels:
                entry = getattr(library, f"sf_entry_{rendered.name}")
                entry.restype, entry.argtypes = ctypes.c_int, _LAUNCH_ARGTYPES
            _LOADED[path] = library
        return _LOADED[path]


def driver_image(source: str, kernels: Sequence[CudaKernel], options: CudaCpuOptions) -> bytes:
    """What the fake driver's cuModuleLoadData takes for a cluster module: the magic, then the path of the
    module's cuda-cpu build (`driver_unit`), built on a cache miss."""
    _check_cpu(options)
    text = driver_unit(source, kernels, checked=options.debug)
    cache = artifact_cache(Path(options.cache_dir), "cuda-cpu")
    key = cache_key(
        text, hashlib.sha256(b"x86-64").hexdigest(), {"cxx": _compiler_version(options.compiler)}, options.flags
    )
    path = cache.path(key) if cache.get(key) is not None else cache.put(key, _build(text, options))
    return IMAGE_MAGIC + str(path).encode() + b"\0"


def load_kernel(rendered: CudaKernel, options: CudaCpuOptions) -> ctypes.CDLL:
    """A module of one kernel (hand-written kernels in the diagnostics tests)."""
    return load_module([rendered], options)
