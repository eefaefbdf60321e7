"""The native bridge: build, load and call the `StitchfleetDispatch` TF op (no Python on the step's path).

Input: a cache directory, the installed TensorFlow (headers and link flags from `tf.sysconfig`)
and the system C++ compiler; per cluster, its compiled `CpuExecutable` (shared object, entry
symbol, output shapes, passed-through outputs) and its TF ops as a function. Output: `BridgeOp`
(the loaded op library) whose `dispatch` adds the op to the graph and returns the cluster's output
tensors, and whose `count` tells how often an entry ran, failed or was at fault in this process.

Why: `tf.numpy_function` costs tens of microseconds per call (GIL hand-over, array wrapping) and
serialises clusters on the GIL; measured ~0.1 ms per cluster inside a training step, which is
more than small clusters save. A pod loads the op prebuilt by `stitchfleet shim install DIR
--with-op` (DIR/ops, named by source, TF version and compile flags, so another TF never loads it);
without one, the library is built once per TF version, compiler and source (content-addressed
cache, atomic rename: compiler/targets/cache.py; ~20-30 s and a C++ compiler). Loaded once per process.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from stitchfleet.boot.installer import OPS_DIR
from stitchfleet.compiler import targets
from stitchfleet.compiler.targets.cache import ArtifactCache, artifact_cache, cache_key
from stitchfleet.compiler.targets.cpu.executable import CpuExecutable
from stitchfleet.compiler.targets.cuda.gpu_executable import GpuExecutable
from stitchfleet.compiler.targets.cuda.launch_library import build as build_launcher
from stitchfleet.compiler.targets.cuda.launch_source import SOURCE as LAUNCH_SOURCE
from stitchfleet.compiler.targets.native_build import BuildError, build_shared_object
from stitchfleet.plugin.bridge_source import SOURCE

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
    module: Any
    counters: ctypes.CDLL

    def dispatch(
        self,
        executable: CpuExecutable | GpuExecutable,
        inputs: Sequence[Any],
        dtypes: Sequence[Any],
        *,
        switch: tuple[Any, int],
        fallback: Any,
        static_shapes: Sequence[Any] = (),
    ) -> list[Any]:
        """The cluster's outputs (TF tensors, in output order): the compiled code when switch (vector, index) is
        on and the inputs have the shapes it was built for, else (or when it reports a failure) `fallback`, a
        function of the cluster's TF ops (a concrete function, or the name of one in the graph's library:
        fallback.py). `static_shapes`: the outputs' shapes as the graph declares them (partial where it says
        None), for TF's shape inference. A `GpuExecutable` gives the op its GPU kernel's attributes (the op
        runs where TF places it)."""
        switches, index = switch
        if isinstance(executable, GpuExecutable):
            shapes, specific = executable.output_shapes, executable.attrs()
            signature = [list(node.shape) for node in executable.graph.parameters]
        else:
            shapes = [list(p.shape) for p in executable.source.params if p.output]
            signature = [list(p.shape) for p in executable.source.params if not p.output]
            specific = {"library": str(executable.library_path), "symbol": executable.source.entry}
        outs = self.module.stitchfleet_dispatch(
            switches=switches,
            args=list(inputs),
            Tout=list(dtypes),
            index=index,
            fallback=fallback,
            output_shapes=shapes,
            input_shapes=[tf.TensorShape([d if d >= 0 else None for d in shape]) for shape in signature],
            static_shapes=[tf.TensorShape(shape) for shape in static_shapes],
            passthrough=list(executable.passthrough),
            name="stitched",
            **specific,
        )
        return list(outs)

    def count(self, executable: CpuExecutable | GpuExecutable, what: str = "calls") -> int:
        """How often the cluster's entry ran (launched) in this process (`calls`), returned non-zero or failed
        to launch (`failed`), produced NaN/Inf where TF's own ops were finite (`faulted`, CPU). On a GPU,
        `faulted` and `nonfinite` read the kernel's device flag (NaN/Inf in a stitched output; read without
        a sync, so not compared with TF's values on that step)."""
        if what not in COUNTS:  # a typo would read as "never happened"
            raise ValueError(f"bridge count {what!r}: expected one of {', '.join(COUNTS)}")
        gpu = isinstance(executable, GpuExecutable)
        symbol = executable.symbol if isinstance(executable, GpuExecutable) else executable.source.entry
        code = COUNTS["nonfinite"] if gpu and what == "faulted" else COUNTS[what]
        return int(self.counters.stitchfleet_bridge_count(symbol.encode(), code))

    def bind(self, symbol: str, executable: CpuExecutable, key: str) -> None:
        """From now on the ops whose `symbol` is `symbol` run `executable` (compiled for other input shapes, the
        same inputs and outputs) on the calls whose inputs have its shapes, beside the kernels they hold for
        other signatures; `key` names the job's shape signature it was built for (a kernel bound for the same
        key is replaced; calls are counted per key). BridgeUnavailableError if it cannot be bound. CPU only:
        a GPU op keeps the kernel it was built with."""
        params = executable.source.params
        text = "".join(_shape_text(p.shape) for p in params if not p.output)
        text += "|" + "".join(_shape_text(p.shape) for p in params if p.output)
        library, entry = str(executable.library_path).encode(), executable.source.entry.encode()
        code = self.counters.stitchfleet_bridge_bind(symbol.encode(), library, entry, text.encode(), key.encode())
        if code != 0:
            why = {1: "cannot load the library", 2: "no such entry", 3: "malformed shapes", 4: "table full"}
            raise BridgeUnavailableError(
                f"binding {executable.source.entry} to {symbol} failed: {why.get(code, 'empty key')}"
            )

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

    def faults(self) -> int:
        """Faults of every cluster in this process (CPU: NaN/Inf where TF's ops were finite; GPU: kernels whose
        non-finite flag is set): one cheap read per step; only a change is worth asking each cluster's
        `count(..., "faulted")`."""
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
    # -z defs: every symbol must resolve against TF's framework library now, not at load in a pod.
    def command(cc_file: Path, so_file: Path) -> list[str]:
        link = [*tf.sysconfig.get_link_flags(), "-ldl", "-Wl,-z,defs"]
        return [COMPILER, *_flags(gpu), str(cc_file), "-o", str(so_file), *link]

    try:
        return build_shared_object(SOURCE, "stitch_call.cc", command, BUILD_TIMEOUT_S)
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
    return [Path(__file__).resolve().parents[2] / PREBUILT_DIR]


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
            try:
                built = build_launcher(ArtifactCache(Path(tmp), suffix="so"))
            except RuntimeError as err:
                raise BridgeUnavailableError(f"building the launch library failed: {err}") from None
            shutil.copyfile(built, folder / launcher_name())
    return path


def launcher_name() -> str:
    """The file name of a prebuilt launch library: its source decides its bytes (it links against nothing
    of TF's and opens the CUDA driver itself)."""
    return f"launch-{hashlib.sha256(LAUNCH_SOURCE.encode()).hexdigest()[:32]}.so"


def prebuilt_launcher() -> Path | None:
    """The launch library shipped with the shim (`build_prebuilt` with the GPU kernel), if there is one."""
    found = [folder / launcher_name() for folder in prebuilt_dirs()]
    return next((path for path in found if path.is_file()), None)


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


def _present(cache_dir: Path) -> bool:
    """Whether this TF's op library is there without a build: shipped with the shim, or in the cache."""
    if _prebuilt() is not None:
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
    if _present(cache_dir):
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
    counters.stitchfleet_bridge_bind.restype = ctypes.c_int
    counters.stitchfleet_bridge_bind.argtypes = [ctypes.c_char_p] * 5
    counters.stitchfleet_bridge_unbind.restype = ctypes.c_int
    counters.stitchfleet_bridge_unbind.argtypes = [ctypes.c_char_p] * 2
    counters.stitchfleet_bridge_reset.restype = None
    counters.stitchfleet_bridge_reset.argtypes = [ctypes.c_char_p]
    counters.stitchfleet_bridge_signature_count.restype = ctypes.c_long
    counters.stitchfleet_bridge_signature_count.argtypes = [ctypes.c_char_p] * 2
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
