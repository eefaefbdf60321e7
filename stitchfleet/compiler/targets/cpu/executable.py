"""The cpu backend: a cluster graph -> stitch plan -> C + OpenMP -> shared object -> ctypes call.

Input: a cluster `Graph` (plus, optionally, its `StitchPlan`) and `CpuOptions` (cache
directory, fast-math, portable code). Output: `CpuExecutable`: `run` takes numpy arrays in
the cluster's parameter order and returns its outputs in output order plus a NaN/Inf flag
computed by the C code (the bridge's path); calling it maps names to names.

- Compilation: the system C compiler (`cc`, or `CpuOptions.compiler`) with -O3 -fopenmp
  -fwrapv (integer overflow wraps, as numpy's does) -ffp-contract=off (no fused
  multiply-add: IEEE results op by op, like numpy), -fno-math-errno (errno only;
  lets sqrt inline) and -fno-trapping-math (no code reads FP exception flags, so gcc
  may compute both sides of a select: without it no loop calling our logf or tanhf
  vectorised, "control flow in loop"; values are unchanged). Fast-math is off unless
  asked for.
- -march=native by default: stitched code is memory-bound, but f16 conversions and the
  16-lane reductions gain from AVX2/F16C. Because a cache directory may be shared by
  machines with different CPUs, the cache key then includes this CPU's model and flag
  line from /proc/cpuinfo; `portable=True` drops -march=native and the CPU from the key.
- Cache: content-addressed shared objects (key = sha256 of source, compiler version,
  flags, CPU) written with temp file + atomic rename (targets/cache.py), so concurrent
  processes never load a partial file; a process loads each object once.
- Calls: inputs are used in place when already contiguous with the right dtype
  (pointers via `arr.ctypes.data`, no copies; checks by position, no name dicts); outputs
  are numpy arrays the C code fills, reused from an earlier call only once nothing outside
  the executable references them any more (reference counts; TF's tensors hold one).
  ctypes releases the GIL during the call; an executable's only shared state is that pool
  (under a lock), so threads may call it concurrently.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.ir import Graph, fingerprint
from stitchfleet.compiler.plan import PlanOptions, StitchPlan, plan_cluster
from stitchfleet.compiler.targets.base import OpAttr
from stitchfleet.compiler.targets.cache import artifact_cache, cache_key
from stitchfleet.compiler.targets.cpu.finite import NONFINITE
from stitchfleet.compiler.targets.cpu.generator import CSource, Param
from stitchfleet.compiler.targets.cpu.source import cluster_source
from stitchfleet.compiler.targets.cpu.source_cache import cached_source
from stitchfleet.compiler.targets.native_build import BuildError, build_shared_object

Array = npt.NDArray[Any]
BASE_FLAGS = (
    *("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fwrapv", "-ffp-contract=off"),
    *("-fno-math-errno", "-fno-trapping-math"),
)
COMPILE_TIMEOUT_S = 300
POOLED_SETS = 2  # output sets kept per executable for reuse (a step's set is usually free by the next)


class CpuCompileError(RuntimeError):
    """The C compiler is missing or rejected the generated source (its message included)."""


class CpuInputError(ValueError):
    """An input is missing, unexpected, or of the wrong shape or dtype."""


@dataclass(frozen=True)
class CpuOptions:
    cache_dir: Path
    fast_math: bool = False
    portable: bool = False
    compiler: str = "cc"
    plan: PlanOptions = field(default_factory=PlanOptions)
    reuse_source: bool = True  # the generated C from the cache (source_cache.py) when an earlier process made it

    @property
    def flags(self) -> tuple[str, ...]:
        extra = () if self.portable else ("-march=native",)
        return (*BASE_FLAGS, *extra, *(("-ffast-math",) if self.fast_math else ()))


def _cpu_description() -> str:
    """Model name and ISA flags of this CPU (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown cpu"
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted))


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (for labelling figures)."""
    for line in _cpu_description().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown cpu"


_VERSIONS: dict[str, str] = {}
_VERSIONS_LOCK = threading.Lock()


def compiler_version(compiler: str) -> str:
    """`cc --version`'s first line (cached per process); CpuCompileError when there is no compiler."""
    with _VERSIONS_LOCK:
        if compiler not in _VERSIONS:
            try:
                done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=True)
            except (OSError, subprocess.SubprocessError) as err:
                raise CpuCompileError(f"C compiler {compiler!r} is not usable: {err}") from None
            _VERSIONS[compiler] = done.stdout.splitlines()[0] if done.stdout else "unknown"
        return _VERSIONS[compiler]


def _build(source: CSource, options: CpuOptions) -> bytes:
    def command(c_file: Path, so_file: Path) -> list[str]:
        return [options.compiler, *options.flags, str(c_file), "-o", str(so_file), "-lm"]

    try:
        return build_shared_object(source.text, "cluster.c", command, COMPILE_TIMEOUT_S)
    except BuildError as err:
        raise CpuCompileError(str(err)) from None


def library_key(source: CSource, options: CpuOptions) -> str:
    machine = "portable" if options.portable else _cpu_description()
    versions = {"cc": compiler_version(options.compiler)}
    return cache_key(source.text, hashlib.sha256(machine.encode()).hexdigest(), versions, options.flags)


def build_identity(options: CpuOptions) -> dict[str, str] | None:
    """What `library_key` depends on beside the source: the machine (this CPU, unless portable), the C compiler
    and the flags; None when there is no C compiler."""
    try:
        cc = compiler_version(options.compiler)
    except CpuCompileError:
        return None
    machine = "portable" if options.portable else _cpu_description()
    return {"machine": hashlib.sha256(machine.encode()).hexdigest(), "cc": cc, "flags": " ".join(options.flags)}


_LOADED: dict[Path, ctypes.CDLL] = {}
_LOAD_LOCK = threading.Lock()


_BUILDING: dict[Path, threading.Lock] = {}  # one lock per shared object this process builds or looks up


def _building(path: Path) -> threading.Lock:
    with _LOAD_LOCK:
        return _BUILDING.setdefault(path, threading.Lock())


def load_library(source: CSource, options: CpuOptions) -> tuple[ctypes.CDLL, bool]:
    """The compiled shared object (built on a cache miss) and whether it came from the cache. Identical kernels
    (a model's repeated layers: the same text, so the same key) built at once by a job's compile workers compile
    once: the second waits for the first's file, and finds it (both compiled it before)."""
    cache = artifact_cache(Path(options.cache_dir), "cpu")
    key = library_key(source, options)
    path = cache.path(key)
    with _building(path):
        hit = path.is_file()  # not read: dlopen reads it (a hit read every object's bytes for nothing)
        if not hit:
            cache.put(key, _build(source, options))
    with _LOAD_LOCK:
        if path not in _LOADED:
            _LOADED[path] = ctypes.CDLL(str(path))
        return _LOADED[path], hit


def _references(arrays: tuple[Array, ...]) -> tuple[int, int]:
    """The largest reference counts among the arrays and among their memory owners: a view of a view
    references the owner (numpy collapses `base`), so a slice a caller keeps shows only there."""
    owners = [a.base for a in arrays if a.base is not None]
    return max(sys.getrefcount(a) for a in arrays), max((sys.getrefcount(o) for o in owners), default=0)


def _referenced(arrays: tuple[Array, ...]) -> bool:
    """Whether any array is referenced outside the pool (a caller, a view, a TF tensor sharing it)."""
    if not arrays:
        return False
    mine, owners = _references(arrays)
    return mine > _OWN_REFERENCES[0] or owners > _OWN_REFERENCES[1]


ALIGN = 64  # EIGEN_MAX_ALIGN_BYTES: TF adopts a numpy buffer without a copy only at this alignment


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> Array:
    """An uninitialised array whose data starts on an ALIGN-byte boundary. numpy's own start 16 bytes
    past one, and tf.numpy_function then copies every output into an aligned tensor."""
    itemsize = np.dtype(dtype).itemsize
    count = int(np.prod(shape))
    raw = np.empty(max(1, count) * itemsize + ALIGN, np.uint8)
    offset = -raw.ctypes.data % ALIGN
    aligned: Array = raw[offset : offset + count * itemsize].view(dtype).reshape(shape)
    return aligned


_OWN_REFERENCES = _references((aligned_empty((1,), np.float32),))  # the pool's tuple and this counting


def _prepare(param: Param, value: object) -> Array:
    array = np.asarray(value)
    expected = f"{param.dtype.value}{list(param.shape)}"
    if array.dtype != param.dtype.numpy:
        raise CpuInputError(f"input {param.name!r}: dtype {array.dtype} does not match the parameter's {expected}")
    # -1: a dimension the C code never depends on (a parameter nothing reads, as `evaluate` allows)
    same_rank = len(array.shape) == len(param.shape)
    if not same_rank or any(d not in (-1, s) for d, s in zip(param.shape, array.shape, strict=True)):
        raise CpuInputError(
            f"input {param.name!r}: shape {list(array.shape)} does not match the parameter's {expected}"
        )
    return np.ascontiguousarray(array)


class CpuExecutable:
    """A compiled cluster. `run(arrays by position)` is the bridge's path; `__call__` takes names."""

    def __init__(self, graph: Graph, plan: StitchPlan, source: CSource, library: ctypes.CDLL, cached: bool) -> None:
        self.graph, self.plan, self.source, self.cached = graph, plan, source, cached
        self.library_path = Path(library._name)  # for callers that load it themselves (the TF bridge op)
        self._fn = getattr(library, source.function)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * len(source.params)
        self._inputs = [p for p in source.params if not p.output]
        self._outputs = [p for p in source.params if p.output]
        self._specs = [(p.shape, p.dtype.numpy) for p in self._inputs]
        position = {name: i for i, name in enumerate(self.input_names)}
        self._passthrough = {  # output position -> input position (the C code leaves those alone)
            j: position[str(graph.node(node_id).attrs["name"])]
            for j, (_, node_id) in enumerate(graph.outputs)
            if graph.node(node_id).op.value == "PARAMETER"
        }
        # output position -> (the earlier output whose value it holds, its shape): the C code stores it once
        self._repeats = {j: (plan.repeat_of(j), p.shape) for j, p in enumerate(self._outputs) if plan.repeat_of(j) >= 0}
        self._pool: list[tuple[Array, ...]] = []
        self._pool_lock = threading.Lock()

    @property
    def passthrough(self) -> tuple[int, ...]:
        """Per output, the input position it passes through unchanged, or -1 when the C code computes it."""
        return tuple(self._passthrough.get(j, -1) for j in range(len(self._outputs)))

    @property
    def repeats(self) -> tuple[int, ...]:
        """Per output, the earlier output whose value (and, in the TF op, buffer) it shares, or -1."""
        return tuple(self.plan.repeat_of(j) for j in range(len(self._outputs)))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._inputs)

    # What the TF dispatch op's CPU kernel takes (base.NativeKernel): it dlopens the library itself.
    @property
    def symbol(self) -> str:
        return self.source.entry

    @property
    def input_shapes(self) -> list[list[int]]:
        return [list(p.shape) for p in self._inputs]

    @property
    def output_shapes(self) -> list[list[int]]:
        return [list(p.shape) for p in self._outputs]

    binds = True  # the op binds a CPU entry compiled for another shape signature beside its own

    def op_attrs(self) -> dict[str, OpAttr]:
        return {"library": str(self.library_path), "symbol": self.source.entry}

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._outputs)

    def _input(self, index: int, value: object) -> Array:
        """The array the C code reads: `value` itself when it already has the layout (no copy)."""
        shape, dtype = self._specs[index]
        if isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == shape and value.flags.c_contiguous:
            return value
        return _prepare(self._inputs[index], value)

    def run(self, arrays: Sequence[object]) -> tuple[tuple[Array, ...], bool]:
        """Outputs in output order from inputs in parameter order, and whether a computed floating-point
        output holds NaN or Inf (tested inside the C code)."""
        if len(arrays) != len(self._specs):
            raise CpuInputError(
                f"expected {len(self._specs)} input(s) ({', '.join(self.input_names)}), got {len(arrays)}"
            )
        given = [self._input(i, a) for i, a in enumerate(arrays)]
        results = self._output_set()
        code = self._fn(*[a.ctypes.data for a in given], *[r.ctypes.data for r in results])
        if code == 1:
            raise MemoryError(f"cluster {self.plan.cluster}: the C code could not allocate its scratch buffers")
        for j, i in self._passthrough.items():
            np.copyto(results[j], given[i])
        for j, (source, shape) in self._repeats.items():  # a view: the pool sees its owner referenced
            results[j] = results[source].reshape(shape)
        return tuple(results), code == NONFINITE

    def _output_set(self) -> list[Array]:
        """Output arrays for one call: an earlier call's set once no one else references any of its arrays
        (TF has released the tensors that shared them), else a fresh set. Reuse saves the page faults of
        first-touching fresh memory, measured at up to 80% of a small cluster's C time."""
        with self._pool_lock:
            for held in self._pool:
                if not _referenced(held):
                    return list(held)
            fresh = tuple(aligned_empty(p.shape, p.dtype.numpy) for p in self._outputs)
            if len(self._pool) < POOLED_SETS:
                self._pool.append(fresh)
            return list(fresh)

    def _check_names(self, inputs: Mapping[str, object]) -> None:
        missing = sorted(set(self.input_names) - set(inputs))
        if missing:
            raise CpuInputError(f"missing input(s): {', '.join(missing)}")
        extra = sorted(set(inputs) - set(self.input_names))
        if extra:
            raise CpuInputError(f"unexpected input(s): {', '.join(extra)} (parameters: {', '.join(self.input_names)})")

    def __call__(self, inputs: Mapping[str, object]) -> dict[str, Array]:
        self._check_names(inputs)
        values, _ = self.run([inputs[name] for name in self.input_names])
        return dict(zip(self.output_names, values, strict=True))


class CpuBackend:
    """Compiles cluster graphs for this CPU.

    Unlike the sim and cuda backends (`base.Backend.compile(program)` on SIMT kernels),
    it starts from the cluster graph and its plan: CPU code from a plan keeps a task in
    one thread with reductions in registers, where translating SIMT kernels (barriers,
    shuffles) would simulate threads one by one.
    """

    name = "cpu"

    def __init__(self, options: CpuOptions) -> None:
        self.options = options

    def compile_graph(self, graph: Graph, plan: StitchPlan | None = None) -> CpuExecutable:
        chosen = plan if plan is not None else plan_cluster(graph, 0, self.options.plan)
        function = f"stitch_{fingerprint(graph)[:16]}"
        if self.options.reuse_source:
            source = cached_source(graph, chosen, function, self.options.cache_dir)
        else:
            source = cluster_source(graph, chosen, function)
        library, cached = load_library(source, self.options)
        return CpuExecutable(graph, chosen, source, library, cached)


def compile_cluster(graph: Graph, cache_dir: Path, plan: StitchPlan | None = None, **options: Any) -> CpuExecutable:
    """One-call form for the plugin: compile (or load from the cache) a cluster graph."""
    return CpuBackend(CpuOptions(cache_dir=cache_dir, **options)).compile_graph(graph, plan)
