"""The native bridge: build, load and call the `StitchfleetDispatch` TF op (no Python on the step's path).

The rules in full: docs/plugin/native.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import tensorflow as tf

from stitchfleet.boot.installer import OPS_DIR
from stitchfleet.compiler import targets
from stitchfleet.compiler.targets.base import NativeKernel
from stitchfleet.compiler.targets.cache import ArtifactCache, artifact_cache, cache_key
from stitchfleet.compiler.targets.native_build import BuildError, build_shared_object
from stitchfleet.plugin.native.sources import FILES, MAIN, SOURCE

log = logging.getLogger("stitchfleet.plugin")
BUILD_TIMEOUT_S = 600
COMPILER = "c++"
COUNTS = {"calls": 0, "failed": 1, "faulted": 2, "nonfinite": 3, "missed": 4}  # the op library's counters


class BridgeUnavailableError(RuntimeError):
    """The op library cannot be built or loaded here; the message says why (the plugin then uses
    tf.numpy_function)."""


@dataclass(frozen=True)
class BridgeOp:
    path: Path
    module: ModuleType  # the op library tf.load_op_library loaded
    counters: ctypes.CDLL

    def dispatch(
        self,
        kernel: NativeKernel,
        inputs: Sequence[tf.Tensor],
        dtypes: Sequence[tf.DType],
        *,
        switch: tuple[tf.Tensor, int],
        fallback: str | tf.types.experimental.ConcreteFunction,
        static_shapes: Sequence[tf.TensorShape] = (),
    ) -> list[tf.Tensor]:
        """The cluster's outputs (TF tensors, in output order): the compiled code when switch (vector, index) is
        on and the inputs have the shapes it was built for, else (or when it reports a failure) `fallback`, a
        function of the cluster's TF ops (the name of one in the graph's library: fallback.py, or a concrete function,
        added to it here; named by a string, which TF's executor builds leave alone: csrc/fallback.h). `static_shapes`:
        the outputs' shapes as the graph declares them (partial where it says None), for TF's shape inference. The
        kernel's `op_attrs` say which of the op's kernels runs it (CPU: `library`; GPU: `module`...; the op runs where
        TF places it)."""
        switches, index = switch
        if not isinstance(fallback, str):
            fallback.add_to_graph(tf.compat.v1.get_default_graph())
            fallback = fallback.name.decode() if isinstance(fallback.name, bytes) else fallback.name
        outs = self.module.stitchfleet_dispatch(
            switches=switches,
            args=list(inputs),
            Tout=list(dtypes),
            index=index,
            fallback=fallback,
            output_shapes=kernel.output_shapes,
            input_shapes=[tf.TensorShape([d if d >= 0 else None for d in shape]) for shape in kernel.input_shapes],
            static_shapes=[tf.TensorShape(shape) for shape in static_shapes],
            passthrough=list(kernel.passthrough),
            repeats=list(kernel.repeats),
            name="stitched",
            **{"symbol": kernel.symbol, **kernel.op_attrs()},
        )
        return list(outs)

    def count(self, kernel: NativeKernel, what: str = "calls") -> int:
        """How often the cluster's entry ran (launched) in this process (`calls`), returned non-zero or failed
        to launch (`failed`), produced NaN/Inf where TF's own ops on the same inputs were finite (`faulted`:
        on the CPU every such call; on a GPU a judged call, see csrc/gpu_dispatch.h), had a GPU kernel note
        NaN/Inf in an output (`nonfinite`: reads of its flag word that found it set, no sync), or missed its
        shape signature (`missed`)."""
        if what not in COUNTS:  # a typo would read as "never happened"
            raise ValueError(f"bridge count {what!r}: expected one of {', '.join(COUNTS)}")
        return int(self.counters.stitchfleet_bridge_count(kernel.symbol.encode(), COUNTS[what]))

    def bind(self, symbol: str, kernel: NativeKernel, key: str) -> None:
        """From now on the ops whose `symbol` is `symbol` run `executable` (compiled for other input shapes, the
        same inputs and outputs) on the calls whose inputs have its shapes, beside the kernels they hold for
        other signatures; `key` names the job's shape signature it was built for (a kernel bound for the same
        key is replaced; calls are counted per key). BridgeUnavailableError if it cannot be bound. CPU only:
        a GPU op keeps the kernel it was built with."""
        attrs = kernel.op_attrs()
        if not kernel.binds or not isinstance(attrs.get("library"), str):
            raise BridgeUnavailableError(f"{kernel.symbol}: only a CPU entry binds beside the op's own kernel")
        text = "".join(_shape_text(shape) for shape in kernel.input_shapes)
        text += "|" + "".join(_shape_text(shape) for shape in kernel.output_shapes)
        library, entry = str(attrs["library"]).encode(), kernel.symbol.encode()
        code = self.counters.stitchfleet_bridge_bind(symbol.encode(), library, entry, text.encode(), key.encode())
        if code != 0:
            why = {1: "cannot load the library", 2: "no such entry", 3: "malformed shapes", 4: "table full"}
            raise BridgeUnavailableError(f"binding {kernel.symbol} to {symbol} failed: {why.get(code, 'empty key')}")

    def unbind(self, symbol: str, key: str = "") -> bool:
        """The ops whose symbol is `symbol` no longer run the kernel bound for `key` ("": the kernel of their own
        attributes, built at begin): those calls run TF's ops. False when nothing was bound for it."""
        return int(self.counters.stitchfleet_bridge_unbind(symbol.encode(), key.encode())) == 0

    def reset(self, symbol: str) -> None:
        """The ops whose symbol is `symbol` hold their own kernel only again, per-signature counts at 0 (a job's
        hook starts from what its ops were built with, not from an earlier session's bindings)."""
        self.counters.stitchfleet_bridge_reset(symbol.encode())

    def signature_calls(self, symbol: str, key: str = "") -> int:
        """Calls of `symbol`'s ops that ran the kernel bound for `key` ("": their own attributes' kernel)."""
        return int(self.counters.stitchfleet_bridge_signature_count(symbol.encode(), key.encode()))

    def pool_loops(self, on_workers: bool = False) -> int:
        """Stitched loops run through TF's intra-op pool in this process, or (`on_workers`) their blocks that ran
        on a TF worker thread other than the calling op's: where stitched tasks ran (csrc/pool.h)."""
        return int(self.counters.stitchfleet_bridge_pool_count(1 if on_workers else 0))

    def pool_backoffs(self) -> int:
        """Times a handed-out loop's wait for a descheduled worker turned the hand-out off for a while (csrc/pool.h:
        a loaded machine's sign)."""
        return int(self.counters.stitchfleet_bridge_pool_count(2))

    def pool_elements(self, elements: int | None = None) -> int:
        """The elements touched from which a stitched loop is handed out to TF's worker threads, process-wide; with
        `elements`, set to it. Returns the value before: benchmarks compare thresholds in one process."""
        return int(self.counters.stitchfleet_bridge_pool_elements(-1 if elements is None else elements))

    def staggered(self) -> int:
        """Outputs the CPU kernel allocated at staggered page offsets in this process (csrc/staggered.h)."""
        return int(self.counters.stitchfleet_bridge_staggered())

    def recycled(self) -> int:
        """Staggered outputs whose memory an earlier output had released, in this process (csrc/staggered.h)."""
        return int(self.counters.stitchfleet_bridge_recycled())

    def faults(self) -> int:
        """Faults of every cluster in this process (NaN/Inf where TF's ops on the same inputs were finite),
        after collecting the GPU ops' flag words (host memory: no sync): one cheap read per step; only a
        change is worth asking each cluster's `count(..., "faulted")`."""
        return int(self.counters.stitchfleet_bridge_faults())


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def cuda_build() -> bool:
    """Whether this TF was built with CUDA (the GPU wheel): its op library then carries the GPU kernel."""
    return bool(tf.sysconfig.get_build_info().get("is_cuda_build", False))


def _flags(gpu: bool | None = None) -> list[str]:
    """Compile flags; `gpu` (default: this TF's build) adds the GPU kernel (-DGOOGLE_CUDA=1, as TF's
    own GPU build defines it: the headers then match its class layouts)."""
    with_gpu = cuda_build() if gpu is None else gpu
    return [*tf.sysconfig.get_compile_flags(), "-O2", "-fPIC", "-shared", *(["-DGOOGLE_CUDA=1"] if with_gpu else [])]


def _compiler_version() -> str:
    try:
        done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        raise BridgeUnavailableError(f"no C++ compiler ({COMPILER!r}): {err}") from None
    return done.stdout.splitlines()[0] if done.stdout else "unknown"


def _build(gpu: bool | None = None) -> bytes:
    return _compile(_flags(gpu), tf.sysconfig.get_link_flags())


def build_against(tree: Path, gpu: bool = True) -> bytes:
    """The op built against another TF's headers and framework library: `tree` is that TF's `tensorflow`
    folder (include/ and libtensorflow_framework.so.2, e.g. the GPU wheel's, scripts/tf_gpu_headers.py),
    with this TF's ABI flags (the same version: CI builds the GPU op against tensorflow==2.15.1's own
    headers while the tests run tensorflow-cpu 2.15.1)."""
    flags = [f for f in _flags(gpu) if not f.startswith("-I")]
    return _compile([f"-I{tree / 'include'}", *flags], [f"-L{tree}", "-l:libtensorflow_framework.so.2"])


def _compile(flags: list[str], link_flags: list[str]) -> bytes:
    # -z defs: every symbol must resolve against TF's framework library now, not at load in a pod.
    def command(cc_file: Path, so_file: Path) -> list[str]:
        link = [*link_flags, "-ldl", "-Wl,-z,defs"]
        return [COMPILER, *flags, str(cc_file), "-o", str(so_file), *link]

    try:
        headers = {name: text for name, text in FILES.items() if name != MAIN}
        return build_shared_object(FILES[MAIN], MAIN, command, BUILD_TIMEOUT_S, beside=headers)
    except BuildError as err:
        raise BridgeUnavailableError(f"building the bridge op failed: {err}") from None


def prebuilt_name(gpu: bool | None = None) -> str:
    """The file name of a prebuilt op for this TF: its source, TF version and compile flags (the ABI), but not
    where TF is installed: the -I of its headers named the builder's site-packages, so an op built in the
    shim image never matched a pod whose TF lives elsewhere (measured: the `tensorflow` 2.15.1 GPU wheel in
    another venv loads the -DGOOGLE_CUDA=1 variant built against tensorflow-cpu 2.15.1, and runs it)."""
    blob = "\0".join([SOURCE, tf.__version__, *(f for f in _flags(gpu) if not f.startswith("-I"))])
    return f"tfop-{hashlib.sha256(blob.encode()).hexdigest()[:32]}.so"


def prebuilt_dirs() -> list[Path]:
    """Where `stitchfleet shim install --with-op` puts prebuilt ops: DIR/ops beside the shim's package copy."""
    return [Path(__file__).resolve().parents[3] / PREBUILT_DIR]


def build_prebuilt(target: Path, gpu: bool | None = None) -> Path:
    """Builds the op for the TF of this process into `target`/ops (what a shim image ships); `gpu=True`
    builds the variant with the GPU kernel, for the GPU build of this TF version (CI compiles it here),
    and the launch library it opens beside it (a pod has no C compiler to build either)."""
    folder = target / PREBUILT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / prebuilt_name(gpu)
    temporary = path.with_suffix(".tmp")
    temporary.write_bytes(_build(gpu))
    temporary.replace(path)
    if cuda_build() if gpu is None else gpu:
        with tempfile.TemporaryDirectory(prefix="stitchfleet-launch-") as tmp:
            for name in native_targets(runs_on="gpu"):  # what the op's GPU kernel opens (the launch library)
                try:
                    targets.native(name, Path(tmp)).prebuild(folder)
                except RuntimeError as err:
                    raise BridgeUnavailableError(f"prebuilding for {name}: {err}") from None
    return path


def native_targets(runs_on: str) -> tuple[str, ...]:
    """The job backends the op runs natively for clusters placed on `runs_on` ("cpu" or "gpu")."""
    return tuple(n for n in targets.names(runs_on=runs_on, in_jobs=True) if targets.profile(n).native_op)


def _prebuilt() -> Path | None:
    found = [folder / prebuilt_name() for folder in prebuilt_dirs()]
    return next((path for path in found if path.is_file()), None)


def _cached(cache_dir: Path) -> tuple[ArtifactCache, str]:
    """The kernel cache's op folder and this TF's key in it (TF version, C++ compiler, flags, source)."""
    versions = {"tensorflow": tf.__version__, "c++": _compiler_version()}
    key = cache_key(SOURCE, hashlib.sha256(" ".join(_flags()).encode()).hexdigest(), versions, ())
    return artifact_cache(Path(cache_dir), "tfop"), key


def library_path(cache_dir: Path) -> Path:
    """The op library for this TF: a prebuilt one shipped with the shim when its TF matches, else the
    cache's, else built (seconds and a C++ compiler, which a training image may not have)."""
    prebuilt = _prebuilt()
    if prebuilt is not None:
        return prebuilt
    cache, key = _cached(cache_dir)
    # is_file, not get: the library is megabytes, read for nothing in every warm pod
    return cache.path(key) if cache.path(key).is_file() else cache.put(key, _build())


def cached_library(cache_dir: Path) -> Path:
    """Where this TF's op library is (or would be) in the kernel cache at `cache_dir`: a benchmark that starts a job
    on an empty cache copies the op there, as a pod finds it prebuilt in the shim image (scripts/ab_jobs.py)."""
    cache, key = _cached(cache_dir)
    return cache.path(key)


def present(cache_dir: Path) -> bool:
    """Whether this TF's op library is there without a build: loaded in this process already (`load` gives a second
    cache directory the first library), shipped with the shim, or in the cache."""
    if _LOADED or _prebuilt() is not None:
        return True
    try:
        cache, key = _cached(cache_dir)
    except BridgeUnavailableError:  # no compiler: nothing to build in the background either
        return True
    return cache.path(key).is_file()


_LOADED: list[BridgeOp] = []
PREBUILT_DIR = OPS_DIR  # what `shim install` copies into a pod beside the package
_LOCK = threading.Lock()


_WARMING: dict[Path, threading.Thread] = {}


def warm(cache_dir: Path) -> bool:
    """Starts building this TF's op library into the cache in the background, when it is neither loaded,
    shipped with the shim nor cached: the build (a C++ compiler run of ~10 s) then overlaps the job's
    cluster compiles instead of following them. `load` waits for it; a failed build is left for `load`
    to redo and report. Returns whether a build is under way (it occupies a core meanwhile)."""

    def build() -> None:
        try:
            library_path(cache_dir)
        except Exception as err:  # load() builds again and says why
            log.info("stitchfleet: background build of the native op failed: %s", err)

    with _LOCK:
        if _LOADED:
            return False
        if Path(cache_dir) in _WARMING:
            return _WARMING[Path(cache_dir)].is_alive()
    if present(cache_dir):
        return False
    with _LOCK:
        if Path(cache_dir) in _WARMING:
            return _WARMING[Path(cache_dir)].is_alive()
        worker = threading.Thread(target=build, name="stitchfleet-op-build")
        _WARMING[Path(cache_dir)] = worker
    worker.start()
    return True


def load(cache_dir: Path) -> BridgeOp:
    """The bridge op, built and loaded once per process; BridgeUnavailableError says why not. TF
    registers an op name once per process, so a second cache directory gets the first library."""
    worker = _WARMING.get(Path(cache_dir))
    if worker is not None:
        worker.join()
    with _LOCK:
        if not _LOADED:
            _LOADED.append(_load(library_path(cache_dir)))
        return _LOADED[0]


def _load(path: Path) -> BridgeOp:
    try:
        module = tf.load_op_library(str(path))
    except (tf.errors.OpError, OSError) as err:
        raise BridgeUnavailableError(f"loading {path} failed: {err}") from None
    counters = ctypes.CDLL(str(path))
    counters.stitchfleet_bridge_count.restype = ctypes.c_long
    counters.stitchfleet_bridge_count.argtypes = [ctypes.c_char_p, ctypes.c_int]
    counters.stitchfleet_bridge_faults.restype = ctypes.c_long
    counters.stitchfleet_bridge_faults.argtypes = []
    counters.stitchfleet_bridge_staggered.restype = ctypes.c_long
    counters.stitchfleet_bridge_staggered.argtypes = []
    counters.stitchfleet_bridge_recycled.restype = ctypes.c_long
    counters.stitchfleet_bridge_recycled.argtypes = []
    counters.stitchfleet_bridge_bind.restype = ctypes.c_int
    counters.stitchfleet_bridge_bind.argtypes = [ctypes.c_char_p] * 5
    counters.stitchfleet_bridge_unbind.restype = ctypes.c_int
    counters.stitchfleet_bridge_unbind.argtypes = [ctypes.c_char_p] * 2
    counters.stitchfleet_bridge_reset.restype = None
    counters.stitchfleet_bridge_reset.argtypes = [ctypes.c_char_p]
    counters.stitchfleet_bridge_signature_count.restype = ctypes.c_long
    counters.stitchfleet_bridge_signature_count.argtypes = [ctypes.c_char_p] * 2
    counters.stitchfleet_bridge_pool_count.restype = ctypes.c_long
    counters.stitchfleet_bridge_pool_count.argtypes = [ctypes.c_int]
    counters.stitchfleet_bridge_pool_elements.restype = ctypes.c_long
    counters.stitchfleet_bridge_pool_elements.argtypes = [ctypes.c_long]
    return BridgeOp(path, module, counters)


def choose(setting: str, backend: str, cache_dir: Path) -> BridgeOp | None:
    """The bridge op for this job, or None for tf.numpy_function: `python` asks for it, other
    backends than cpu and cuda have no native entry, and under `auto` a bridge that cannot be built falls
    back (logged). `native` that cannot be built raises: the hook then leaves stitching off."""
    if setting == "python" or not targets.profile(backend).native_op:
        return None
    try:
        return load(cache_dir)
    except BridgeUnavailableError as err:
        if setting == "native":
            raise
        log.warning("stitchfleet: native bridge unavailable, using tf.numpy_function: %s", err)
        return None
