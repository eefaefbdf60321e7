"""The artifact cache of every target: compiled code on disk, keyed by what determines the bytes.

Input: a key (hash of source, target arch and tool versions: `cache_key`) and, on a
miss, a function that builds the bytes. Output: the cached bytes. `artifact_cache` is the
one place that says where each kind of artifact lives under the cache directory and its
file suffix (cubins, shared objects of the cpu and cuda-cpu targets, the launch library). Safe under
concurrent processes: a writer puts the bytes in a temporary file in the cache
directory and renames it into place (atomic on POSIX), so a reader sees either
no entry or a whole one; two processes building the same key just both write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path


def cache_key(source: str, arch: str, versions: Mapping[str, str], options: tuple[str, ...] = ()) -> str:
    """sha256 over the source, the arch, the tool versions and the compile options."""
    blob = json.dumps(
        {"source": source, "arch": arch, "versions": dict(versions), "options": list(options)}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class ArtifactCache:
    """A directory of `<key>.<suffix>` files."""

    def __init__(self, root: Path, suffix: str = "cubin") -> None:
        self.root = Path(root)
        self.suffix = suffix

    def path(self, key: str) -> Path:
        if not key.isalnum():
            raise ValueError(f"cache key must be alphanumeric, got {key!r}")
        return self.root / f"{key}.{self.suffix}"

    def get(self, key: str) -> bytes | None:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(key)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            Path(temp).replace(target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return target

    def get_or_build(self, key: str, build: Callable[[], bytes]) -> bytes:
        cached = self.get(key)
        if cached is not None:
            return cached
        data = build()
        self.put(key, data)
        return data


# kind -> (folder under the cache directory, file suffix); a new target adds its artifacts here
ARTIFACTS = {
    "cpu": ("cpu", "so"),
    "cpu-source": ("cpu-source", "json"),  # generated C by graph, plan and compiler code (cpu/source_cache.py)
    "cuda-cpu": ("cuda-cpu", "so"),
    "launch": ("launch", "so"),
    "cubin": ("cubin", "cubin"),
    "gpu_modules": ("gpu_modules", "cubin"),
    "tfop": ("tfop", "so"),
}


def artifact_cache(cache_dir: Path, kind: str) -> ArtifactCache:
    """The cache of one kind of artifact (`ARTIFACTS`) under `cache_dir`."""
    if kind not in ARTIFACTS:
        raise ValueError(f"unknown artifact kind {kind!r} (kinds: {', '.join(ARTIFACTS)})")
    folder, suffix = ARTIFACTS[kind]
    return ArtifactCache(Path(cache_dir) / folder, suffix=suffix)
