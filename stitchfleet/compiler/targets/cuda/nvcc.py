"""nvcc as a subprocess: compile rendered CUDA C to cubin (or PTX) for an arch, with a cache.

Input: CUDA C source and an arch (`sm_90`). Output: the cubin/PTX bytes, or `NvccError`
with nvcc's messages and the numbered source lines they point at. Used by CI to
compile-check every rendered kernel without a GPU (no pycuda needed) and to list the
archs this nvcc accepts (`--list-gpu-arch`; CUDA 13 starts at sm_75: Volta's sm_70 and
sm_72 were removed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.targets.cache import ArtifactCache, cache_key

# 550/177: a variable set or declared but never read; the lowering leaves a few (harmless).
OPTIONS = ("-std=c++17", "-O3", "-diag-suppress=550,177")
TIMEOUT_S = 300


class NvccError(RuntimeError):
    """nvcc is missing or rejected the source."""


@dataclass(frozen=True)
class Nvcc:
    """One nvcc executable and what it reports about itself."""

    path: str
    version: str
    archs: tuple[str, ...]  # sm_XX this nvcc can generate code for, oldest first

    @property
    def oldest_arch(self) -> str:
        return self.archs[0]

    def compile(self, source: str, arch: str, cache: ArtifactCache | None = None, target: str = "cubin") -> bytes:
        """The compiled bytes (cached by source, arch, nvcc version, options and target)."""
        if arch not in self.archs:
            raise NvccError(f"nvcc {self.version} cannot compile for {arch} (it accepts {', '.join(self.archs)})")
        if target not in ("cubin", "ptx"):
            raise NvccError(f"target must be cubin or ptx, got {target!r}")
        key = cache_key(source, arch, {"nvcc": self.version}, (*OPTIONS, target))
        if cache is None:
            return self._run(source, arch, target)
        return cache.get_or_build(key, lambda: self._run(source, arch, target))

    def ptxas_report(self, source: str, arch: str, cache: ArtifactCache | None = None) -> str:
        """ptxas's `-v` report of the source compiled to a cubin for `arch` (registers, spills, stack, shared
        memory per kernel: resources.py reads it), cached like the cubin."""
        if arch not in self.archs:
            raise NvccError(f"nvcc {self.version} cannot compile for {arch} (it accepts {', '.join(self.archs)})")
        key = cache_key(source, arch, {"nvcc": self.version}, (*OPTIONS, "ptxas-v"))
        if cache is None:
            return self._run(source, arch, "cubin", verbose=True).decode()
        return cache.get_or_build(key, lambda: self._run(source, arch, "cubin", verbose=True)).decode()

    def _run(self, source: str, arch: str, target: str, *, verbose: bool = False) -> bytes:
        """The compiled bytes, or with `verbose` ptxas's report (what nvcc wrote to stderr)."""
        with tempfile.TemporaryDirectory(prefix="stitchfleet-nvcc-") as tmp:
            src, out = Path(tmp) / "kernel.cu", Path(tmp) / f"kernel.{target}"
            src.write_text(source)
            report = ["-Xptxas", "-v"] if verbose else []
            cmd = [self.path, f"-{target}", f"-arch={arch}", *OPTIONS, *report, "-o", str(out), str(src)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise NvccError(f"nvcc -{target} -arch={arch} failed:\n{done.stderr}{_context(done.stderr, source)}")
            return done.stderr.encode() if verbose else out.read_bytes()


def _context(messages: str, source: str) -> str:
    """The source lines nvcc's messages point at, numbered."""
    lines = source.splitlines()
    wanted = sorted({int(n) for n in re.findall(r"kernel\.cu\((\d+)\)", messages)})
    shown = [f"{n:5d}: {lines[n - 1]}" for n in wanted[:10] if 0 < n <= len(lines)]
    return "\n" + "\n".join(shown) if shown else ""


def find_nvcc(path: str | None = None) -> Nvcc | None:
    """The nvcc at `path` (default: on PATH), or None when there is none."""
    exe = path or shutil.which("nvcc")
    if exe is None:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    match = re.search(r"release (\d+\.\d+)", version)
    listed = subprocess.run([exe, "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=True).stdout
    return Nvcc(exe, match.group(1) if match else "unknown", parse_arch_list(listed))


def parse_arch_list(text: str) -> tuple[str, ...]:
    """`compute_75 compute_80 ...` (nvcc --list-gpu-arch) -> ('sm_75', 'sm_80', ...), numerically sorted."""
    numbers = sorted({int(n) for n in re.findall(r"compute_(\d+)\b", text)})
    if not numbers:
        raise NvccError(f"no compute_XX archs in nvcc --list-gpu-arch output: {text[:200]!r}")
    return tuple(f"sm_{n}" for n in numbers)
