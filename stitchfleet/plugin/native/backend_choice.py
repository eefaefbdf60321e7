"""Which backend a job's clusters compile for, and whether the GPU op can run them in this process.

Input: a backend name (`STITCHFLEET_BACKEND` or the hook's), the cache folder and bridge setting. Output: the
resolved job backend, or `BackendUnavailableError` saying why not. Reads target profiles only (the targets
registry), no compiler pipeline: a job whose setup is skipped decides with it and stays light (kernels.py).
"""

from __future__ import annotations

from pathlib import Path

from stitchfleet.compiler import targets


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run clusters in this process; the message says why."""


def resolve_backend(name: str, cache_dir: Path | None = None, bridge: str = "auto") -> str:
    """The backend of the job's CPU-placed clusters: `auto` -> `cpu` (GPU-placed ones are routed per
    cluster by `placement.route`); a GPU backend only where the GPU op can run (else the reason why not)."""
    if name == "auto":
        return targets.automatic("cpu")
    usable = targets.names(in_jobs=True)
    if name not in usable:
        what = "runs in `stitchfleet compile --device` only" if name in targets.NAMES else "is unknown"
        raise BackendUnavailableError(f"backend {name!r} {what} (job backends: auto, {', '.join(usable)})")
    if targets.profile(name).runs_on == "gpu":
        if cache_dir is None:
            from stitchfleet import settings

            current = settings.current()
            cache_dir, bridge = current.cache_dir, current.bridge
        why = gpu_op_unavailable(cache_dir, bridge, name)
        if why is not None:
            raise BackendUnavailableError(
                f"the {name} bridge (the StitchfleetDispatch GPU kernel) cannot run here: {why}"
            )
    return name


_GPU_OP: dict[tuple[str, str, str], str | None] = {}


def gpu_op_unavailable(cache_dir: Path, bridge: str = "auto", backend: str | None = None) -> str | None:
    """Why GPU-placed clusters cannot go to the TF GPU op through `backend` in this process, or None when
    they can (asked once per process: a GPU visible to TF, a CUDA build of TF, what the target needs, the
    op library)."""
    backend = backend or targets.automatic("gpu")
    key = (str(cache_dir), bridge, backend)
    if key not in _GPU_OP:
        _GPU_OP[key] = _gpu_op_check(cache_dir, bridge, backend)
    return _GPU_OP[key]


def _gpu_op_check(cache_dir: Path, bridge: str, backend: str) -> str | None:
    from stitchfleet.plugin.native import dispatch_op, gpu_device

    if bridge == "python":
        return "STITCHFLEET_BRIDGE=python: a GPU cluster runs only through the native op"
    if not gpu_device.gpu_visible():
        return "no GPU visible to TensorFlow in this process"
    if not dispatch_op.cuda_build():
        return "this TensorFlow is not a CUDA build"
    try:
        why = targets.native(backend, Path(cache_dir), dispatch_op.prebuilt_dirs()).native_unavailable()
        if why is not None:
            return why
        dispatch_op.load(Path(cache_dir))
    except (RuntimeError, ValueError) as err:
        return str(err)
    return None
